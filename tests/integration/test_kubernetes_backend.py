"""The Kubernetes backend against a simulated cluster: what only a Kubernetes cluster can show.

Node health and taints in the inventory, watches (not polling) carrying capacity changes, relisting
after 410 Gone, evictions and lost nodes, an API that stops answering, the objects' names, labels
and shapes, and garbage collection. The simulator is driven through the Kubernetes API where a real
cluster would be (cordon, taint, the eviction subresource) and through its fault switches where
only a broken cluster would be (a lost node, an unreachable API server).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from clusters.api import ClusterUnreachable, GangPhase, GangRejected, GangWorkload
from clusters.kubernetes import KubernetesBackend
from clusters.kubernetes.names import object_name
from clusters.sim import SimCluster
from federation.scheduling.snapshot import unbound_replica_gpus
from placement.model import CapacityKind, ClusterState, GpuType, JobId, JobPhase, NodeShare
from tests.conftest import build_job
from tests.contract.conftest import POOLS, kube_config, no_leaked_threads
from tests.contract.helpers import a_gang, eventually, free_gpus, status_of, total_gpus, wait_phase
from tests.contract.simulated import running_sim

# Every test here checks that the backend it closed left no thread behind.
pytestmark = pytest.mark.usefixtures(no_leaked_threads.__name__)

H100 = GpuType("H100")
ON_DEMAND = CapacityKind.ON_DEMAND
NS = "gpufed-team-a"


@dataclass
class World:
    sim: SimCluster
    backend: KubernetesBackend
    api: Any  # kubernetes.client.ApiClient, for what a test reads or does through the API itself

    async def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """A blocking client call off the event loop that serves the simulator."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    @property
    def core(self) -> Any:
        return k8s.CoreV1Api(self.api)

    @property
    def batch(self) -> Any:
        return k8s.BatchV1Api(self.api)

    @property
    def custom(self) -> Any:
        return k8s.CustomObjectsApi(self.api)

    async def pods_of(self, gang_object: str) -> list[Any]:
        pods = await self.call(
            self.core.list_namespaced_pod, NS, label_selector=f"gpufed.io/gang={gang_object}"
        )
        return list(pods.items)

    def node_names(self, pool: str) -> list[str]:
        return [n["metadata"]["name"] for n in self.sim.engine.pool_nodes(pool)]


async def open_world(tmp_path: Path, *, volcano: bool, **sim_options: Any) -> AsyncIterator[World]:
    async with running_sim(tmp_path, POOLS, volcano=volcano, **sim_options) as (sim, kubeconfig):
        config = kube_config("sim", kubeconfig)
        settings = dataclasses.replace(config.settings, use_volcano=None if volcano else False)
        api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
        try:
            async with KubernetesBackend(dataclasses.replace(config, settings=settings)) as backend:
                assert await backend.wait_synced()
                yield World(sim, backend, api)
        finally:
            api.close()


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    """A simulated cluster without Volcano as far as the backend is concerned (Indexed Jobs)."""
    async for w in open_world(tmp_path, volcano=False):
        yield w


@pytest.fixture
async def vc_world(tmp_path: Path) -> AsyncIterator[World]:
    async for w in open_world(tmp_path, volcano=True):
        yield w


@pytest.fixture(params=["indexed", "volcano"])
async def any_world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    """Both kinds of gang object, for behaviour that must not depend on the kind."""
    async for w in open_world(tmp_path, volcano=request.param == "volcano"):
        yield w


def nodes_free(state: ClusterState, pool: str) -> tuple[int, ...]:
    return next(p for p in state.pools if p.name == pool).free_gpus_per_node


def h100_nodes_free(state: ClusterState) -> tuple[int, ...]:
    return nodes_free(state, "h100")


def refused_by_the_scheduler(pod: Any) -> bool:
    """The scheduler tried the pod and found no room: PodScheduled is False, Unschedulable."""
    return any(
        (c.type, c.status, c.reason) == ("PodScheduled", "False", "Unschedulable")
        for c in pod.status.conditions or ()
    )


# ---- inventory -----------------------------------------------------------------------------------


async def test_cordoned_tainted_and_not_ready_nodes_leave_the_inventory(world: World) -> None:
    first, second = world.node_names("h100")
    assert h100_nodes_free(await world.backend.inventory()) == (8, 8)
    await world.call(world.core.patch_node, first, {"spec": {"unschedulable": True}})

    async def count(n: int) -> bool:
        return len(h100_nodes_free(await world.backend.inventory())) == n

    await eventually(lambda: count(1), what="the cordoned node to leave")
    await world.call(world.core.patch_node, first, {"spec": {"unschedulable": False}})
    await eventually(lambda: count(2), what="the uncordoned node to return")
    # A taint gpufed's pods tolerate keeps the node; another NoSchedule taint removes it.
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    await world.call(world.core.patch_node, second, {"spec": {"taints": [taint]}})
    # A later change on the same node watch, one the inventory shows (a node in another pool):
    # once it is there, the taint's event before it has been applied too.
    l4_nodes = len(nodes_free(await world.backend.inventory(), "l4"))
    world.sim.faults.add_nodes("l4", 1)

    async def l4_node_added() -> bool:
        return len(nodes_free(await world.backend.inventory(), "l4")) == l4_nodes + 1

    await eventually(l4_node_added, what="the node added after the taint")
    assert len(h100_nodes_free(await world.backend.inventory())) == 2
    other = {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}
    await world.call(world.core.patch_node, second, {"spec": {"taints": [taint, other]}})
    await eventually(lambda: count(1), what="the node with a foreign taint to leave")
    world.sim.faults.lose_node(first)
    await eventually(lambda: count(0), what="the NotReady node to leave")
    world.sim.faults.restore_node(first)
    await eventually(lambda: count(1), what="the node to come back Ready")


async def test_a_gangs_node_shares_follow_the_inventory_as_nodes_are_cordoned(world: World) -> None:
    gang = a_gang("located-1", replicas=1, gpus=8, duration_s=60.0)
    await world.backend.dispatch(gang)
    await wait_phase(world.backend, gang, GangPhase.RUNNING)
    (pod,) = await world.pods_of(object_name(gang.job_id, gang.attempt))
    mine = pod.spec.node_name
    (other,) = [n for n in world.node_names("h100") if n != mine]

    async def located_at(*shares: NodeShare) -> bool:
        status = await status_of(world.backend, gang)
        return status is not None and status.nodes == shares

    # The inventory lists a pool's schedulable nodes by name; a share names its position there.
    await eventually(lambda: located_at(NodeShare("h100", sorted((mine, other)).index(mine), 8)))
    await world.call(world.core.patch_node, other, {"spec": {"unschedulable": True}})
    await eventually(lambda: located_at(NodeShare("h100", 0, 8)), what="the share to move to position 0")
    # On a node the inventory leaves out, the gang cannot be located at all.
    await world.call(world.core.patch_node, mine, {"spec": {"unschedulable": True}})
    await eventually(lambda: located_at(), what="no shares once the gang's node is cordoned")
    # Its GPUs are still bound (the federation must not hold them back as if the pod had no node).
    status = await status_of(world.backend, gang)
    assert status is not None
    assert status.bound_gpus == 8
    await world.call(world.core.patch_node, mine, {"spec": {"unschedulable": False}})
    await eventually(lambda: located_at(NodeShare("h100", 0, 8)), what="the share back")
    await world.backend.cancel(gang.job_id, gang.attempt, 0.0)


async def test_a_pending_gang_says_how_many_of_its_gpus_are_bound_to_nodes(world: World) -> None:
    hog = a_gang("hog-1", replicas=2, gpus=8, duration_s=60.0)
    await world.backend.dispatch(hog)
    await wait_phase(world.backend, hog, GangPhase.RUNNING)
    waiting = a_gang("waits-1", replicas=1, gpus=8, duration_s=60.0)
    await world.backend.dispatch(waiting)

    async def reported(gang: GangWorkload, phase: GangPhase, bound_gpus: int) -> bool:
        status = await status_of(world.backend, gang)
        return status is not None and status.phase is phase and status.bound_gpus == bound_gpus

    await eventually(lambda: reported(hog, GangPhase.RUNNING, 16), what="the running gang's 16 bound GPUs")
    await eventually(lambda: reported(waiting, GangPhase.PENDING, 0), what="the waiting gang with none bound")


async def test_a_pod_bound_between_two_looks_is_counted_once_by_observe(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler holds back a live gang's GPUs that its status does not show bound, and the
    inventory counts bound pods used: read apart, a binding between the two counted the gang twice
    (the replay-agreement failure, where burst-now sent a gang to a cloud with private GPUs free).
    The watch thread is made to apply the binding between the backend's first and second look at
    the pod cache; `observe` must look once."""
    before = world.backend._pods.snapshot()
    gang = a_gang("between-1", replicas=1, gpus=8, duration_s=60.0)
    await world.backend.dispatch(gang)
    await eventually(
        lambda: _bound(world, gang, 8), what="the gang's pod bound to a node in the backend's caches"
    )
    looks: list[int] = []
    real = world.backend._pods.snapshot

    def binding_lands_after_the_first_look() -> Any:
        looks.append(1)
        return before if len(looks) == 1 else real()

    monkeypatch.setattr(world.backend._pods, "snapshot", binding_lands_after_the_first_look)
    statuses, state = await world.backend.observe()
    (status,) = [s for s in statuses if (s.job_id, s.attempt) == (gang.job_id, gang.attempt)]
    record = build_job(gang.job_id, gpus=8, gpu="H100", phase=JobPhase.DISPATCHED)
    held_back = sum(unbound_replica_gpus(record, True, status))
    used = total_gpus(state, H100, ON_DEMAND) - free_gpus(state, H100, ON_DEMAND)
    assert held_back + used == 8, f"held back {held_back} and counted {used} used: the gang's 8 GPUs once"
    await world.backend.cancel(gang.job_id, gang.attempt, 0.0)


async def _bound(world: World, gang: GangWorkload, gpus: int) -> bool:
    status = await status_of(world.backend, gang)
    state = await world.backend.inventory()
    used = total_gpus(state, H100, ON_DEMAND) - free_gpus(state, H100, ON_DEMAND)
    return status is not None and status.bound_gpus == gpus and used == gpus


async def test_capacity_changes_arrive_by_watch_without_listing_again(world: World) -> None:
    before = world.backend.watch_counts()
    world.sim.faults.add_nodes("h100", 2)

    async def four_nodes() -> bool:
        return len(h100_nodes_free(await world.backend.inventory())) == 4

    await eventually(four_nodes, what="two new nodes")
    after = world.backend.watch_counts()
    assert after["nodes"][0] == before["nodes"][0], "the node cache listed again instead of watching"
    assert after["nodes"][2] >= before["nodes"][2] + 2
    # Many reads cost no API call at all: the cache answers.
    for _ in range(50):
        await world.backend.inventory()
    assert world.backend.watch_counts()["nodes"][:2] == after["nodes"][:2]


async def test_a_watch_too_old_for_the_server_lists_again(tmp_path: Path) -> None:
    async for w in open_world(tmp_path, volcano=False, history_limit=20):
        await relist_after_gone(w)


async def relist_after_gone(w: World) -> None:
    lists_before, watches_before, _ = w.backend.watch_counts()["nodes"]
    # While the watches are cut off, more changes happen than the server keeps history for.
    w.sim.faults.set_unreachable("close")

    async def cut_off() -> bool:
        # The node watch ended and the backend asks for it again (refused while unreachable).
        return w.backend.watch_counts()["nodes"][1] > watches_before

    await eventually(cut_off, what="the backend to ask for its cut node watch again")
    w.sim.faults.add_nodes("l4", 30)
    w.sim.faults.set_reachable()

    async def relisted() -> bool:
        state = await w.backend.inventory()
        nodes = next(p for p in state.pools if p.name == "l4").free_gpus_per_node
        return len(nodes) == 32 and w.backend.watch_counts()["nodes"][0] > lists_before

    await eventually(relisted, what="a relist after 410 Gone showing 32 L4 nodes")


async def test_an_unreachable_api_is_reported_and_recovered_from(world: World) -> None:
    gang = a_gang("outage-1", duration_s=60.0)
    await world.backend.dispatch(gang)
    await wait_phase(world.backend, gang, GangPhase.RUNNING)
    world.sim.faults.set_unreachable("close")

    async def unreachable() -> bool:
        return not (await world.backend.inventory()).reachable

    await eventually(unreachable, what="inventory to say unreachable")
    with pytest.raises(ClusterUnreachable):
        await world.backend.statuses()
    with pytest.raises(ClusterUnreachable):
        await world.backend.dispatch(a_gang("outage-2"))
    world.sim.faults.set_reachable()

    async def back() -> bool:
        return (await world.backend.inventory()).reachable

    await eventually(back, what="inventory to say reachable again")
    assert (await wait_phase(world.backend, gang, GangPhase.RUNNING)).phase is GangPhase.RUNNING


@pytest.mark.parametrize("mode", ["503", "429"])
async def test_api_errors_are_unreachable_not_rejections(world: World, mode: str) -> None:
    world.sim.faults.set_unreachable(mode)
    try:
        with pytest.raises(ClusterUnreachable):
            await world.backend.cancel(JobId("missing"), 1, 0.0)
    finally:
        world.sim.faults.set_reachable()


# ---- evictions -----------------------------------------------------------------------------------


async def test_a_lost_node_evicts_the_gang(any_world: World) -> None:
    gang = a_gang("lost-1", replicas=2, gpus=8, duration_s=60.0)
    await any_world.backend.dispatch(gang)
    await wait_phase(any_world.backend, gang, GangPhase.RUNNING)
    pods = await any_world.pods_of(object_name(gang.job_id, gang.attempt))
    any_world.sim.faults.lose_node(pods[0].spec.node_name)
    status = await wait_phase(any_world.backend, gang, *[p for p in GangPhase if p.is_final])
    assert status.phase is GangPhase.EVICTED, status


async def test_an_evicted_pod_evicts_the_gang(any_world: World) -> None:
    gang = a_gang("evicted-1", replicas=2, gpus=4, duration_s=60.0)
    await any_world.backend.dispatch(gang)
    await wait_phase(any_world.backend, gang, GangPhase.RUNNING)
    pod = (await any_world.pods_of(object_name(gang.job_id, gang.attempt)))[0]
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod.metadata.name, "namespace": NS},
    }
    await any_world.call(any_world.core.create_namespaced_pod_eviction, pod.metadata.name, NS, body)
    status = await wait_phase(any_world.backend, gang, *[p for p in GangPhase if p.is_final])
    assert status.phase is GangPhase.EVICTED, status


async def test_evict_records_an_event_and_reports_evicted(any_world: World) -> None:
    gang = a_gang("preempted-1", duration_s=60.0)
    await any_world.backend.dispatch(gang)
    await wait_phase(any_world.backend, gang, GangPhase.RUNNING)
    await any_world.backend.evict(gang.job_id, gang.attempt, 0.0, "preempted by a higher priority job")
    status = await wait_phase(any_world.backend, gang, GangPhase.EVICTED)
    assert "preempted" in status.message
    events = await any_world.call(any_world.core.list_namespaced_event, NS)
    mine = [e for e in events.items if e.involved_object.name == object_name(gang.job_id, gang.attempt)]
    assert any(e.reason == "Evicted" and "preempted" in (e.message or "") for e in mine)

    async def freed() -> bool:
        return free_gpus(await any_world.backend.inventory(), H100, ON_DEMAND) == 16

    await eventually(freed, what="the evicted gang's GPUs to be free")


async def test_a_gang_that_fits_only_later_waits_whole(any_world: World) -> None:
    big = a_gang("fill-1", replicas=2, gpus=8, duration_s=60.0)
    await any_world.backend.dispatch(big)
    await wait_phase(any_world.backend, big, GangPhase.RUNNING)
    later = a_gang("later-1", replicas=2, gpus=4, duration_s=60.0)
    await any_world.backend.dispatch(later)

    async def both_pods_refused() -> bool:
        pods = await any_world.pods_of(object_name(later.job_id, later.attempt))
        return len(pods) == 2 and all(refused_by_the_scheduler(p) for p in pods)

    # Not a moment's grace: the scheduler has tried each of the gang's pods and found no room.
    await eventually(both_pods_refused, what="the scheduler to refuse both pods of the later gang")
    later_status = await status_of(any_world.backend, later)
    assert later_status is not None
    assert later_status.phase is GangPhase.PENDING
    pods = await any_world.pods_of(object_name(later.job_id, later.attempt))
    assert not [p for p in pods if p.status.phase == "Running"], "part of the gang started"
    await any_world.backend.cancel(big.job_id, big.attempt, 0.0)
    await wait_phase(any_world.backend, later, GangPhase.RUNNING)


async def test_replicas_that_differ_need_volcano(world: World) -> None:
    gang = a_gang("mixed-1", tasks=("master", "worker"), replicas=1)
    gang = dataclasses.replace(
        gang, replicas=(gang.replicas[0], dataclasses.replace(gang.replicas[1], gpu_count=2))
    )
    with pytest.raises(GangRejected, match="Indexed Job"):
        await world.backend.dispatch(gang)


# ---- objects -------------------------------------------------------------------------------------


async def test_names_labels_and_namespace(world: World) -> None:
    long_id = "a-very-long-training-job-name-for-the-llm-1234abcd"
    gang = a_gang(long_id, tenant="team-a", replicas=2, gpus=4, duration_s=60.0, attempt=3)
    await world.backend.dispatch(gang)
    await wait_phase(world.backend, gang, GangPhase.RUNNING)
    name = object_name(gang.job_id, gang.attempt)
    assert len(name) <= 48
    assert name == name.lower()
    namespace = await world.call(world.core.read_namespace, NS)
    assert namespace.metadata.labels["gpufed.io/tenant"] == "team-a"
    job = await world.call(world.batch.read_namespaced_job, name, NS)
    labels = job.metadata.labels
    assert labels["gpufed.io/job-id"] == long_id
    assert labels["gpufed.io/tenant"] == "team-a"
    assert labels["gpufed.io/attempt"] == "3"
    assert labels["app.kubernetes.io/managed-by"] == "gpufed"
    for pod in await world.pods_of(name):
        assert pod.metadata.labels["gpufed.io/job-id"] == long_id
        assert pod.metadata.annotations["sim.gpufed.io/duration"] == "60.0"
        assert len(f"{name}-{pod.metadata.annotations['batch.kubernetes.io/job-completion-index']}") <= 63


async def test_indexed_job_shape(world: World) -> None:
    gang = a_gang("shape-1", replicas=2, gpus=4, duration_s=60.0, max_runtime_s=900)
    await world.backend.dispatch(gang)
    name = object_name(gang.job_id, gang.attempt)
    job = (await world.call(world.batch.read_namespaced_job, name, NS, _preload_content=False)).json()
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 2
    assert spec["backoffLimit"] == 0
    rule = spec["podFailurePolicy"]["rules"][0]
    assert rule["action"] == "FailJob"
    assert rule["onPodConditions"][0]["type"] == "DisruptionTarget"
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == name
    assert pod["activeDeadlineSeconds"] == 900
    assert pod["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "gpufed.io/pool": "h100",
    }
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in pod["tolerations"]
    # AKS taints every spot node; without the toleration a gang could never land on one.
    assert {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Exists"} in pod["tolerations"]
    assert pod["priorityClassName"] == "default"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["MASTER_ADDR"]["value"] == f"{name}-0.{name}"
    assert env["WORLD_SIZE"]["value"] == "8"  # processes: 2 pods of 4 GPUs
    index = env["GPUFED_POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert "batch.kubernetes.io/job-completion-index" in index
    service = await world.call(world.core.read_namespaced_service, name, NS)
    assert service.spec.cluster_ip == "None"
    assert service.spec.selector == {"gpufed.io/gang": name}


async def test_spot_gangs_select_spot_nodes(world: World) -> None:
    gang = a_gang("spot-1", kind=CapacityKind.SPOT, replicas=1, gpus=8, duration_s=60.0)
    await world.backend.dispatch(gang)
    await wait_phase(world.backend, gang, GangPhase.RUNNING)
    (pod,) = await world.pods_of(object_name(gang.job_id, gang.attempt))
    assert pod.spec.node_name in world.node_names("h100-spot")


async def test_volcano_job_shape(vc_world: World) -> None:
    gang = a_gang("vc-shape-1", tasks=("master", "worker"), replicas=2, gpus=4, duration_s=60.0)
    await vc_world.backend.dispatch(gang)
    name = object_name(gang.job_id, gang.attempt)
    job = await vc_world.call(
        vc_world.custom.get_namespaced_custom_object, "batch.volcano.sh", "v1alpha1", NS, "jobs", name
    )
    spec = job["spec"]
    assert spec["minAvailable"] == 4
    assert spec["queue"] == "team-a"
    assert spec["schedulerName"] == "volcano"
    assert spec["maxRetry"] == 0
    assert spec["priorityClassName"] == "default"
    assert set(spec["plugins"]) == {"svc", "ssh", "env"}
    assert {"event": "PodEvicted", "action": "AbortJob"} in spec["policies"]
    assert {"event": "PodFailed", "action": "AbortJob"} in spec["policies"]
    master, worker = spec["tasks"]
    assert (master["name"], master["replicas"], worker["name"], worker["replicas"]) == (
        "master",
        2,
        "worker",
        2,
    )
    assert master["policies"] == [{"event": "TaskCompleted", "action": "CompleteJob"}]
    container = master["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MASTER_ADDR"] == f"{name}-master-0.{name}"
    assert env["WORLD_SIZE"] == "16"  # processes: 4 pods of 4 GPUs
    group = await vc_world.call(
        vc_world.custom.get_namespaced_custom_object,
        "scheduling.volcano.sh",
        "v1beta1",
        NS,
        "podgroups",
        name,
    )
    assert group["spec"]["minMember"] == 4


# ---- garbage collection --------------------------------------------------------------------------


async def test_garbage_collection_removes_attempts_that_are_not_live(any_world: World) -> None:
    old = a_gang("gc-1", attempt=1, replicas=1, gpus=8, duration_s=60.0)
    new = a_gang("gc-1", attempt=2, replicas=1, gpus=8, duration_s=60.0)
    for gang in (old, new):
        await any_world.backend.dispatch(gang)
        await wait_phase(any_world.backend, gang, GangPhase.RUNNING)
    collected = await any_world.backend.collect_garbage({(new.job_id, new.attempt)}, grace_period_s=0.0)
    assert collected == [(old.job_id, old.attempt)]

    async def gone() -> bool:
        return await status_of(any_world.backend, old) is None

    await eventually(gone, what="the stale attempt's gang to be deleted")
    services = await any_world.call(any_world.core.list_namespaced_service, NS)
    assert [s.metadata.name for s in services.items] == [object_name(new.job_id, new.attempt)]
    new_status = await status_of(any_world.backend, new)
    assert new_status is not None
    assert new_status.phase is GangPhase.RUNNING


async def test_the_direct_calls_raise_the_apis_status_and_page_lists(world: World) -> None:
    """`clusters.kubernetes.kube` calls the client's `ApiClient` by path, not through the generated
    methods: an answer other than 2xx still raises `ApiException` with the API's `Status` as its
    body (https://kubernetes.io/docs/reference/using-api/api-concepts/#responses), and a list's
    `limit` gives one page with a `continue` token, as the API's chunked lists do."""
    from kubernetes.client.exceptions import ApiException

    from clusters.kubernetes.kube import KubeApi, Timeouts

    kube = KubeApi(world.api, Timeouts(connect_s=5, read_s=10))
    await world.call(
        kube.create_namespace, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "twice"}}
    )
    with pytest.raises(ApiException) as again:
        await world.call(
            kube.create_namespace, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "twice"}}
        )
    assert again.value.status == 409
    status = json.loads(again.value.body or "{}")
    assert (status["kind"], status["status"], status["reason"]) == ("Status", "Failure", "AlreadyExists")
    with pytest.raises(ApiException) as missing:
        await world.call(kube.delete_pod, "twice", "no-such-pod", 0)
    assert missing.value.status == 404, missing.value.body
    assert json.loads(missing.value.body or "{}")["reason"] == "NotFound"
    page = await world.call(kube.list_page, KubeApi.list_nodes, label_selector=None, limit=1, token=None)
    assert page["kind"] == "NodeList"
    assert len(page["items"]) == 1
    assert page["metadata"].get("continue"), "one node of several, and a token for the rest"
