from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from federation.store.job_store import PREFIX
from federation.store.kv_etcd import EtcdKv
from tests.e2e import zygote
from tests.e2e.harness import ServerProcess
from tests.etcd_cluster import EtcdCluster


def _empty_gpufed_keys(endpoint: str) -> None:
    """Deletes every key under /gpufed/, where a server keeps all it stores (docs/architecture.md,
    "etcd keys"), on a thread of its own: a test's event loop may already be running here."""

    async def wipe() -> None:
        kv = await EtcdKv.connect(endpoint)
        try:
            await kv.delete_prefix(PREFIX)
        finally:
            await kv.close()

    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, wipe()).result(timeout=30)


@pytest.fixture
def etcd(etcd_process: EtcdProcess) -> EtcdProcess:
    """The worker's one etcd (tests/conftest.py), emptied of gpufed's keys: end-to-end tests must not
    see each other's jobs, and the previous test's servers are stopped before this one starts. A test
    that kills, pauses or restarts etcd takes `own_etcd` instead."""
    _empty_gpufed_keys(etcd_process.endpoint)
    return etcd_process


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """An etcd of the test's own, for the tests that kill, pause or restart it."""
    process = EtcdProcess(tmp_path / "etcd")
    process.start()
    yield process
    process.stop()


@pytest.fixture(params=["etcd1", "etcd3"])
def any_etcd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EtcdProcess | EtcdCluster]:
    """A fresh etcd per test, one member or a three-member cluster (as a real deployment runs it):
    `.endpoint` is what `gpufed serve --etcd` takes either way."""
    store: EtcdProcess | EtcdCluster = (
        EtcdProcess(tmp_path / "etcd") if request.param == "etcd1" else EtcdCluster(tmp_path / "etcd")
    )
    store.start()
    yield store
    store.stop()


@pytest.fixture
def server(etcd: EtcdProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(etcd.endpoint, tmp_path / "state")
    process.start()
    yield process
    process.stop()


@pytest.fixture
def sims(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SimProcess]:
    """The test module's simulated clusters (its `CLUSTERS`), as one simulator process."""
    process = SimProcess(
        tmp_path / "sim", request.module.CLUSTERS, launcher=zygote.launch_sim if zygote.enabled() else None
    )
    process.start()
    yield process
    process.stop()
