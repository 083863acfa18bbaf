"""The simulated and in-memory provisioners: scale-ups land after the lead time and show as pending
until then, scale-downs give back unlanded growth first and remove only idle nodes; and the HTTP
resizer against a real simulated cluster over loopback, where a node running a pod is never removed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from clusters.sim import SimCluster, SimClusterConfig, SimPoolConfig
from iac.api import Operation
from iac.errors import BusyNodesProtected
from iac.memory import InMemoryPoolResizer, InMemoryProvisioner
from iac.pools import Cloud, PoolSpec
from iac.sim_http import HttpPoolResizer, SimEndpoint
from iac.simulated import SimulatedProvisioner
from placement.model import ClusterName, GpuType
from tests.waits import until

SPEC = PoolSpec(
    cloud=Cloud.AWS,
    cluster=ClusterName("burst"),
    name="h100",
    gpu_type=GpuType("H100"),
    instance_type="p5.48xlarge",
    region="us-east-1",
    max_nodes=8,
    usd_per_gpu_hour=4.0,
    settings=(("eksCluster", "c"), ("nodeRoleArn", "r"), ("subnetIds", "s")),
)
KEY = ("burst", "h100")


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s

    async def sleep(self, seconds: float) -> None:
        """A wait on this clock: it moves the clock on and returns at once."""
        self.now_s += seconds
        await asyncio.sleep(0)


async def test_a_scale_up_is_pending_until_the_lead_time_then_lands() -> None:
    resizer = InMemoryPoolResizer({KEY: 1})
    clock = Clock()
    gate = asyncio.Event()
    slept_s: list[float] = []

    async def sleep(seconds: float) -> None:
        slept_s.append(seconds)
        await gate.wait()

    provisioner = SimulatedProvisioner(resizer, lead_time_s=300, clock=clock, sleep=sleep)
    preview = await provisioner.preview(SPEC, 4)
    assert (preview.nodes_before, preview.usd_per_hour_before, preview.usd_per_hour_after) == (1, 32.0, 128.0)
    result = await provisioner.apply(SPEC, 4)
    assert (result.nodes_before, result.nodes, result.ready_at_s) == (1, 4, 1300.0)
    status = await provisioner.status(SPEC)
    assert (status.nodes, status.ready_nodes) == (4, 1)
    assert [(p.operation, p.nodes_from, p.nodes_to, p.ready_at_s) for p in status.pending] == [
        (Operation.SCALE_UP, 1, 4, 1300.0)
    ]
    assert len(resizer.pools[KEY]) == 1, "nodes appeared before the lead time"
    await until(lambda: bool(slept_s), "the scale-up started its wait")
    assert slept_s == [300.0], "the scale-up waits out the lead time"
    gate.set()
    await until(lambda: len(resizer.pools[KEY]) == 4, "the scale-up landed")
    assert len(resizer.pools[KEY]) == 4
    status = await provisioner.status(SPEC)
    assert (status.nodes, status.ready_nodes, status.pending) == (4, 4, ())
    await provisioner.close()


async def test_a_scale_down_gives_back_unlanded_growth_first_then_idle_nodes_newest_first() -> None:
    resizer = InMemoryPoolResizer({KEY: 3})
    resizer.busy.add("burst-h100-0")
    never = asyncio.Event()

    async def sleep(_: float) -> None:
        await never.wait()

    provisioner = SimulatedProvisioner(resizer, lead_time_s=300, sleep=sleep)
    await provisioner.apply(SPEC, 5)
    shrunk = await provisioner.apply(SPEC, 2)
    assert (shrunk.nodes_before, shrunk.nodes) == (5, 2)
    assert resizer.pools[KEY] == ["burst-h100-0", "burst-h100-1"], "the newest idle node goes first"
    assert (await provisioner.status(SPEC)).pending == ()
    with pytest.raises(BusyNodesProtected):
        await provisioner.apply(SPEC, 0)
    assert resizer.pools[KEY] == ["burst-h100-0", "burst-h100-1"]
    with pytest.raises(BusyNodesProtected):
        await provisioner.apply(SPEC, 1, busy_nodes=2)
    await provisioner.close()


async def test_a_node_that_turned_busy_is_kept_and_the_result_says_so() -> None:
    resizer = InMemoryPoolResizer({KEY: 3})
    provisioner = SimulatedProvisioner(resizer, lead_time_s=0)
    original = resizer.pool_nodes

    async def stale(cluster: str, pool: str) -> Any:
        nodes = await original(cluster, pool)
        resizer.busy.add("burst-h100-2")  # a pod lands after the provisioner looked
        return nodes

    resizer.pool_nodes = stale  # type: ignore[method-assign]
    result = await provisioner.apply(SPEC, 1)
    assert result.nodes == 2
    assert "burst-h100-2" in resizer.pools[KEY]


async def test_the_in_memory_provisioner_reports_a_scale_up_pending_until_the_clock_passes_it() -> None:
    clock = Clock()
    provisioner = InMemoryProvisioner(lead_time_s=600, clock=clock)
    await provisioner.apply(SPEC, 3)
    status = await provisioner.status(SPEC)
    assert (status.exists, status.nodes, status.ready_nodes, len(status.pending)) == (True, 3, 0, 1)
    clock.now_s += 600
    status = await provisioner.status(SPEC)
    assert (status.nodes, status.ready_nodes, status.pending) == (3, 3, ())
    with pytest.raises(BusyNodesProtected):
        await provisioner.destroy(SPEC, busy_nodes=1)
    await provisioner.destroy(SPEC)
    assert not (await provisioner.status(SPEC)).exists
    assert [op for op, _, _ in provisioner.operations] == [Operation.SCALE_UP, Operation.DESTROY]


async def _busy_pod(sim: SimCluster, node: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train-0",
            "namespace": "default",
            "annotations": {"sim.gpufed.io/duration": "36000"},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        },
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{sim.url}/api/v1/namespaces/default/pods", json=pod) as reply,
    ):
        assert reply.status == 201, await reply.text()


async def test_the_http_resizer_grows_a_simulated_cluster_and_never_removes_a_busy_node() -> None:
    config = SimClusterConfig(
        name=ClusterName("burst"), pools=(SimPoolConfig.of("h100", "H100", node_count=2),)
    )
    async with SimCluster(config) as sim:
        resizer = HttpPoolResizer({"burst": SimEndpoint(sim.url)})
        # The lead time passes on the test's clock, at once; the nodes are added over real HTTP.
        clock = Clock()
        provisioner = SimulatedProvisioner(resizer, lead_time_s=300, clock=clock, sleep=clock.sleep)
        await provisioner.refresh(SPEC)
        await provisioner.apply(SPEC, 4)
        ready_nodes = 0
        deadline = time.monotonic() + 10
        while ready_nodes != 4 and time.monotonic() < deadline:
            ready_nodes = (await provisioner.status(SPEC)).ready_nodes
            await asyncio.sleep(0.005)
        assert ready_nodes == 4, f"{ready_nodes} of 4 nodes ready after 10 s"
        assert clock.now_s == 1300.0, "the nodes came after the lead time"
        nodes = await resizer.pool_nodes("burst", "h100")
        assert len(nodes.names) == 4
        assert sum(sim.engine.scheduler.free_gpus().values()) == 32, "the cluster's inventory grew"
        busy = nodes.names[-1]
        await _busy_pod(sim, busy)
        assert (await resizer.pool_nodes("burst", "h100")).busy == {busy}
        with pytest.raises(BusyNodesProtected):
            await provisioner.apply(SPEC, 0)
        result = await provisioner.apply(SPEC, 1)
        assert result.nodes == 1
        assert (await resizer.pool_nodes("burst", "h100")).names == (busy,), "the busy node stayed"
        await provisioner.close()
