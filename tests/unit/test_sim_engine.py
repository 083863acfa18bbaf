"""The simulated cluster's control loop on a manual clock: scheduler, kubelet and Job controllers.

No HTTP and no real time: each test builds an engine, writes objects as the API would, advances
the clock and reconciles, so durations and deadlines are exact.
"""

from __future__ import annotations

from typing import Any

import pytest

from clusters.sim import ManualClock, SimPoolConfig, cluster
from clusters.sim.engine import Engine
from clusters.sim.errors import ApiError
from clusters.sim.resources import BATCH_JOBS, EVENTS, NAMESPACES, NODES, POD_GROUPS, PODS, ResourceType

Obj = dict[str, Any]


def an_engine(*pools: SimPoolConfig) -> Engine:
    config = cluster("u", pools or (SimPoolConfig.of("a100", "A100", node_count=2),), default_duration_s=10)
    return Engine(config, ManualClock())


def create(engine: Engine, rt: ResourceType, body: Obj, namespace: str = "default") -> Obj:
    obj = engine.store.create(rt, engine.admission.admit_create(rt, body, namespace))
    engine.reconcile()
    return obj


def advance(engine: Engine, seconds: float) -> None:
    assert isinstance(engine.clock, ManualClock)
    engine.clock.advance(seconds)
    engine.reconcile()


def a_pod(
    name: str, gpus: int = 0, *, duration_s: float | None = None, group: str | None = None, **spec: Any
) -> Obj:
    annotations = {"sim.gpufed.io/duration": str(duration_s)} if duration_s is not None else {}
    if group:
        annotations["scheduling.k8s.io/group-name"] = group
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "i", "resources": resources}],
            **spec,
        },
    }


def pod(engine: Engine, name: str) -> Obj:
    return engine.store.require(PODS, "default", name)


def phases(engine: Engine) -> dict[str, str]:
    return {p["metadata"]["name"]: p["status"]["phase"] for p in engine.store.list(PODS)}


def test_pod_runs_for_its_duration_then_succeeds() -> None:
    engine = an_engine()
    create(engine, PODS, a_pod("p", 1, duration_s=5))
    assert phases(engine) == {"p": "Running"}
    advance(engine, 4.9)
    assert phases(engine) == {"p": "Running"}
    advance(engine, 0.2)
    assert phases(engine) == {"p": "Succeeded"}


def test_default_duration_comes_from_the_config() -> None:
    engine = an_engine()
    create(engine, PODS, a_pod("p", 1))
    advance(engine, 9.9)
    assert phases(engine) == {"p": "Running"}
    advance(engine, 0.2)
    assert phases(engine) == {"p": "Succeeded"}


def test_pod_deadline_shorter_than_duration_fails_it() -> None:
    engine = an_engine()
    create(engine, PODS, a_pod("p", duration_s=100, activeDeadlineSeconds=3))
    advance(engine, 3)
    assert (pod(engine, "p")["status"]["phase"], pod(engine, "p")["status"]["reason"]) == (
        "Failed",
        "DeadlineExceeded",
    )


def test_finished_pod_frees_its_gpus_for_a_waiting_one() -> None:
    engine = an_engine(SimPoolConfig.of("a100", "A100", node_count=1))
    create(engine, PODS, a_pod("first", 8, duration_s=5))
    create(engine, PODS, a_pod("second", 8, duration_s=5))
    assert phases(engine) == {"first": "Running", "second": "Pending"}
    advance(engine, 5)
    assert phases(engine) == {"first": "Succeeded", "second": "Running"}


@pytest.mark.parametrize(
    ("min_member", "members", "running"),
    [(3, 3, 0), (2, 3, 2), (2, 2, 2), (1, 3, 2)],
    ids=["whole-gang-too-big", "min-member-fits", "exact", "singles"],
)
def test_podgroup_binds_at_least_min_member_or_nothing(min_member: int, members: int, running: int) -> None:
    engine = an_engine()
    create(engine, POD_GROUPS, {"metadata": {"name": "g"}, "spec": {"minMember": min_member}})
    for i in range(members):
        engine.store.create(
            PODS, engine.admission.admit_create(PODS, a_pod(f"p{i}", 8, group="g"), "default")
        )
    engine.reconcile()
    assert sum(1 for p in phases(engine).values() if p == "Running") == running


def test_pods_without_their_podgroup_wait() -> None:
    engine = an_engine()
    create(engine, PODS, a_pod("p", 1, group="missing"))
    scheduled = next(c for c in pod(engine, "p")["status"]["conditions"] if c["type"] == "PodScheduled")
    assert 'podgroup "default/missing" not found' in scheduled["message"]
    create(engine, POD_GROUPS, {"metadata": {"name": "missing"}, "spec": {"minMember": 1}})
    assert phases(engine) == {"p": "Running"}


def test_failed_scheduling_is_reported_once_per_reason() -> None:
    engine = an_engine()
    create(engine, PODS, a_pod("p", 9))
    for i in range(3):
        create(engine, PODS, a_pod(f"small-{i}", 1, duration_s=1))
        advance(engine, 1)
    failed = [e for e in engine.store.list(EVENTS) if e["reason"] == "FailedScheduling"]
    assert len(failed) == 1
    assert failed[0]["message"] == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."


def test_taint_without_toleration_keeps_pods_off() -> None:
    engine = an_engine(SimPoolConfig.of("a100", "A100", node_count=1))
    node = engine.store.list(NODES)[0]
    tainted = {
        **node,
        "spec": {**node["spec"], "taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]},
    }
    engine.store.update(NODES, tainted)
    create(engine, PODS, a_pod("plain", 1))
    create(engine, PODS, a_pod("tolerant", 1, tolerations=[{"key": "dedicated", "operator": "Exists"}]))
    assert phases(engine) == {"plain": "Pending", "tolerant": "Running"}


def an_indexed_job(
    name: str, replicas: int, *, backoff: int = 0, annotations: dict[str, str] | None = None
) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": replicas,
            "parallelism": replicas,
            "backoffLimit": backoff,
            "template": {
                "metadata": {"annotations": annotations or {}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]},
            },
        },
    }


def test_job_replaces_failed_pods_until_the_backoff_limit() -> None:
    engine = an_engine()
    create(
        engine,
        BATCH_JOBS,
        an_indexed_job(
            "j", 1, backoff=2, annotations={"sim.gpufed.io/duration": "1", "sim.gpufed.io/exit-code": "1"}
        ),
    )
    for _ in range(3):
        advance(engine, 1)
    job = engine.store.require(BATCH_JOBS, "default", "j")
    assert job["status"]["failed"] == 3
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert len(engine.store.list(PODS)) == 3


def test_job_deadline_fails_it_and_stops_its_pods() -> None:
    engine = an_engine()
    body = an_indexed_job("j", 2, annotations={"sim.gpufed.io/duration": "100"})
    body["spec"]["activeDeadlineSeconds"] = 5
    create(engine, BATCH_JOBS, body)
    advance(engine, 5)
    job = engine.store.require(BATCH_JOBS, "default", "j")
    assert (
        next(c for c in job["status"]["conditions"] if c["type"] == "Failed")["reason"] == "DeadlineExceeded"
    )
    advance(engine, 1)
    assert engine.store.list(PODS) == []


def test_job_defaults_selector_and_labels() -> None:
    engine = an_engine()
    job = create(engine, BATCH_JOBS, an_indexed_job("j", 1))
    uid = job["metadata"]["uid"]
    assert job["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    (only,) = engine.store.list(PODS)
    assert only["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "j"
    assert only["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "0"
    assert {
        "name": "JOB_COMPLETION_INDEX",
        "valueFrom": {
            "fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/job-completion-index']"}
        },
    } in only["spec"]["containers"][0]["env"]


def test_restarts_back_off_doubling_and_keep_the_last_run() -> None:
    config = cluster("u", (SimPoolConfig.of("a100", "A100"),), default_duration_s=1, restart_backoff_s=10)
    engine = Engine(config, ManualClock())
    create(engine, PODS, a_pod("loop", restartPolicy="Always"))
    advance(engine, 1)
    (status,) = pod(engine, "loop")["status"]["containerStatuses"]
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert status["lastState"]["terminated"]["reason"] == "Completed"
    assert (pod(engine, "loop")["status"]["phase"], status["restartCount"]) == ("Running", 0)
    advance(engine, 9.9)
    assert "waiting" in pod(engine, "loop")["status"]["containerStatuses"][0]["state"]
    advance(engine, 0.1)
    (status,) = pod(engine, "loop")["status"]["containerStatuses"]
    assert ("running" in status["state"], status["restartCount"]) == (True, 1)
    advance(engine, 1)
    advance(engine, 19.9)
    assert pod(engine, "loop")["status"]["containerStatuses"][0]["restartCount"] == 1
    advance(engine, 0.1)
    assert pod(engine, "loop")["status"]["containerStatuses"][0]["restartCount"] == 2
    runs = engine.logs.runs(pod(engine, "loop")["metadata"]["uid"], "c")
    assert [r.index for r in runs] == [1, 2]


@pytest.mark.parametrize(("policy", "code", "phase"), [("OnFailure", 0, "Succeeded"), ("Never", 3, "Failed")])
def test_no_restart_when_the_policy_says_so(policy: str, code: int, phase: str) -> None:
    engine = an_engine()
    body = a_pod("p", duration_s=1)
    body["spec"]["restartPolicy"] = policy
    body["metadata"]["annotations"]["sim.gpufed.io/exit-code"] = str(code)
    create(engine, PODS, body)
    advance(engine, 1)
    assert phases(engine) == {"p": phase}


def test_a_log_stays_under_its_cap_however_long_the_run() -> None:
    config = cluster("u", (SimPoolConfig.of("a100", "A100"),), log_interval_s=1, log_cap_bytes=1000)
    engine = Engine(config, ManualClock())
    create(engine, PODS, a_pod("long", duration_s=10**7))
    advance(engine, 10**6)
    (run,) = engine.logs.runs(pod(engine, "long")["metadata"]["uid"], "c")
    lines = run.lines(engine.clock.wall_s(), engine.logs.cap_bytes)
    assert sum(len(text) + 1 for _, text in lines) <= 1000
    assert lines[-1][1] == "[sim] progress: step 1000000, 1e+06s elapsed"
    assert run.count(engine.clock.wall_s()) == 1_000_002


def test_pod_gc_keeps_at_most_the_threshold_of_ended_pods() -> None:
    config = cluster("u", (SimPoolConfig.of("a100", "A100"),), terminated_pod_gc_threshold=2)
    engine = Engine(config, ManualClock())
    for i in range(4):
        create(engine, PODS, a_pod(f"p{i}", duration_s=1 + i))
    advance(engine, 10)
    assert phases(engine) == {"p2": "Succeeded", "p3": "Succeeded"}


def test_kubelet_refuses_a_pinned_pod_beyond_the_node_cpu() -> None:
    engine = an_engine()
    body = a_pod("big", nodeName="u-a100-0")
    body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "200"}}
    create(engine, PODS, body)
    status = pod(engine, "big")["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "OutOfcpu")
    assert status["message"] == (
        "Pod was rejected: Node didn't have enough resource: cpu, requested: 200000m, used: 0m, capacity: 96000m"
    )


def test_suspending_a_running_job_deletes_its_pods_without_counting_failures() -> None:
    engine = an_engine()
    job = create(engine, BATCH_JOBS, an_indexed_job("j", 2, annotations={"sim.gpufed.io/duration": "100"}))
    assert sorted(phases(engine).values()) == ["Running", "Running"]
    suspended = {**job, "spec": {**job["spec"], "suspend": True}}
    engine.store.update(BATCH_JOBS, suspended)
    engine.reconcile()
    advance(engine, 1)
    assert engine.store.list(PODS) == []
    status = engine.store.require(BATCH_JOBS, "default", "j")["status"]
    assert (status["active"], status["failed"], "startTime" in status) == (0, 0, False)


def test_an_image_that_never_pulls_is_retried_with_a_doubling_back_off() -> None:
    config = cluster("u", (SimPoolConfig.of("a100", "A100"),), restart_backoff_s=10)
    engine = Engine(config, ManualClock())
    body = a_pod("img")
    body["metadata"]["annotations"]["sim.gpufed.io/fail-image-pull"] = "manifest unknown"

    def waiting() -> str:
        return str(pod(engine, "img")["status"]["containerStatuses"][0]["state"]["waiting"]["reason"])

    def pulls() -> int:
        return sum(1 for e in engine.store.list(EVENTS) if e["reason"] == "Pulling")

    create(engine, PODS, body)
    assert (waiting(), pulls()) == ("ErrImagePull", 1)
    assert (
        "manifest unknown"
        in pod(engine, "img")["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    )
    advance(engine, 1)
    assert waiting() == "ImagePullBackOff"
    advance(engine, 10)
    assert (waiting(), pulls()) == ("ErrImagePull", 2)
    advance(engine, 1)
    advance(engine, 19.9)
    assert (waiting(), pulls()) == ("ImagePullBackOff", 2)
    advance(engine, 0.1)
    assert (waiting(), pulls(), phases(engine)) == ("ErrImagePull", 3, {"img": "Pending"})


def test_a_deleted_namespace_empties_then_goes_when_its_slowest_pod_is_killed() -> None:
    engine = an_engine()
    create(engine, NAMESPACES, {"metadata": {"name": "t"}}, namespace="")
    create(engine, BATCH_JOBS, an_indexed_job("j", 2), namespace="t")
    stubborn = a_pod("stubborn", duration_s=600, terminationGracePeriodSeconds=30)
    stubborn["metadata"]["annotations"]["sim.gpufed.io/ignore-sigterm"] = "true"
    create(engine, PODS, stubborn, namespace="t")
    assert {p["status"]["phase"] for p in engine.store.list(PODS, "t")} == {"Running"}

    engine.lifecycle.delete(NAMESPACES, "", "t")
    engine.reconcile()
    ns = engine.store.require(NAMESPACES, "", "t")
    assert ns["status"]["phase"] == "Terminating"
    assert ns["spec"]["finalizers"] == ["kubernetes"]
    assert engine.store.list(BATCH_JOBS, "t") == []
    with pytest.raises(ApiError) as refused:
        engine.admission.admit_create(PODS, a_pod("late"), "t")
    assert refused.value.code == 403
    assert refused.value.details is not None
    assert refused.value.details["causes"][0]["reason"] == "NamespaceTerminating"

    advance(engine, 1)  # the Job's pods exit promptly on SIGTERM
    assert [p["metadata"]["name"] for p in engine.store.list(PODS, "t")] == ["stubborn"]
    assert engine.store.list(EVENTS, "t") == []  # late events are dropped, not stored
    advance(engine, 28)
    assert engine.store.get(NAMESPACES, "", "t") is not None
    advance(engine, 2)  # killed at the end of its grace period: the namespace goes with it
    assert engine.store.get(NAMESPACES, "", "t") is None


def test_deleting_a_terminating_namespace_again_is_a_conflict() -> None:
    engine = an_engine()
    create(engine, NAMESPACES, {"metadata": {"name": "t"}}, namespace="")
    create(engine, PODS, a_pod("p"), namespace="t")
    engine.lifecycle.delete(NAMESPACES, "", "t")
    with pytest.raises(ApiError) as again:
        engine.lifecycle.delete(NAMESPACES, "", "t")
    assert again.value.code == 409


def test_a_pod_bound_to_a_node_deleted_before_the_binding_is_collected() -> None:
    """Kubernetes' "Garbage collection": PodGC deletes pods bound to a node that no longer exists,
    whenever they were bound. The scheduler may bind a pod to a node deleted in the same moment
    (its node list is a cache); the collector must not have looked only at the nodes' pods when the
    node went, nor only at pods created already bound."""
    engine = an_engine(SimPoolConfig.of("a100", "A100", node_count=1))
    node = engine.pool_nodes("a100")[0]["metadata"]["name"]
    # Pending: its selector matches no node, so the scheduler leaves it be.
    waiting = create(engine, PODS, a_pod("late", gpus=1, duration_s=5, nodeSelector={"no": "such"}))
    assert waiting["status"]["phase"] == "Pending"
    engine.lifecycle.delete(NODES, "", node, grace_s=0)
    engine.reconcile()
    assert engine.store.get(NODES, "", node) is None
    # Bound now, as the scheduler's `_bind` does, to the node that is gone.
    bound = dict(pod(engine, "late"))
    bound["spec"] = {**bound["spec"], "nodeName": node}
    engine.store.update(PODS, bound)
    engine.reconcile()
    assert engine.store.get(PODS, "default", "late") is None
