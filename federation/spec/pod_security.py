"""Kubernetes' Pod Security Standards, applied to a job's pod templates at submission.

A tenant has a level (`privileged`, `baseline` by default, or `restricted`), as Pod Security
Admission has for a namespace. gpufed checks each task's pod against it when the job is submitted,
so a job the member cluster would refuse is never queued, and labels the tenant's namespace on
each member cluster with `pod-security.kubernetes.io/enforce: <level>`, so the cluster refuses it
too. The controls and allowed values are those of the Pod Security Standards page
(kubernetes.io/docs/concepts/security/pod-security-standards), checked in its order; the first
control a pod breaks is reported with the field's path.

Pure: a template dict in, the first violation out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from federation.spec.jobspec import PodSecurityLevel

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"

BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
_SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
_APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


class Violation(Exception):
    """A pod breaks its level: `field` is the path below the template, `rule` what the level says."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


def _containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for i, c in enumerate(spec.get(key) or []):
            yield f"spec.{key}[{i}]", c


def _baseline(template: dict[str, Any], level: str) -> None:
    spec = template.get("spec") or {}
    pod_sc = spec.get("securityContext") or {}
    forbids = f"the {level} pod security level forbids"
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        raise Violation("spec.securityContext.windowsOptions.hostProcess", f"{forbids} HostProcess pods")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            raise Violation(f"spec.{field}", f"{forbids} sharing the host's namespaces")
    for at, c in _containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            raise Violation(f"{at}.securityContext.privileged", f"{forbids} privileged containers")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            raise Violation(f"{at}.securityContext.windowsOptions.hostProcess", f"{forbids} HostProcess pods")
        for j, cap in enumerate((sc.get("capabilities") or {}).get("add") or []):
            if cap not in BASELINE_CAPABILITIES:
                raise Violation(
                    f"{at}.securityContext.capabilities.add[{j}]",
                    f"{forbids} adding {cap}; it allows only {', '.join(sorted(BASELINE_CAPABILITIES))}",
                )
        for j, port in enumerate(c.get("ports") or []):
            if port.get("hostPort"):
                raise Violation(f"{at}.ports[{j}].hostPort", f"{forbids} host ports")
        if sc.get("procMount", "Default") != "Default":
            raise Violation(f"{at}.securityContext.procMount", f"{forbids} a procMount other than Default")
    for i, volume in enumerate(spec.get("volumes") or []):
        if "hostPath" in volume:
            raise Violation(f"spec.volumes[{i}].hostPath", f"{forbids} hostPath volumes")
    contexts = [("spec.securityContext", pod_sc)] + [
        (f"{at}.securityContext", c.get("securityContext") or {}) for at, c in _containers(spec)
    ]
    for at, sc in contexts:
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            raise Violation(f"{at}.appArmorProfile.type", f"{forbids} the Unconfined AppArmor profile")
        selinux = sc.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in _SELINUX_TYPES:
            raise Violation(f"{at}.seLinuxOptions.type", f"{forbids} SELinux type {selinux['type']}")
        for field in ("user", "role"):
            if selinux.get(field):
                raise Violation(f"{at}.seLinuxOptions.{field}", f"{forbids} setting a SELinux {field}")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            raise Violation(f"{at}.seccompProfile.type", f"{forbids} the Unconfined seccomp profile")
    for key, value in ((template.get("metadata") or {}).get("annotations") or {}).items():
        if (
            key.startswith(_APPARMOR_ANNOTATION)
            and value != "runtime/default"
            and not value.startswith("localhost/")
        ):
            raise Violation(f'metadata.annotations["{key}"]', f"{forbids} AppArmor profile {value}")
    for i, sysctl in enumerate(pod_sc.get("sysctls") or []):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            raise Violation(
                f"spec.securityContext.sysctls[{i}].name", f"{forbids} the unsafe sysctl {sysctl.get('name')}"
            )


def _restricted(template: dict[str, Any]) -> None:
    spec = template.get("spec") or {}
    pod_sc = spec.get("securityContext") or {}
    needs = "the restricted pod security level requires"
    for i, volume in enumerate(spec.get("volumes") or []):
        for kind in volume:
            if kind != "name" and kind not in RESTRICTED_VOLUMES:
                raise Violation(
                    f"spec.volumes[{i}].{kind}",
                    f"{needs} volumes of the types {', '.join(sorted(RESTRICTED_VOLUMES))}",
                )
    pod_non_root = pod_sc.get("runAsNonRoot")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_non_root is False:
        raise Violation("spec.securityContext.runAsNonRoot", f"{needs} runAsNonRoot: true")
    if pod_sc.get("runAsUser") == 0:
        raise Violation("spec.securityContext.runAsUser", f"{needs} a user other than root (0)")
    for at, c in _containers(spec):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            raise Violation(f"{at}.securityContext.allowPrivilegeEscalation", f"{needs} it to be false")
        non_root = sc.get("runAsNonRoot", pod_non_root)
        if non_root is not True:
            raise Violation(
                f"{at}.securityContext.runAsNonRoot",
                f"{needs} runAsNonRoot: true (here or in spec.securityContext)",
            )
        if sc.get("runAsUser") == 0:
            raise Violation(f"{at}.securityContext.runAsUser", f"{needs} a user other than root (0)")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            raise Violation(
                f"{at}.securityContext.seccompProfile.type",
                f"{needs} RuntimeDefault or Localhost (here or in spec.securityContext)",
            )
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            raise Violation(f"{at}.securityContext.capabilities.drop", f"{needs} dropping ALL capabilities")
        for j, cap in enumerate(caps.get("add") or []):
            if cap != "NET_BIND_SERVICE":
                raise Violation(
                    f"{at}.securityContext.capabilities.add[{j}]", f"{needs} adding only NET_BIND_SERVICE"
                )


def check_pod(template: dict[str, Any], level: PodSecurityLevel) -> None:
    """Violation for the first control of `level` that the pod template breaks."""
    if level is PodSecurityLevel.PRIVILEGED:
        return
    _baseline(template, level.value)
    if level is PodSecurityLevel.RESTRICTED:
        _restricted(template)
