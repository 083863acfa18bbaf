from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from federation.etcd_process import EtcdProcess
from federation.sim_process import SimProcess
from tests.e2e.harness import ServerProcess


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """A fresh etcd per test: end-to-end tests must not see each other's jobs."""
    process = EtcdProcess(tmp_path / "etcd")
    process.start()
    yield process
    process.stop()


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
