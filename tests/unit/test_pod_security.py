"""Per-tenant pod security: the Pod Security Standards levels, checked at submission against the tenant.

`federation.spec.pod_security` holds the controls (kubernetes.io's Pod Security Standards page);
`federation.api.submit_checks` applies the tenant's level to each task's pod and stores it with the
job; an admin sets it in the tenant's document (`podSecurity:`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import yaml

from federation.api.submit_checks import check_submission
from federation.errors import InvalidSpec
from federation.spec.jobspec import PodSecurityLevel
from federation.spec.pod_security import Violation, check_pod
from federation.spec.priorities import DEFAULT_PRIORITY_CLASSES
from federation.spec.training_job import parse_manifest
from federation.store.config_policy import parse_tenant, tenant_document
from federation.store.jobs import spec_from_dict, spec_to_dict
from federation.store.records import SchedulingSettings, TenantRecord, tenant_from_dict, tenant_to_dict
from placement.model import TenantId

B, R, P = PodSecurityLevel.BASELINE, PodSecurityLevel.RESTRICTED, PodSecurityLevel.PRIVILEGED

RESTRICTED_OK: dict[str, Any] = {
    "spec": {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "main",
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }
        ],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
    }
}


def pod(**spec: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "main"}], **spec}}


def container(**fields: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "main", **fields}]}}


CASES = [
    ("hostNetwork", pod(hostNetwork=True), "spec.hostNetwork", "host's namespaces"),
    ("hostPID", pod(hostPID=True), "spec.hostPID", "host's namespaces"),
    ("hostIPC", pod(hostIPC=True), "spec.hostIPC", "host's namespaces"),
    (
        "hostPath",
        pod(volumes=[{"name": "h", "hostPath": {"path": "/"}}]),
        "spec.volumes[0].hostPath",
        "hostPath",
    ),
    (
        "privileged",
        container(securityContext={"privileged": True}),
        "spec.containers[0].securityContext.privileged",
        "privileged containers",
    ),
    (
        "SYS_ADMIN",
        container(securityContext={"capabilities": {"add": ["CHOWN", "SYS_ADMIN"]}}),
        "spec.containers[0].securityContext.capabilities.add[1]",
        "adding SYS_ADMIN",
    ),
    (
        "hostPort",
        container(ports=[{"containerPort": 80, "hostPort": 80}]),
        "spec.containers[0].ports[0].hostPort",
        "host ports",
    ),
    (
        "procMount",
        container(securityContext={"procMount": "Unmasked"}),
        "spec.containers[0].securityContext.procMount",
        "procMount",
    ),
    (
        "seccomp unconfined",
        pod(securityContext={"seccompProfile": {"type": "Unconfined"}}),
        "spec.securityContext.seccompProfile.type",
        "Unconfined seccomp",
    ),
    (
        "sysctl",
        pod(securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}),
        "spec.securityContext.sysctls[0].name",
        "unsafe sysctl",
    ),
    (
        "selinux user",
        pod(securityContext={"seLinuxOptions": {"user": "system_u"}}),
        "spec.securityContext.seLinuxOptions.user",
        "SELinux",
    ),
    (
        "init container",
        {
            "spec": {
                "containers": [{"name": "a"}],
                "initContainers": [{"name": "i", "securityContext": {"privileged": True}}],
            }
        },
        "spec.initContainers[0].securityContext.privileged",
        "privileged",
    ),
]


@pytest.mark.parametrize(("template", "field", "phrase"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_baseline_refuses_and_privileged_allows(template: dict[str, Any], field: str, phrase: str) -> None:
    for level in (B, R):
        with pytest.raises(Violation) as caught:
            check_pod(template, level)
        assert caught.value.field == field
        assert phrase in caught.value.rule
    check_pod(template, P)


def test_baseline_allows_an_ordinary_training_pod() -> None:
    check_pod(
        container(
            securityContext={"runAsUser": 0, "capabilities": {"add": ["NET_BIND_SERVICE", "SYS_CHROOT"]}},
            ports=[{"containerPort": 29500}],
        ),
        B,
    )
    check_pod(pod(volumes=[{"name": "n", "nfs": {"server": "s", "path": "/"}}]), B)


RESTRICTED_CASES = [
    (
        "nfs volume",
        ("spec", "volumes", 0),
        {"name": "n", "nfs": {"server": "s", "path": "/"}},
        "spec.volumes[0].nfs",
    ),
    (
        "escalation",
        ("spec", "containers", 0, "securityContext", "allowPrivilegeEscalation"),
        True,
        "spec.containers[0].securityContext.allowPrivilegeEscalation",
    ),
    ("root allowed", ("spec", "securityContext", "runAsNonRoot"), False, "spec.securityContext.runAsNonRoot"),
    (
        "root user",
        ("spec", "containers", 0, "securityContext", "runAsUser"),
        0,
        "spec.containers[0].securityContext.runAsUser",
    ),
    (
        "no seccomp",
        ("spec", "securityContext", "seccompProfile"),
        {},
        "spec.containers[0].securityContext.seccompProfile.type",
    ),
    (
        "no drop",
        ("spec", "containers", 0, "securityContext", "capabilities"),
        {},
        "spec.containers[0].securityContext.capabilities.drop",
    ),
    (
        "add chown",
        ("spec", "containers", 0, "securityContext", "capabilities", "add"),
        ["CHOWN"],
        "spec.containers[0].securityContext.capabilities.add[0]",
    ),
]


@pytest.mark.parametrize(
    ("where", "value", "field"), [c[1:] for c in RESTRICTED_CASES], ids=[c[0] for c in RESTRICTED_CASES]
)
def test_restricted_requires_a_hardened_pod(where: tuple[Any, ...], value: Any, field: str) -> None:
    check_pod(RESTRICTED_OK, R)
    template = json.loads(json.dumps(RESTRICTED_OK))
    node: Any = template
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    with pytest.raises(Violation) as caught:
        check_pod(template, R)
    assert caught.value.field == field
    check_pod(template, B)


# ---- at submission, against the tenant


def a_spec(template: dict[str, Any] | None = None) -> Any:
    task: dict[str, Any] = {"name": "main", "replicas": 1, "gpus": 1}
    if template is None:
        task["image"] = "busybox"
    else:
        template = json.loads(json.dumps(template))
        template["spec"]["containers"][0]["image"] = "busybox"
        task["template"] = template
    doc = {
        "apiVersion": "gpufed.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "j"},
        "spec": {"gpuTypes": ["A100"], "tasks": [task]},
    }
    return parse_manifest(yaml.safe_dump(doc), priority_classes=DEFAULT_PRIORITY_CLASSES.keys())


def a_tenant(level: PodSecurityLevel = B) -> TenantRecord:
    return TenantRecord(name=TenantId("vision"), pod_security=level)


def test_submission_refuses_what_the_tenants_level_forbids_naming_the_field() -> None:
    spec = a_spec(container(securityContext={"privileged": True}))
    with pytest.raises(InvalidSpec) as caught:
        check_submission(spec, a_tenant(), SchedulingSettings())
    assert caught.value.field == "spec.tasks[0].template.spec.containers[0].securityContext.privileged"
    assert "'baseline'" in caught.value.rule
    assert "podSecurity" in caught.value.rule
    stored = check_submission(spec, a_tenant(P), SchedulingSettings())
    assert stored.pod_security is P


def test_submission_stores_the_tenants_level_with_the_job() -> None:
    assert check_submission(a_spec(), a_tenant(), SchedulingSettings()).pod_security is B
    assert check_submission(a_spec(RESTRICTED_OK), a_tenant(R), SchedulingSettings()).pod_security is R


def test_a_restricted_tenant_needs_a_template_that_says_how_its_pods_run() -> None:
    """The short form has no security context, which the restricted level refuses on the cluster."""
    with pytest.raises(InvalidSpec) as caught:
        check_submission(a_spec(), a_tenant(R), SchedulingSettings())
    assert caught.value.field.startswith("spec.tasks[0].template.spec.containers[0].securityContext.")


def test_shm_size_is_allowed_under_restricted() -> None:
    spec = a_spec(RESTRICTED_OK)
    spec = replace(spec, tasks=(replace(spec.tasks[0], shm_size="8Gi"),))
    check_submission(spec, a_tenant(R), SchedulingSettings())


# ---- the tenant's level: the admin's document, the stored record, the stored job


def test_the_tenant_document_sets_the_level_and_names_a_bad_one() -> None:
    record = parse_tenant({"name": "vision", "podSecurity": "restricted"}, "tenants[0]", priority_classes=())
    assert record.pod_security is R
    assert parse_tenant(tenant_document(record), "t", priority_classes=()) == record
    assert parse_tenant({"name": "vision"}, "t", priority_classes=()).pod_security is B
    assert "podSecurity" not in tenant_document(a_tenant())
    with pytest.raises(InvalidSpec) as caught:
        parse_tenant({"name": "vision", "podSecurity": "Baseline"}, "tenants[0]", priority_classes=())
    assert caught.value.field == "tenants[0].podSecurity"
    assert "privileged, baseline, restricted" in caught.value.rule


def test_stored_records_keep_the_level_and_old_ones_read_as_baseline() -> None:
    assert tenant_from_dict(tenant_to_dict(a_tenant(P))).pod_security is P
    old = tenant_to_dict(a_tenant())
    del old["pod_security"]
    assert tenant_from_dict(old).pod_security is B
    spec = replace(a_spec(RESTRICTED_OK), pod_security=R)
    assert spec_from_dict(json.loads(json.dumps(spec_to_dict(spec)))) == spec
    baseline = a_spec()
    assert "pod_security" not in spec_to_dict(baseline)
    assert "template" not in spec_to_dict(baseline)["tasks"][0]
    assert spec_from_dict(spec_to_dict(baseline)) == baseline
