"""One contract suite, many backends: the same cases run against each `ClusterBackend` subject.

Subjects: the in-memory cluster; the Kubernetes backend against a simulated cluster with Volcano and
one without (Indexed Jobs); and the Kubernetes backend against a real cluster when
`GPUFED_TEST_KUBECONFIG` (and optionally `GPUFED_TEST_KUBE_CONTEXT`) names one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusters.api import ClusterBackend
from clusters.kubernetes import GpuPrice, KubernetesBackend, KubernetesClusterConfig, KubernetesSettings
from clusters.kubernetes.inventory import KNOWN_GPUS
from clusters.memory import InMemoryCluster
from placement.model import CapacityKind, ClusterName, GpuType, PoolSpec, Provider

H100 = GpuType("H100")
L4 = GpuType("L4")
# The cluster every simulated subject has: two pools of H100 nodes (one spot) and one of L4.
POOLS = (
    PoolSpec("h100", H100, CapacityKind.ON_DEMAND, 9.5, 8, 2),
    PoolSpec("h100-spot", H100, CapacityKind.SPOT, 3.5, 8, 1),
    PoolSpec("l4", L4, CapacityKind.ON_DEMAND, 0.8, 4, 2),
)
PRICES = tuple(GpuPrice(p.gpu_type, p.kind, p.usd_per_gpu_hour) for p in POOLS)


@dataclass(frozen=True, slots=True)
class Subject:
    """A backend under test and what the suite may assume of it."""

    backend: ClusterBackend
    # The pools the cluster was built with; None for a real cluster (read from its inventory).
    pools: tuple[PoolSpec, ...] | None
    # Whether runs follow GangWorkload.sim_duration_s and sim_exit_code (not on a real cluster).
    simulated: bool


def fast_settings() -> KubernetesSettings:
    """Short timings so that outages and syncs are seen within a test's patience."""
    return KubernetesSettings(
        unreachable_after_s=1.0,
        watch_timeout_s=60,
        connect_timeout_s=1.0,
        request_timeout_s=5.0,
        backoff_min_s=0.05,
        backoff_max_s=0.5,
        sync_timeout_s=10.0,
        api_threads=8,
    )


def kube_config(name: str, kubeconfig: Path, context: str | None = None) -> KubernetesClusterConfig:
    return KubernetesClusterConfig(
        name=ClusterName(name),
        provider=Provider.AWS,
        region="us-east-1",
        prices=PRICES,
        kubeconfig=kubeconfig,
        context=context,
        object_store="s3://sim",
        scalable=True,
        settings=fast_settings(),
    )


async def memory_subject() -> AsyncIterator[Subject]:
    yield Subject(
        InMemoryCluster(ClusterName("mem"), provider=Provider.AWS, region="us-east-1", pools=POOLS),
        POOLS,
        simulated=True,
    )


async def sim_subject(tmp_path: Path, *, volcano: bool) -> AsyncIterator[Subject]:
    from tests.contract.simulated import running_sim

    async with running_sim(tmp_path, POOLS, volcano=volcano) as (_, kubeconfig):
        config = kube_config("sim", kubeconfig)
        settings = dataclasses.replace(config.settings, use_volcano=None if volcano else False)
        async with KubernetesBackend(dataclasses.replace(config, settings=settings)) as backend:
            assert await backend.wait_synced(), "the backend's watches never listed"
            assert backend.uses_volcano is volcano
            yield Subject(backend, POOLS, simulated=True)


async def real_subject() -> AsyncIterator[Subject]:
    path = os.environ.get("GPUFED_TEST_KUBECONFIG")
    if not path:
        pytest.skip("no real cluster: set GPUFED_TEST_KUBECONFIG (and GPUFED_TEST_KUBE_CONTEXT) to run")
    # Every GPU type a node may carry is priced, so that every pool shows in the inventory.
    prices = tuple(GpuPrice(GpuType(g), k, 1.0) for g in KNOWN_GPUS for k in CapacityKind)
    config = KubernetesClusterConfig(
        name=ClusterName("real"),
        provider=Provider.AWS,
        region="unknown",
        prices=prices,
        kubeconfig=Path(path),
        context=os.environ.get("GPUFED_TEST_KUBE_CONTEXT") or None,
        settings=KubernetesSettings(sync_timeout_s=30.0),
    )
    async with KubernetesBackend(config) as backend:
        assert await backend.wait_synced(30.0), "the real cluster's watches never listed"
        yield Subject(backend, None, simulated=False)


@pytest.fixture(autouse=True)
async def no_leaked_threads() -> AsyncIterator[None]:
    """A closed backend leaves no watch or worker thread behind (close() joins them all)."""
    yield
    deadline = time.monotonic() + 5.0
    while True:
        left = [t.name for t in threading.enumerate() if t.name.startswith("gpufed-") and t.is_alive()]
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"threads left running after the test: {left}")
        await asyncio.sleep(0.05)


@pytest.fixture(params=["memory", "k8s-sim-volcano", "k8s-sim-indexed", "k8s-real"])
async def subject(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Subject]:
    match request.param:
        case "memory":
            source = memory_subject()
        case "k8s-sim-volcano":
            source = sim_subject(tmp_path, volcano=True)
        case "k8s-sim-indexed":
            source = sim_subject(tmp_path, volcano=False)
        case _:
            source = real_subject()
    async for value in source:
        yield value
