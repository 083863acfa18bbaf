"""Volcano Jobs and injected faults, through the official client and the `/sim/v1` admin endpoint.

Volcano's policies (AbortJob on PodEvicted/PodFailed, CompleteJob on TaskCompleted, RestartJob with
maxRetry) and the faults gpufed must survive (unreachable, slow, lost nodes, capacity changes) are
driven the way another process would drive them: over HTTP.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from clusters.sim import SimPoolConfig, ThreadedSim, cluster
from tests.e2e import harness
from tests.e2e.harness import Poll
from tests.integration.test_sim_kubelet_conformance import settle

GROUP, VERSION = "batch.volcano.sh", "v1alpha1"


@pytest.fixture
def sim() -> Iterator[ThreadedSim]:
    config = cluster("vc", [SimPoolConfig.of("h100", "H100", node_count=2)], default_duration_s=60)
    with ThreadedSim(config) as running:
        yield running


@pytest.fixture
def api(sim: ThreadedSim) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = sim.url
    configuration.retries = False
    return client.ApiClient(configuration)


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


_T = TypeVar("_T")


def wait_for(check: Poll[_T], timeout_s: float = 10.0) -> _T:
    """tests/e2e/harness.wait_for, polled every 20 ms: the simulator answers in milliseconds."""
    return harness.wait_for(check, timeout_s, interval_s=0.02)


def admin(sim: ThreadedSim, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{sim.url}/sim/v1{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        result: dict[str, Any] = json.loads(response.read())
    return result


def a_vcjob(
    name: str,
    *,
    workers: int = 2,
    gpus: int = 8,
    worker_s: float = 60,
    master_s: float | None = None,
    exit_code: int = 0,
    policies: list[dict[str, Any]] | None = None,
    max_retry: int = 0,
) -> dict[str, Any]:
    def task(task_name: str, replicas: int, duration_s: float) -> dict[str, Any]:
        annotations = {"sim.gpufed.io/duration": str(duration_s), "sim.gpufed.io/exit-code": str(exit_code)}
        return {
            "name": task_name,
            "replicas": replicas,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                    "containers": [
                        {
                            "name": "main",
                            "image": "train:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        }

    tasks = [task("worker", workers, worker_s)]
    if master_s is not None:
        tasks.insert(0, task("master", 1, master_s))
        tasks[0]["policies"] = [{"event": "TaskCompleted", "action": "CompleteJob"}]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpufed"}},
        "spec": {
            "minAvailable": sum(t["replicas"] for t in tasks),
            "schedulerName": "volcano",
            "queue": "vision",
            "priorityClassName": "default",
            "maxRetry": max_retry,
            "plugins": {"svc": [], "ssh": [], "env": []},
            "policies": policies
            if policies is not None
            else [
                {"event": "PodEvicted", "action": "AbortJob"},
                {"event": "PodFailed", "action": "AbortJob"},
            ],
            "tasks": tasks,
        },
    }


def vcjob_state(custom: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    job = custom.get_namespaced_custom_object(GROUP, VERSION, "default", "jobs", name)
    state: dict[str, Any] = job.get("status", {}).get("state", {})
    return state


def phase_is(custom: client.CustomObjectsApi, name: str, phase: str) -> Callable[[], bool]:
    return lambda: vcjob_state(custom, name).get("phase") == phase


def test_vcjob_creates_podgroup_service_and_pods(
    core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "jobs", a_vcjob("vj", workers=2))
    wait_for(phase_is(custom, "vj", "Running"))
    group = custom.get_namespaced_custom_object(
        "scheduling.volcano.sh", "v1beta1", "default", "podgroups", "vj"
    )
    assert (group["spec"]["minMember"], group["spec"]["queue"], group["status"]["phase"]) == (
        2,
        "vision",
        "Running",
    )
    pods = {p.metadata.name: p for p in core.list_namespaced_pod("default").items}
    assert sorted(pods) == ["vj-worker-0", "vj-worker-1"]
    worker = pods["vj-worker-1"]
    assert worker.metadata.annotations["scheduling.k8s.io/group-name"] == "vj"
    assert {"name": "VC_TASK_INDEX", "value": "1"} in [
        e.to_dict() for e in worker.spec.containers[0].env
    ] or any(e.name == "VC_TASK_INDEX" and e.value == "1" for e in worker.spec.containers[0].env)
    assert (worker.spec.hostname, worker.spec.subdomain) == ("vj-worker-1", "vj")
    assert core.read_namespaced_service("vj", "default").spec.cluster_ip == "None"
    job = custom.get_namespaced_custom_object(GROUP, VERSION, "default", "jobs", "vj")
    assert (job["status"]["running"], job["status"]["minAvailable"]) == (2, 2)


def test_podgroup_gang_waits_for_min_member(
    sim: ThreadedSim, core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    # 3 x 8 GPUs on two 8-GPU nodes: no pod may start, not even the two that would fit.
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "jobs", a_vcjob("big", workers=3))
    # All three pods, each tried by the scheduler: `all()` of no pods is true before the job has any.
    wait_for(lambda: len([p for p in core.list_namespaced_pod("default").items if p.status.conditions]) == 3)
    # The scheduler has tried every pod and nothing is left to do: none was bound.
    settle(sim)
    pods = core.list_namespaced_pod("default").items
    assert [p.spec.node_name for p in pods] == [None, None, None]
    assert vcjob_state(custom, "big")["phase"] == "Pending"


def test_task_completed_completes_the_job(core: client.CoreV1Api, custom: client.CustomObjectsApi) -> None:
    body = a_vcjob("mw", workers=1, master_s=0.3, worker_s=60, gpus=4)
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "jobs", body)
    wait_for(phase_is(custom, "mw", "Completed"))
    wait_for(lambda: all(p.status.phase == "Succeeded" for p in core.list_namespaced_pod("default").items))


def test_failed_pod_aborts_the_job(custom: client.CustomObjectsApi) -> None:
    body = a_vcjob("crash", workers=2, worker_s=0.2, exit_code=2)
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "jobs", body)
    wait_for(phase_is(custom, "crash", "Aborted"))
    assert vcjob_state(custom, "crash")["reason"] == "PodFailed"


def test_eviction_aborts_with_pod_evicted(
    sim: ThreadedSim, core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "jobs", a_vcjob("ev"))
    wait_for(phase_is(custom, "ev", "Running"))
    assert admin(sim, "POST", "/faults/pods/default/ev-worker-0/evict")["ok"]
    wait_for(phase_is(custom, "ev", "Aborted"))
    assert vcjob_state(custom, "ev")["reason"] == "PodEvicted"
    wait_for(
        lambda: not [p for p in core.list_namespaced_pod("default").items if p.status.phase == "Running"]
    )


def test_restart_job_retries_up_to_max_retry(custom: client.CustomObjectsApi) -> None:
    body = a_vcjob(
        "retry",
        workers=1,
        worker_s=0.1,
        exit_code=1,
        max_retry=2,
        policies=[{"event": "PodFailed", "action": "RestartJob"}],
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "jobs", body)
    wait_for(phase_is(custom, "retry", "Failed"))
    job = custom.get_namespaced_custom_object(GROUP, VERSION, "default", "jobs", "retry")
    assert job["status"]["retryCount"] == 2


def test_deleting_vcjob_deletes_pods_podgroup_and_service(
    core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "jobs", a_vcjob("del"))
    wait_for(phase_is(custom, "del", "Running"))
    custom.delete_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        "jobs",
        "del",
        body={"propagationPolicy": "Foreground", "gracePeriodSeconds": 1},
    )
    wait_for(lambda: not core.list_namespaced_pod("default").items)
    wait_for(lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, "default", "jobs")["items"])
    assert not custom.list_namespaced_custom_object(
        "scheduling.volcano.sh", "v1beta1", "default", "podgroups"
    )["items"]
    assert [s.metadata.name for s in core.list_namespaced_service("default").items] == []


def test_lost_node_over_admin_http(
    sim: ThreadedSim, core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "jobs", a_vcjob("nl", workers=1))
    node = wait_for(lambda: core.read_namespaced_pod("nl-worker-0", "default").spec.node_name)
    assert admin(sim, "POST", f"/faults/nodes/{node}/lose")["ok"]
    pod = core.read_namespaced_pod("nl-worker-0", "default")
    assert (pod.status.phase, pod.status.reason) == ("Failed", "NodeLost")
    wait_for(phase_is(custom, "nl", "Aborted"))
    assert admin(sim, "POST", f"/faults/nodes/{node}/restore")["ok"]
    assert admin(sim, "GET", "/state")["free_gpus"][node] == 8


@pytest.mark.parametrize("mode", ["close", "503", "429"])
def test_unreachable_fails_calls_and_watches_then_recovers(
    sim: ThreadedSim, core: client.CoreV1Api, mode: str
) -> None:
    rv = core.list_node().metadata.resource_version
    stream = watch.Watch().stream(core.list_node, resource_version=rv, timeout_seconds=30)
    admin(sim, "POST", "/faults/unreachable", {"mode": mode})
    with pytest.raises((ApiException, urllib3.exceptions.HTTPError)) as info:
        core.list_node()
    if mode != "close":
        assert isinstance(info.value, ApiException)
        assert info.value.status == int(mode)
    # An open watch ends (its stream closes or breaks) instead of hanging.
    with pytest.raises((StopIteration, urllib3.exceptions.HTTPError, ApiException)):
        next(stream)
    assert admin(sim, "GET", "/state")["unreachable"] == mode
    admin(sim, "DELETE", "/faults/unreachable")
    assert len(core.list_node().items) == 2


# Long enough that a call without it is surely shorter, on a machine busy enough to take a few
# hundred ms over a plain list (0.3 s was: the check that the latency is gone could fail under load).
LATENCY_S = 2.0


def test_slow_api_adds_latency(sim: ThreadedSim, core: client.CoreV1Api) -> None:
    admin(sim, "POST", "/faults/latency", {"seconds": LATENCY_S})
    started = time.monotonic()
    core.list_node()
    assert time.monotonic() - started >= LATENCY_S
    admin(sim, "POST", "/faults/latency", {"seconds": 0})
    assert admin(sim, "GET", "/state")["latency_s"] == 0
    started = time.monotonic()
    core.list_node()
    assert time.monotonic() - started < LATENCY_S


def test_pool_scales_up_and_down(sim: ThreadedSim, core: client.CoreV1Api) -> None:
    added = admin(sim, "POST", "/pools/h100/nodes", {"count": 2})["added"]
    assert added == ["vc-h100-2", "vc-h100-3"]
    assert len(core.list_node(label_selector="gpufed.io/pool=h100").items) == 4
    removed = admin(sim, "DELETE", "/pools/h100/nodes?count=3")["removed"]
    assert removed == ["vc-h100-3", "vc-h100-2", "vc-h100-1"]
    assert [n.metadata.name for n in core.list_node().items] == ["vc-h100-0"]


def test_queues_are_served_and_a_second_create_is_409(custom: client.CustomObjectsApi) -> None:
    queue = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": "vision"},
        "spec": {"weight": 1, "reclaimable": True},
    }
    custom.create_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues", queue)
    with pytest.raises(ApiException) as info:
        custom.create_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues", queue)
    assert info.value.status == 409
    names = [
        q["metadata"]["name"]
        for q in custom.list_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues")["items"]
    ]
    assert names == ["default", "vision"]


def test_a_cluster_without_volcano_neither_lists_nor_serves_it() -> None:
    config = cluster("plain", [SimPoolConfig.of("h100", "H100")], volcano=False)
    with ThreadedSim(config) as sim:
        configuration = client.Configuration()
        configuration.host = sim.url
        api = client.ApiClient(configuration)
        groups = {g.name for g in client.ApisApi(api).get_api_versions().groups}
        # The built-in groups only; neither Volcano group.
        assert groups == {
            "authorization.k8s.io",
            "batch",
            "coordination.k8s.io",
            "rbac.authorization.k8s.io",
            "scheduling.k8s.io",
        }
        with pytest.raises(ApiException) as info:
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                GROUP, VERSION, "default", "jobs", a_vcjob("x")
            )
        assert info.value.status == 404


def test_vcjob_watch_through_custom_objects_api(custom: client.CustomObjectsApi) -> None:
    rv = custom.list_namespaced_custom_object(GROUP, VERSION, "default", "jobs")["metadata"][
        "resourceVersion"
    ]
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", "jobs", a_vcjob("w", workers=1, worker_s=0.2)
    )
    phases: list[str] = []
    for event in watch.Watch().stream(
        custom.list_namespaced_custom_object,
        GROUP,
        VERSION,
        "default",
        "jobs",
        resource_version=rv,
        timeout_seconds=10,
    ):
        phases.append(event["object"].get("status", {}).get("state", {}).get("phase", ""))
        if phases[-1] == "Completed":
            break
    assert phases[-1] == "Completed"
    assert "Running" in phases


# -- a pod of the gang deleted by someone else: Volcano's PodEvicted ------------------------------


def pod_uids(core: client.CoreV1Api) -> dict[str, str]:
    return {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod("default").items}


def vcjob(custom: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    job: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, "default", "jobs", name)
    return job


def test_deleting_a_gang_pod_aborts_with_gpufeds_policy(
    core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "jobs", a_vcjob("del1"))
    wait_for(phase_is(custom, "del1", "Running"))
    core.delete_namespaced_pod("del1-worker-0", "default")
    wait_for(phase_is(custom, "del1", "Aborted"))
    job = vcjob(custom, "del1")
    assert job["status"]["state"]["reason"] == "PodEvicted"
    assert job["status"]["version"] == 1
    # Not recreated: the gang is over, and its other pod is stopped.
    wait_for(lambda: not core.list_namespaced_pod("default").items)


@pytest.mark.parametrize(("action", "ending"), [("TerminateJob", "Terminated"), ("AbortJob", "Aborted")])
def test_deleting_a_gang_pod_applies_the_jobs_ending_policy(
    core: client.CoreV1Api, custom: client.CustomObjectsApi, action: str, ending: str
) -> None:
    body = a_vcjob("end", policies=[{"event": "PodEvicted", "action": action}])
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "jobs", body)
    wait_for(phase_is(custom, "end", "Running"))
    core.delete_namespaced_pod("end-worker-1", "default")
    wait_for(phase_is(custom, "end", ending))
    assert vcjob_state(custom, "end")["reason"] == "PodEvicted"


def test_deleting_a_gang_pod_restarts_the_job_with_a_new_version(
    core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    body = a_vcjob("rs", max_retry=3, policies=[{"event": "PodEvicted", "action": "RestartJob"}])
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "jobs", body)
    wait_for(phase_is(custom, "rs", "Running"))
    before = pod_uids(core)
    rv = custom.list_namespaced_custom_object(GROUP, VERSION, "default", "jobs")["metadata"][
        "resourceVersion"
    ]
    core.delete_namespaced_pod("rs-worker-0", "default")
    phases: list[str] = []
    for event in watch.Watch().stream(
        custom.list_namespaced_custom_object,
        GROUP,
        VERSION,
        "default",
        "jobs",
        resource_version=rv,
        timeout_seconds=10,
    ):
        phases.append(event["object"]["status"]["state"]["phase"])
        if phases[-1] == "Running" and "Restarting" in phases:
            break
    assert "Restarting" in phases
    assert phases[-1] == "Running"
    job = vcjob(custom, "rs")
    assert (job["status"]["retryCount"], job["status"]["version"]) == (1, 1)
    after = wait_for(lambda: (u := pod_uids(core)) and len(u) == 2 and u)
    # The same names, new pods, created at the new version.
    assert sorted(after) == sorted(before)
    assert not set(after.values()) & set(before.values())
    pod = core.read_namespaced_pod("rs-worker-1", "default")
    assert pod.metadata.annotations["volcano.sh/job-version"] == "1"


def test_restart_policy_with_max_retry_zero_fails_the_job(
    core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    body = a_vcjob("once", max_retry=0, policies=[{"event": "PodEvicted", "action": "RestartJob"}])
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "jobs", body)
    wait_for(phase_is(custom, "once", "Running"))
    core.delete_namespaced_pod("once-worker-0", "default")
    wait_for(phase_is(custom, "once", "Failed"))
    assert vcjob(custom, "once")["status"]["retryCount"] == 1


def test_without_a_policy_a_deleted_pod_is_recreated(
    core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "jobs", a_vcjob("sync", policies=[]))
    wait_for(phase_is(custom, "sync", "Running"))
    before = pod_uids(core)["sync-worker-0"]
    core.delete_namespaced_pod("sync-worker-0", "default")
    wait_for(lambda: pod_uids(core).get("sync-worker-0") not in (None, before))
    assert vcjob_state(custom, "sync")["phase"] == "Running"


def test_another_teams_plain_job_never_splits_a_gang(
    sim: ThreadedSim, core: client.CoreV1Api, custom: client.CustomObjectsApi
) -> None:
    # A third party's Job without PodGroup takes one node; gpufed's 2 x 8 gang must not half-start.
    other = {
        "metadata": {"name": "other"},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "m", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
                    ],
                }
            }
        },
    }
    client.BatchV1Api(core.api_client).create_namespaced_job("default", other)
    wait_for(lambda: [p for p in core.list_namespaced_pod("default").items if p.status.phase == "Running"])
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "jobs", a_vcjob("gang"))
    wait_for(
        lambda: (
            all(
                p.status.conditions
                for p in core.list_namespaced_pod("default", label_selector="volcano.sh/job-name=gang").items
            )
            and core.list_namespaced_pod("default", label_selector="volcano.sh/job-name=gang").items
        )
    )
    # The scheduler has tried every pod of the gang and nothing is left to do: none was bound.
    settle(sim)
    gang = core.list_namespaced_pod("default", label_selector="volcano.sh/job-name=gang").items
    assert len(gang) == 2
    assert all(p.spec.node_name is None for p in gang)
    assert vcjob_state(custom, "gang")["phase"] == "Pending"
