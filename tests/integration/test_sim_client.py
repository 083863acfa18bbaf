"""The simulated cluster through the official kubernetes client, over HTTP: list, watch, write, jobs.

Each test starts its own cluster on a free loopback port (about 10 ms) on a background thread, and
drives it with the synchronous client exactly as a backend would.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from clusters.sim import SimPoolConfig, ThreadedSim, cluster
from tests.e2e import harness
from tests.e2e.harness import Poll

GPU = "nvidia.com/gpu"


@pytest.fixture
def sim() -> Iterator[ThreadedSim]:
    config = cluster(
        "sim1",
        [SimPoolConfig.of("a100", "A100", node_count=2), SimPoolConfig.of("l4", "L4", gpus_per_node=4)],
        default_duration_s=0.3,
        history_limit=200,
    )
    with ThreadedSim(config) as running:
        yield running


@pytest.fixture
def api(sim: ThreadedSim) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = sim.url
    # A refused or dropped connection should fail the call at once, not after three retries.
    configuration.retries = False
    return client.ApiClient(configuration)


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def batch(api: client.ApiClient) -> client.BatchV1Api:
    return client.BatchV1Api(api)


_T = TypeVar("_T")


def wait_for(check: Poll[_T], timeout_s: float = 10.0) -> _T:
    """tests/e2e/harness.wait_for, polled every 20 ms: the simulator answers in milliseconds."""
    return harness.wait_for(check, timeout_s, interval_s=0.02)


def a_pod(
    name: str, *, gpus: int = 0, duration_s: float = 0.3, exit_code: int = 0, **spec: Any
) -> dict[str, Any]:
    resources = {"limits": {GPU: str(gpus)}} if gpus else {}
    return {
        "metadata": {
            "name": name,
            "annotations": {
                "sim.gpufed.io/duration": str(duration_s),
                "sim.gpufed.io/exit-code": str(exit_code),
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "train:1", "resources": resources}],
            **spec,
        },
    }


def an_indexed_job(
    name: str, replicas: int, *, gpus: int = 8, duration_s: float = 0.3, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpufed"}},
        "spec": {
            "completionMode": "Indexed",
            "completions": replicas,
            "parallelism": replicas,
            "backoffLimit": 0,
            "podFailurePolicy": {
                "rules": [
                    {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
                ]
            },
            "template": {
                "metadata": {"annotations": {"sim.gpufed.io/duration": str(duration_s)}},
                "spec": {
                    "restartPolicy": "Never",
                    "subdomain": name,
                    "containers": [
                        {"name": "main", "image": "train:1", "resources": {"limits": {GPU: str(gpus)}}}
                    ],
                },
            },
            **spec,
        },
    }


def job_condition(batch: client.BatchV1Api, name: str) -> tuple[str, str] | None:
    job = batch.read_namespaced_job(name, "default")
    for c in job.status.conditions or []:
        if c.type in ("Complete", "Failed") and c.status == "True":
            return c.type, c.reason
    return None


def test_discovery_lists_groups_and_short_names(api: client.ApiClient) -> None:
    groups = {g.name for g in client.ApisApi(api).get_api_versions().groups}
    assert {"batch", "batch.volcano.sh", "scheduling.volcano.sh"} <= groups
    core_resources = {r.name: r for r in client.CoreV1Api(api).get_api_resources().resources}
    assert core_resources["pods"].short_names == ["po"]
    assert "pods/eviction" in core_resources
    assert client.VersionApi(api).get_code().major == "1"


def test_nodes_carry_gpu_labels_and_allocatable(core: client.CoreV1Api) -> None:
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(nodes) == {"sim1-a100-0", "sim1-a100-1", "sim1-l4-0"}
    a100 = nodes["sim1-a100-0"]
    assert a100.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert a100.metadata.labels["gpufed.io/pool"] == "a100"
    assert a100.status.allocatable[GPU] == "8"
    assert any(c.type == "Ready" and c.status == "True" for c in a100.status.conditions)
    l4 = core.list_node(label_selector="nvidia.com/gpu.product=NVIDIA-L4").items
    assert [n.metadata.name for n in l4] == ["sim1-l4-0"]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("team=a", ["p1", "p2"]),
        ("team!=a", ["p3", "p4"]),
        ("team in (a,b)", ["p1", "p2", "p3"]),
        ("team notin (a)", ["p3", "p4"]),
        ("team", ["p1", "p2", "p3"]),
        ("!team", ["p4"]),
        ("team=a,tier=gpu", ["p2"]),
    ],
    ids=["equals", "not-equals", "in", "notin", "exists", "not-exists", "and"],
)
def test_label_selectors(core: client.CoreV1Api, selector: str, expected: list[str]) -> None:
    labels = {"p1": {"team": "a"}, "p2": {"team": "a", "tier": "gpu"}, "p3": {"team": "b"}, "p4": {}}
    for name, pod_labels in labels.items():
        body = a_pod(name, duration_s=60)
        body["metadata"]["labels"] = pod_labels
        core.create_namespaced_pod("default", body)
    assert [
        p.metadata.name for p in core.list_namespaced_pod("default", label_selector=selector).items
    ] == expected


def test_field_selectors_and_cluster_wide_list(core: client.CoreV1Api) -> None:
    core.create_namespace({"metadata": {"name": "team-b"}})
    core.create_namespaced_pod("default", a_pod("a", gpus=8, duration_s=60))
    core.create_namespaced_pod("team-b", a_pod("b", gpus=4, duration_s=60))
    wait_for(lambda: len(core.list_pod_for_all_namespaces(field_selector="status.phase=Running").items) == 2)
    everywhere = core.list_pod_for_all_namespaces()
    assert {(p.metadata.namespace, p.metadata.name) for p in everywhere.items} == {
        ("default", "a"),
        ("team-b", "b"),
    }
    assert int(everywhere.metadata.resource_version) > 0
    on_l4 = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=sim1-l4-0").items
    assert [p.metadata.name for p in on_l4] == ["b"]
    named = core.list_pod_for_all_namespaces(
        field_selector="metadata.name=a,metadata.namespace=default"
    ).items
    assert [p.metadata.name for p in named] == ["a"]


def test_create_twice_is_409_already_exists(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", a_pod("twice", duration_s=60))
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod("default", a_pod("twice", duration_s=60))
    assert info.value.status == 409
    assert '"reason":"AlreadyExists"' in info.value.body.replace(" ", "")


@pytest.mark.parametrize(
    ("call", "status", "reason"),
    [
        (lambda core: core.read_namespaced_pod("nope", "default"), 404, "NotFound"),
        (lambda core: core.create_namespaced_pod("missing-ns", a_pod("x")), 404, "NotFound"),
        (lambda core: core.create_namespaced_pod("default", a_pod("Bad_Name")), 422, "Invalid"),
    ],
    ids=["missing-pod", "missing-namespace", "invalid-name"],
)
def test_errors_are_status_objects(
    core: client.CoreV1Api, call: Callable[[Any], Any], status: int, reason: str
) -> None:
    with pytest.raises(ApiException) as info:
        call(core)
    assert info.value.status == status
    assert f'"reason": "{reason}"' in info.value.body or f'"reason":"{reason}"' in info.value.body


def test_stale_update_is_409_conflict(core: client.CoreV1Api) -> None:
    pod = core.create_namespaced_pod("default", a_pod("p", duration_s=60))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"x": "1"}}})
    pod.metadata.labels = {"x": "2"}
    with pytest.raises(ApiException) as info:
        core.replace_namespaced_pod("p", "default", pod)
    assert info.value.status == 409


def test_watch_resumes_from_resource_version(core: client.CoreV1Api) -> None:
    listed = core.list_namespaced_pod("default")
    core.create_namespaced_pod("default", a_pod("w1", duration_s=0.1))
    seen: list[tuple[str, str, str]] = []
    for event in watch.Watch().stream(
        core.list_namespaced_pod,
        "default",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=5,
    ):
        seen.append((event["type"], event["object"].metadata.name, event["object"].status.phase))
        if event["object"].status.phase == "Succeeded":
            break
    assert seen[0] == ("ADDED", "w1", "Pending")
    assert ("MODIFIED", "w1", "Running") in seen
    assert seen[-1] == ("MODIFIED", "w1", "Succeeded")


def test_watch_from_before_the_window_is_410_gone(core: client.CoreV1Api) -> None:
    first = core.list_namespaced_pod("default").metadata.resource_version
    for i in range(120):  # history_limit is 200; each pod is two changes or more
        core.create_namespaced_pod("default", a_pod(f"churn-{i}", duration_s=60))
    with pytest.raises(ApiException) as info:
        for _ in watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=first):
            pass
    assert info.value.status == 410
    assert "Expired" in str(info.value.reason)


def test_watch_ends_at_timeout_and_sends_bookmarks(sim: ThreadedSim, core: client.CoreV1Api) -> None:
    sim.call(lambda: object.__setattr__(sim.cluster.engine.config, "bookmark_interval_s", 0.2))
    rv = core.list_namespaced_pod("default").metadata.resource_version
    started = time.monotonic()
    response = core.list_namespaced_pod(
        "default",
        watch=True,
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=1,
        _preload_content=False,
    )
    lines = [line for line in response.read().decode().splitlines() if line]
    # It ended at its timeout, not before and not never (the upper bound is loose: a busy machine
    # takes its time to answer, and a watch that ignored its timeout would stay open for good).
    assert 0.9 < time.monotonic() - started < 30
    assert lines
    # Read as JSON: the simulator writes it compact, as kube-apiserver does.
    assert all(json.loads(line)["type"] == "BOOKMARK" for line in lines)


def test_watch_with_label_selector_reports_leaving_as_deleted(core: client.CoreV1Api) -> None:
    body = a_pod("sel", duration_s=60)
    body["metadata"]["labels"] = {"keep": "yes"}
    core.create_namespaced_pod("default", body)
    rv = core.list_namespaced_pod("default").metadata.resource_version
    core.patch_namespaced_pod("sel", "default", {"metadata": {"labels": {"keep": "no"}}})
    events = [
        (e["type"], e["object"].metadata.name)
        for e in watch.Watch().stream(
            core.list_namespaced_pod,
            "default",
            label_selector="keep=yes",
            resource_version=rv,
            timeout_seconds=1,
        )
    ]
    assert ("DELETED", "sel") in events


def test_kubelet_runs_for_the_annotated_duration_and_exit_code(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", a_pod("ok", gpus=1, duration_s=0.5))
    core.create_namespaced_pod("default", a_pod("bad", gpus=1, duration_s=0.1, exit_code=3))
    started = time.monotonic()
    wait_for(lambda: core.read_namespaced_pod("ok", "default").status.phase == "Running")
    ok = wait_for(lambda: (p := core.read_namespaced_pod("ok", "default")).status.phase == "Succeeded" and p)
    assert time.monotonic() - started >= 0.4
    assert ok.status.start_time is not None
    assert ok.status.container_statuses[0].state.terminated.exit_code == 0
    bad = wait_for(lambda: (p := core.read_namespaced_pod("bad", "default")).status.phase == "Failed" and p)
    assert bad.status.container_statuses[0].state.terminated.exit_code == 3


def test_kubelet_enforces_active_deadline(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", a_pod("slow", duration_s=30, activeDeadlineSeconds=1))
    pod = wait_for(
        lambda: (p := core.read_namespaced_pod("slow", "default")).status.phase == "Failed" and p, 5
    )
    assert pod.status.reason == "DeadlineExceeded"


def test_unschedulable_pod_stays_pending_with_condition_and_event(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", a_pod("huge", gpus=16, duration_s=60))
    pod = wait_for(lambda: (p := core.read_namespaced_pod("huge", "default")).status.conditions and p)
    scheduled = next(c for c in pod.status.conditions if c.type == "PodScheduled")
    assert (pod.status.phase, scheduled.status, scheduled.reason) == ("Pending", "False", "Unschedulable")
    assert "Insufficient nvidia.com/gpu" in scheduled.message
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=huge").items
    assert [e.reason for e in events] == ["FailedScheduling"]


def test_node_selector_on_gpu_product(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(
        "default", a_pod("on-l4", gpus=1, duration_s=60, nodeSelector={"nvidia.com/gpu.product": "NVIDIA-L4"})
    )
    pod = wait_for(lambda: (p := core.read_namespaced_pod("on-l4", "default")).spec.node_name and p)
    assert pod.spec.node_name == "sim1-l4-0"


def test_best_fit_packs_onto_the_fuller_node(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(
        "default", a_pod("first", gpus=6, duration_s=60, nodeSelector={"gpufed.io/pool": "a100"})
    )
    first = wait_for(lambda: core.read_namespaced_pod("first", "default").spec.node_name)
    core.create_namespaced_pod(
        "default", a_pod("second", gpus=2, duration_s=60, nodeSelector={"gpufed.io/pool": "a100"})
    )
    assert wait_for(lambda: core.read_namespaced_pod("second", "default").spec.node_name) == first


def test_cordoned_node_gets_no_pods(core: client.CoreV1Api) -> None:
    core.patch_node("sim1-l4-0", {"spec": {"unschedulable": True}})
    core.create_namespaced_pod(
        "default", a_pod("l4", gpus=1, duration_s=60, nodeSelector={"gpufed.io/pool": "l4"})
    )
    pod = wait_for(lambda: (p := core.read_namespaced_pod("l4", "default")).status.conditions and p)
    assert pod.spec.node_name is None
    core.patch_node("sim1-l4-0", {"spec": {"unschedulable": False}})
    assert wait_for(lambda: core.read_namespaced_pod("l4", "default").spec.node_name) == "sim1-l4-0"


def test_indexed_job_runs_to_complete(core: client.CoreV1Api, batch: client.BatchV1Api) -> None:
    batch.create_namespaced_job("default", an_indexed_job("train", 2))
    assert wait_for(lambda: job_condition(batch, "train")) == ("Complete", "CompletionsReached")
    pods = core.list_namespaced_pod("default", label_selector="batch.kubernetes.io/job-name=train").items
    by_index = {p.metadata.annotations["batch.kubernetes.io/job-completion-index"]: p for p in pods}
    assert sorted(by_index) == ["0", "1"]
    assert by_index["1"].metadata.name.startswith("train-1-")
    assert (by_index["1"].spec.hostname, by_index["1"].spec.subdomain) == ("train-1", "train")
    assert by_index["0"].metadata.owner_references[0].kind == "Job"
    job = batch.read_namespaced_job("train", "default")
    assert (job.status.succeeded, job.status.completed_indexes) == (2, "0-1")


def test_job_without_podgroup_starts_pods_one_by_one(
    core: client.CoreV1Api, batch: client.BatchV1Api
) -> None:
    # Two A100 nodes of 8: kube-scheduler places a 3 x 8 Job's pods one by one, so two run and one
    # waits (only a PodGroup makes a gang; see test_sim_volcano_faults for that).
    batch.create_namespaced_job("default", an_indexed_job("big", 3, duration_s=60))
    wait_for(
        lambda: len(core.list_namespaced_pod("default", field_selector="status.phase=Running").items) == 2
    )
    waiting = [p for p in core.list_namespaced_pod("default").items if p.spec.node_name is None]
    assert len(waiting) == 1
    assert wait_for(lambda: core.read_namespaced_pod(waiting[0].metadata.name, "default").status.conditions)


def test_failed_pod_fails_job_with_backoff_limit(core: client.CoreV1Api, batch: client.BatchV1Api) -> None:
    body = an_indexed_job("crash", 2, duration_s=5)
    body["spec"]["template"]["metadata"]["annotations"]["sim.gpufed.io/exit-code"] = "1"
    body["spec"]["template"]["metadata"]["annotations"]["sim.gpufed.io/duration"] = "0.1"
    batch.create_namespaced_job("default", body)
    assert wait_for(lambda: job_condition(batch, "crash")) == ("Failed", "BackoffLimitExceeded")


def test_job_deadline_fails_and_terminates_pods(core: client.CoreV1Api, batch: client.BatchV1Api) -> None:
    batch.create_namespaced_job("default", an_indexed_job("late", 1, duration_s=30, activeDeadlineSeconds=1))
    assert wait_for(lambda: job_condition(batch, "late")) == ("Failed", "DeadlineExceeded")
    wait_for(lambda: not core.list_namespaced_pod("default").items)


def test_lost_node_fails_pods_and_job_by_pod_failure_policy(
    sim: ThreadedSim, core: client.CoreV1Api, batch: client.BatchV1Api
) -> None:
    batch.create_namespaced_job("default", an_indexed_job("victim", 2, duration_s=60))
    wait_for(
        lambda: len(core.list_namespaced_pod("default", field_selector="status.phase=Running").items) == 2
    )
    sim.call(sim.cluster.faults.lose_node, "sim1-a100-0")
    node = core.read_node("sim1-a100-0")
    assert next(c for c in node.status.conditions if c.type == "Ready").status == "Unknown"
    assert wait_for(lambda: job_condition(batch, "victim")) == ("Failed", "PodFailurePolicy")
    lost = core.list_namespaced_pod("default", field_selector="spec.nodeName=sim1-a100-0").items
    assert lost
    assert lost[0].status.reason == "NodeLost"
    target = next(c for c in lost[0].status.conditions if c.type == "DisruptionTarget")
    assert target.reason == "DeletionByTaintManager"
    reasons = {e.reason for e in core.list_namespaced_event("default").items}
    assert {"NodeNotReady", "Scheduled", "Started"} <= reasons
    sim.call(sim.cluster.faults.restore_node, "sim1-a100-0")
    node = core.read_node("sim1-a100-0")
    assert next(c for c in node.status.conditions if c.type == "Ready").status == "True"
    assert not node.spec.taints


def test_eviction_api_marks_pod_and_fails_job(core: client.CoreV1Api, batch: client.BatchV1Api) -> None:
    batch.create_namespaced_job("default", an_indexed_job("ev", 1, duration_s=60))
    pod = wait_for(
        lambda: next(
            iter(core.list_namespaced_pod("default", field_selector="status.phase=Running").items), None
        )
    )
    core.create_namespaced_pod_eviction(
        pod.metadata.name,
        "default",
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod.metadata.name}},
    )
    # An API eviction is a marked, graceful delete: DisruptionTarget, a deletionTimestamp, then gone.
    evicted = core.read_namespaced_pod(pod.metadata.name, "default")
    assert evicted.metadata.deletion_timestamp is not None
    assert (
        next(c for c in evicted.status.conditions if c.type == "DisruptionTarget").reason
        == "EvictionByEvictionAPI"
    )
    assert wait_for(lambda: job_condition(batch, "ev")) == ("Failed", "PodFailurePolicy")
    wait_for(lambda: not core.list_namespaced_pod("default").items)


def test_foreground_delete_of_job_removes_pods_first(
    core: client.CoreV1Api, batch: client.BatchV1Api
) -> None:
    batch.create_namespaced_job("default", an_indexed_job("gone", 2, duration_s=60))
    wait_for(
        lambda: len(core.list_namespaced_pod("default", field_selector="status.phase=Running").items) == 2
    )
    batch.delete_namespaced_job("gone", "default", propagation_policy="Foreground", grace_period_seconds=5)
    job = batch.read_namespaced_job("gone", "default")
    assert job.metadata.deletion_timestamp is not None
    wait_for(lambda: not core.list_namespaced_pod("default").items)
    with pytest.raises(ApiException) as info:
        wait_for(lambda: batch.read_namespaced_job("gone", "default") and False, 5)
    assert info.value.status == 404


def test_job_delete_without_policy_orphans_pods_as_a_real_server(
    core: client.CoreV1Api, batch: client.BatchV1Api
) -> None:
    batch.create_namespaced_job("default", an_indexed_job("orphan", 1, duration_s=60))
    wait_for(lambda: core.list_namespaced_pod("default").items)
    batch.delete_namespaced_job("orphan", "default")
    pods = core.list_namespaced_pod("default").items
    assert len(pods) == 1
    assert not pods[0].metadata.owner_references


def test_bearer_token_is_required_when_configured() -> None:
    config = cluster("secure", [SimPoolConfig.of("a", "A100")], token="s3cret")
    with ThreadedSim(config) as sim:
        configuration = client.Configuration()
        configuration.host = sim.url
        anonymous = client.CoreV1Api(client.ApiClient(configuration))
        with pytest.raises(ApiException) as info:
            anonymous.list_node()
        assert info.value.status == 401
        configuration.api_key = {"authorization": "s3cret"}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        assert len(client.CoreV1Api(client.ApiClient(configuration)).list_node().items) == 1


def test_time_scale_runs_simulated_seconds_faster() -> None:
    config = cluster("fast", [SimPoolConfig.of("a", "A100")], time_scale=20)
    with ThreadedSim(config) as sim:
        configuration = client.Configuration()
        configuration.host = sim.url
        core = client.CoreV1Api(client.ApiClient(configuration))
        started = time.monotonic()
        # 20 simulated seconds are 1 s at 20x: the bound, half of the unscaled run, leaves a busy
        # machine 9 s of slack (a 4 s pod against a 1.5 s bound left it 1.3 s).
        core.create_namespaced_pod("default", a_pod("p", duration_s=20))
        wait_for(lambda: core.read_namespaced_pod("p", "default").status.phase == "Succeeded", timeout_s=30)
        assert time.monotonic() - started < 10


def test_status_subresource_writes_only_status(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", a_pod("s", duration_s=60))
    core.patch_namespaced_pod_status(
        "s", "default", {"status": {"message": "hello"}, "metadata": {"labels": {"x": "1"}}}
    )
    core.patch_namespaced_pod("s", "default", {"status": {"message": "ignored"}})
    pod = core.read_namespaced_pod("s", "default")
    assert (pod.status.message, pod.metadata.labels) == ("hello", None)


def test_watch_1_and_raw_lines(sim: ThreadedSim, core: client.CoreV1Api) -> None:
    rv = core.list_node().metadata.resource_version
    core.patch_node("sim1-l4-0", {"metadata": {"labels": {"touched": "yes"}}})
    url = f"{sim.url}/api/v1/nodes?watch=1&resourceVersion={rv}&timeoutSeconds=1"
    with urllib.request.urlopen(url, timeout=10) as response:
        lines = [json.loads(line) for line in response.read().splitlines() if line]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("MODIFIED", "sim1-l4-0")]


def test_nonsense_body_is_a_status_not_a_crash(sim: ThreadedSim) -> None:
    request = urllib.request.Request(
        f"{sim.url}/api/v1/namespaces/default/pods",
        data=b'{"metadata": "x"}',
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert json.loads(info.value.read())["kind"] == "Status"


def test_lists_page_with_limit_and_continue(core: client.CoreV1Api) -> None:
    for i in range(5):
        core.create_namespaced_pod("default", a_pod(f"page-{i}", duration_s=60))
    first = core.list_namespaced_pod("default", limit=2)
    assert [p.metadata.name for p in first.items] == ["page-0", "page-1"]
    assert first.metadata.remaining_item_count == 3
    names = [p.metadata.name for p in first.items]
    token = first.metadata._continue
    while token:
        page = core.list_namespaced_pod("default", limit=2, _continue=token)
        assert page.metadata.resource_version == first.metadata.resource_version
        names += [p.metadata.name for p in page.items]
        token = page.metadata._continue
    assert names == [f"page-{i}" for i in range(5)]
    with pytest.raises(ApiException) as info:
        core.list_namespaced_pod("default", limit=2, _continue="garbage")
    assert info.value.status == 400
