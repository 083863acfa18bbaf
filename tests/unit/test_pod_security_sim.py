"""The simulator's Pod Security Admission: a namespace's enforce label refuses pods, as a cluster does.

Requests and controllers alike: a pod created directly is `403 Forbidden` with the PodSecurity
plugin's wording; a Job's controller cannot create its pods and says so in a `FailedCreate` event.
"""

from __future__ import annotations

from typing import Any

import pytest

from clusters.sim import ManualClock, SimPoolConfig, cluster
from clusters.sim.engine import Engine
from clusters.sim.errors import ApiError
from clusters.sim.pod_security import enforce
from clusters.sim.resources import BATCH_JOBS, EVENTS, NAMESPACES, PODS

Obj = dict[str, Any]


def namespace(level: str | None, mode: str = "enforce") -> Obj:
    labels = {} if level is None else {f"pod-security.kubernetes.io/{mode}": level}
    return {"metadata": {"name": "team", "labels": labels}}


def a_pod(**spec: Any) -> Obj:
    containers = spec.pop("containers", [{"name": "main", "image": "busybox"}])
    return {"metadata": {"name": "p"}, "spec": {"containers": containers, **spec}}


HARDENED = {
    "name": "main",
    "image": "busybox",
    "securityContext": {
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    },
}

REFUSED = [
    (
        "privileged",
        "baseline",
        a_pod(containers=[{"name": "main", "securityContext": {"privileged": True}}]),
        'privileged (container "main" must not set securityContext.privileged=true)',
    ),
    (
        "hostPath",
        "baseline",
        a_pod(volumes=[{"name": "host", "hostPath": {"path": "/"}}]),
        'hostPath volumes (volume "host")',
    ),
    ("hostNetwork", "baseline", a_pod(hostNetwork=True), "host namespaces (hostNetwork=true)"),
    (
        "capability",
        "baseline",
        a_pod(containers=[{"name": "m", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]),
        'non-default capabilities (capabilities "SYS_ADMIN" must not be added)',
    ),
    (
        "hostPort",
        "baseline",
        a_pod(containers=[{"name": "m", "ports": [{"containerPort": 80, "hostPort": 8080}]}]),
        "hostPort (hostPort 8080)",
    ),
    ("restricted short pod", "restricted", a_pod(), 'allowPrivilegeEscalation != false (containers "main"'),
    (
        "restricted nfs",
        "restricted",
        a_pod(containers=[HARDENED], volumes=[{"name": "n", "nfs": {"server": "s", "path": "/"}}]),
        'restricted volume types (volumes "n")',
    ),
]


@pytest.mark.parametrize(("level", "pod", "words"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_enforce_label_refuses_with_the_plugins_words(level: str, pod: Obj, words: str) -> None:
    with pytest.raises(ApiError) as refused:
        enforce(namespace(level), pod)
    assert refused.value.code == 403
    assert refused.value.message.startswith(f'pods "p" is forbidden: violates PodSecurity "{level}:latest": ')
    assert words in refused.value.message


@pytest.mark.parametrize(
    "ns",
    [namespace(None), namespace("privileged"), namespace("baseline", mode="warn"), None],
    ids=["no label", "privileged", "warn only", "no namespace"],
)
def test_without_an_enforced_level_anything_goes(ns: Obj | None) -> None:
    enforce(ns, a_pod(hostNetwork=True, volumes=[{"name": "h", "hostPath": {"path": "/"}}]))


def test_levels_allow_what_they_allow() -> None:
    enforce(namespace("baseline"), a_pod(containers=[{"name": "m", "securityContext": {"runAsUser": 0}}]))
    enforce(
        namespace("restricted"),
        a_pod(containers=[HARDENED], volumes=[{"name": "d", "emptyDir": {"medium": "Memory"}}]),
    )


def an_engine() -> Engine:
    config = cluster("u", (SimPoolConfig.of("a100", "A100", node_count=1),), default_duration_s=10)
    engine = Engine(config, ManualClock())
    engine.store.create(NAMESPACES, engine.admission.admit_create(NAMESPACES, namespace("baseline"), None))
    return engine


def test_a_pod_created_by_request_is_refused_in_a_labelled_namespace() -> None:
    engine = an_engine()
    with pytest.raises(ApiError) as refused:
        engine.admission.admit_create(PODS, a_pod(hostPID=True), "team")
    assert refused.value.code == 403
    engine.admission.admit_create(PODS, a_pod(), "team")


def test_a_jobs_controller_reports_pods_it_may_not_create() -> None:
    engine = an_engine()
    job = {
        "metadata": {"name": "j"},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "busybox", "securityContext": {"privileged": True}}
                    ],
                }
            }
        },
    }
    engine.store.create(BATCH_JOBS, engine.admission.admit_create(BATCH_JOBS, job, "team"))
    engine.reconcile()
    assert engine.store.list(PODS) == []
    events = [e for e in engine.store.list(EVENTS) if e["reason"] == "FailedCreate"]
    assert events
    assert events[0]["type"] == "Warning"
    assert 'violates PodSecurity "baseline:latest": privileged' in events[0]["message"]
