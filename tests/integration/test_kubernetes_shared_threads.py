"""Two member clusters on the process's one pool of threads: a hung one does not hold up the other.

The backends' calls share one pool (clusters.kubernetes.threads), each cluster bounded by its lane
at `api_threads`. Against two simulated clusters, through the real backend: while every create of
one cluster hangs (its API never answers; here its creates block before their request), that
cluster has exactly `api_threads` calls on threads and the rest wait without one, and the other
cluster's gangs are created and run, as the official client reads them on its cluster.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from clusters.api import GangPhase
from clusters.kubernetes import KubernetesBackend
from clusters.kubernetes.names import object_name
from clusters.kubernetes.threads import shared_pool
from tests.contract.conftest import POOLS, kube_config, no_leaked_threads
from tests.contract.helpers import a_gang, wait_phase
from tests.contract.simulated import running_sim
from tests.integration.test_kubernetes_calls import NS
from tests.waits import until

pytestmark = pytest.mark.usefixtures(no_leaked_threads.__name__)


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[tuple[KubernetesBackend, KubernetesBackend, Any]]:
    """Backends on two simulated clusters, and an official client of the second."""
    async with AsyncExitStack() as stack:
        backends = []
        api: Any = None
        for name in ("hung", "fine"):
            (tmp_path / name).mkdir()
            _, kubeconfig = await stack.enter_async_context(running_sim(tmp_path / name, POOLS))
            config = kube_config(name, kubeconfig)
            backend = await stack.enter_async_context(KubernetesBackend(dataclasses.replace(config)))
            assert await backend.wait_synced()
            backends.append(backend)
            api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
            stack.callback(api.close)
        yield backends[0], backends[1], api


def _hang(backend: KubernetesBackend, gate: threading.Event) -> list[int]:
    """Every create of `backend` blocks until `gate` opens, then goes to its API; answers how many
    have entered."""
    entered = [0]
    lock = threading.Lock()  # the creates enter on many threads at once
    original: Callable[..., Any] = backend._api.create_volcano_job

    def hung(*args: Any) -> Any:
        with lock:
            entered[0] += 1
        if not gate.wait(timeout=60.0):
            raise TimeoutError("the test never let the hung cluster answer")
        return original(*args)

    backend._api.create_volcano_job = hung  # type: ignore[method-assign,assignment]
    return entered


async def test_a_hung_cluster_holds_its_api_threads_and_the_other_clusters_gangs_run(
    two: tuple[KubernetesBackend, KubernetesBackend, Any],
) -> None:
    hung, fine, api = two
    bound = hung._config.settings.api_threads
    gate = threading.Event()
    entered = _hang(hung, gate)
    stuck = [
        asyncio.create_task(hung.dispatch(a_gang(f"stuck-{i}", replicas=1, gpus=1, duration_s=60.0)))
        for i in range(bound + 12)
    ]
    try:
        await until(lambda: entered[0] == bound, f"{bound} creates of the hung cluster on threads")
        gangs = [a_gang(f"fine-{i}", replicas=1, gpus=1, duration_s=60.0) for i in range(bound + 4)]
        await asyncio.gather(*(fine.dispatch(g) for g in gangs))
        for gang in gangs:
            await wait_phase(fine, gang, GangPhase.RUNNING)
        # As the cluster's own API shows them (the official client, as kubectl reads it).
        listed = await asyncio.to_thread(
            k8s.CustomObjectsApi(api).list_namespaced_custom_object,
            "batch.volcano.sh",
            "v1alpha1",
            NS,
            "jobs",
        )
        assert {o["metadata"]["name"] for o in listed["items"]} >= {
            object_name(g.job_id, g.attempt) for g in gangs
        }
        # The hung cluster still has its bound on threads, the rest of its creates waiting without one.
        assert entered[0] == bound
        assert hung._calls.busy == bound
        assert not any(t.done() for t in stuck)
    finally:
        gate.set()
    await asyncio.gather(*stuck)
    assert entered[0] == bound + 12
    await until(lambda: hung._calls.busy == 0, "the hung cluster's slots freed")
    assert shared_pool()._max_workers > 2 * bound
