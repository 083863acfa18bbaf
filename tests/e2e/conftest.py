from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess
from tests.etcd_cluster import EtcdCluster


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """A fresh etcd per test: end-to-end tests must not see each other's jobs."""
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
    process = SimProcess(tmp_path / "sim", request.module.CLUSTERS)
    process.start()
    yield process
    process.stop()
