"""Pod Security Admission: a namespace's `pod-security.kubernetes.io/enforce` label refuses pods.

A real API server (1.25 and later) runs the PodSecurity admission plugin on every pod create, from
a request or from a controller: a namespace labelled `enforce: baseline` or `restricted` refuses a
pod that breaks that level of the Pod Security Standards with `403 Forbidden`,
`pods "x" is forbidden: violates PodSecurity "baseline:latest": privileged (container "main" must
not set securityContext.privileged=true), hostPath volumes (volume "host")`. gpufed labels its
tenants' namespaces so; the simulator enforces the labels as a cluster would, written from the
Pod Security Standards page, not from gpufed's own check (`federation.spec.pod_security`).

`warn` and `audit` labels are accepted and not acted on (a real server adds a warning header and an
audit annotation).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from clusters.sim import errors

Obj = dict[str, Any]
ENFORCE = "pod-security.kubernetes.io/enforce"
_CAPS = frozenset(
    [
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
    ]
)
_SYSCTLS = frozenset(
    [
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
    ]
)
_VOLUMES = frozenset(
    [
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    ]
)


def _containers(spec: Obj) -> Iterator[Obj]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _names(items: list[str]) -> str:
    return ", ".join(f'"{n}"' for n in items)


def _baseline(spec: Obj) -> list[str]:
    out: list[str] = []
    pod_sc = spec.get("securityContext") or {}
    hosts = [f"{f}=true" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    if hosts:
        out.append(f"host namespaces ({', '.join(hosts)})")
    privileged = [
        c.get("name", "") for c in _containers(spec) if (c.get("securityContext") or {}).get("privileged")
    ]
    if privileged:
        out.append(
            f"privileged (container{'s' if len(privileged) > 1 else ''} {_names(privileged)} must not set "
            "securityContext.privileged=true)"
        )
    added = sorted(
        {
            cap
            for c in _containers(spec)
            for cap in ((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
            if cap not in _CAPS
        }
    )
    if added:
        out.append(f"non-default capabilities (capabilities {_names(added)} must not be added)")
    host_paths = [v.get("name", "") for v in spec.get("volumes") or [] if "hostPath" in v]
    if host_paths:
        out.append(f"hostPath volumes (volume{'s' if len(host_paths) > 1 else ''} {_names(host_paths)})")
    ports = [str(p["hostPort"]) for c in _containers(spec) for p in c.get("ports") or [] if p.get("hostPort")]
    if ports:
        out.append(f"hostPort (hostPort{'s' if len(ports) > 1 else ''} {', '.join(ports)})")
    contexts = [pod_sc, *((c.get("securityContext") or {}) for c in _containers(spec))]
    if any((sc.get("seccompProfile") or {}).get("type") == "Unconfined" for sc in contexts):
        out.append('seccompProfile (securityContext.seccompProfile.type must not be set to "Unconfined")')
    if any((sc.get("appArmorProfile") or {}).get("type") == "Unconfined" for sc in contexts):
        out.append('appArmorProfile (securityContext.appArmorProfile.type must not be set to "Unconfined")')
    if any(
        (c.get("securityContext") or {}).get("procMount", "Default") != "Default" for c in _containers(spec)
    ):
        out.append("procMount (securityContext.procMount must be Default)")
    unsafe = [s.get("name", "") for s in pod_sc.get("sysctls") or [] if s.get("name") not in _SYSCTLS]
    if unsafe:
        out.append(f"forbidden sysctls ({', '.join(unsafe)})")
    return out


def _restricted(spec: Obj) -> list[str]:
    out: list[str] = []
    pod_sc = spec.get("securityContext") or {}
    volumes = [
        v.get("name", "")
        for v in spec.get("volumes") or []
        if any(k != "name" and k not in _VOLUMES for k in v)
    ]
    if volumes:
        out.append(f"restricted volume types (volumes {_names(volumes)})")
    escalating = [
        c.get("name", "")
        for c in _containers(spec)
        if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False
    ]
    if escalating:
        out.append(
            f"allowPrivilegeEscalation != false (containers {_names(escalating)} must set "
            "securityContext.allowPrivilegeEscalation=false)"
        )
    drops = [
        c.get("name", "")
        for c in _containers(spec)
        if "ALL" not in (((c.get("securityContext") or {}).get("capabilities") or {}).get("drop") or [])
    ]
    if drops:
        out.append(
            f"unrestricted capabilities (containers {_names(drops)} must set "
            'securityContext.capabilities.drop=["ALL"])'
        )
    roots = [
        c.get("name", "")
        for c in _containers(spec)
        if (c.get("securityContext") or {}).get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True
    ]
    if roots:
        out.append(
            f"runAsNonRoot != true (containers {_names(roots)} must set securityContext.runAsNonRoot=true)"
        )
    seccomp = [
        c.get("name", "")
        for c in _containers(spec)
        if ((c.get("securityContext") or {}).get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get(
            "type"
        )
        not in ("RuntimeDefault", "Localhost")
    ]
    if seccomp:
        out.append(
            f"seccompProfile (containers {_names(seccomp)} must set securityContext.seccompProfile.type to "
            '"RuntimeDefault" or "Localhost")'
        )
    return out


def enforce(namespace: Obj | None, pod: Obj) -> None:
    """403 when the namespace's enforce label forbids the pod; nothing for privileged or no label."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    level = labels.get(ENFORCE)
    if level not in ("baseline", "restricted"):
        return
    spec = pod.get("spec") or {}
    broken = _baseline(spec) + (_restricted(spec) if level == "restricted" else [])
    if broken:
        name = (pod.get("metadata") or {}).get("name", "")
        raise errors.ApiError(
            403,
            "Forbidden",
            f'pods "{name}" is forbidden: violates PodSecurity "{level}:latest": {", ".join(broken)}',
            {"name": name, "kind": "pods"},
        )
