"""Fixtures shared by every test suite: one real etcd for the session, and clients isolated per test."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from datasync.loopback_ports import SLOT_ENV, slot_for
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.postgres_process import PostgresProcess, PostgresUnavailable
from federation.store.job_store import PREFIX, KvStore
from federation.store.jobs import JobRecord
from federation.store.kv_etcd import EtcdKv
from federation.store.written import CHECK_ENV
from tests.job_builder import build_job as build_job  # re-exported: the tests import it from here


def _port_slot_of_this_worker() -> str | None:
    """GPUFED_PORT_SLOT for this pytest-xdist worker (datasync.loopback_ports): the workers start
    servers at the same time, and two drawing the same free port race to bind it (stop 37's CI lost a
    worker's SeaweedFS pair, and with it 12 tests, to one such race). The modulus is the smallest
    allowed one that gives every worker its own slot (`slot_for`)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        return None
    return slot_for(int(worker[2:]), count)


# Set at import, before any fixture starts a server; the servers' own processes inherit it.
if (_slot := _port_slot_of_this_worker()) is not None:
    os.environ[SLOT_ENV] = _slot

# Every record a process takes back from its own watch as the one it wrote is checked against the
# decoding of its bytes (federation.store.written): set at import too, so the servers inherit it.
os.environ[CHECK_ENV] = "1"

# What a full run writes under the temporary directory at its peak (etcd, SeaweedFS, PostgreSQL and
# history data), measured by sampling the disk through fresh-clone `make test` runs on four workers:
# 1.1 GiB on 2026-11-29 once a module's directories went with its fixture (2.2 GiB before, with
# issue 30's modules; the hint keeps some room), all of it gone at the end of a run that passes
# (`tmp_path_retention_policy`).
FULL_RUN_PEAK_GIB = 1.5


def pytest_sessionstart(session: pytest.Session) -> None:
    """The free space where the tests write, first thing in the output (`-q` too, which hides the
    header): a full disk fails every fixture at once (stop 26's CI), and this line names the cause
    before the errors do."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    where = tempfile.gettempdir()
    free_gib = shutil.disk_usage(where).free / 2**30
    low = "; LOW: tests that write will fail" if free_gib < FULL_RUN_PEAK_GIB else ""
    reporter.write_line(
        f"free disk under {where}: {free_gib:.1f} GiB (a full run peaks at about {FULL_RUN_PEAK_GIB} GiB){low}"
    )


# The order in which the workers are handed the suite (pytest-xdist gives each worker the next test
# in collection order as it frees up). The slow tiers go first, so that the thousands of
# sub-second unit tests fill the gaps at the end instead of one long end-to-end test running alone
# after everything else has finished. A stable sort keeps each module's tests together and in order.
TIER_ORDER = ("e2e", "deploy", "integration", "contract", "unit")


def _tier(item: pytest.Item) -> int:
    parts = item.nodeid.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER)


# Fixtures that cost seconds and memory to start and that any test of a worker can share: every
# test that takes one runs on the same worker (pytest-xdist's `xdist_group`), so only one worker
# starts it. Ray is the costly one: about 5 s and 0.7 GiB a start.
SHARED_ON_ONE_WORKER = {"ray_session": "ray"}
# A module-scoped fixture (a server for the whole module, say) is set up once per worker that runs
# any of the module's tests: such a module runs whole on one worker.
MODULE_SCOPES = frozenset({"module", "class", "package"})


# Tests that run a three-member etcd cluster of their own (the end-to-end `any_etcd` fixture's
# "etcd3", the outage test) run one at a time on one worker: each cluster holds about 370 MiB of
# preallocated WAL on disk, and four at once (with everything else) took a full run's peak past
# 2.4 GiB; they are also the most CPU-hungry tests, and slowed each other most.
ETCD_CLUSTER_GROUP = "etcd-cluster"


def _xdist_group(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("any_etcd") == "etcd3":
        return ETCD_CLUSTER_GROUP
    fixture_info = getattr(item, "_fixtureinfo", None)
    if fixture_info is None:
        return None
    for name, group in SHARED_ON_ONE_WORKER.items():
        if name in fixture_info.name2fixturedefs:
            return group
    for definitions in fixture_info.name2fixturedefs.values():
        if definitions and definitions[-1].scope in MODULE_SCOPES:
            return item.nodeid.split("::", 1)[0]
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    # Marked as each test is collected: pytest-xdist's worker reads the groups in its own
    # pytest_collection_modifyitems, which ran before this conftest's even when asked to run first.
    group = _xdist_group(item)
    if group is not None and item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_tier)


# Directories that fixtures wider than a test but narrower than the session (a module's `gpufed up`,
# say: about 62 MiB, most of it etcd's preallocated WAL) made with `tmp_path_factory.mktemp`. pytest
# removes a passing test's `tmp_path` at once (`tmp_path_retention_policy = "failed"`) but keeps every
# `mktemp` directory until the session ends, so a full run's finished modules piled up to 2.2 GiB.
# Each is removed when its fixture is torn down, unless a test failed while it was up (kept to debug).
_MADE_BY_FIXTURE: dict[int, tuple[list[Path], int]] = {}
_FAILURES = [0]  # tests failed so far on this worker


def _basetemp_entries(request: pytest.FixtureRequest) -> set[Path]:
    basetemp = request.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    return set(basetemp.iterdir())


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> Iterator[None]:
    # The fixture's own dependencies are set up before this hook runs: what appears in the base
    # directory during it is the fixture's own.
    if fixturedef.scope not in MODULE_SCOPES:
        yield
        return
    before = _basetemp_entries(request)
    yield
    made = sorted(_basetemp_entries(request) - before)
    if made:
        _MADE_BY_FIXTURE[id(fixturedef)] = (made, _FAILURES[0])


def pytest_fixture_post_finalizer(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> None:
    made, failures_at_setup = _MADE_BY_FIXTURE.pop(id(fixturedef), ([], 0))
    if _FAILURES[0] > failures_at_setup:
        return
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _FAILURES[0] += 1


@pytest.fixture(scope="session")
def etcd_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    """One etcd for the whole session (about 0.2 s to start); tests isolate by wiping /gpufed/."""
    process = EtcdProcess(tmp_path_factory.mktemp("etcd-session") / "data")
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def postgres_process() -> Iterator[PostgresProcess]:
    """One real PostgreSQL for the session, started only if a test asks for it (about 1 s).

    Missing server binaries skip the PostgreSQL tests on a developer's machine, but fail them in CI
    (CI=true): there `make test` has installed Debian's postgresql, so a missing one is a broken run.
    """
    try:
        process = PostgresProcess()
    except PostgresUnavailable as error:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI needs a real PostgreSQL: {error}")
        pytest.skip(str(error))
    process.start()
    yield process
    process.stop()


@pytest.fixture
async def etcd_kv(etcd_process: EtcdProcess) -> AsyncIterator[EtcdKv]:
    kv = await EtcdKv.connect(etcd_process.endpoint)
    # The store's keys are fixed under /gpufed/, so isolation means starting from an empty prefix.
    await kv.delete_prefix(PREFIX)
    try:
        yield kv
    finally:
        await kv.close()


@pytest.fixture
def etcd_store(etcd_kv: EtcdKv) -> KvStore:
    return KvStore(etcd_kv)


@pytest.fixture
def make_job() -> Callable[..., JobRecord]:
    """A queued job record: make_job("j1", tenant="t2", gpus=4)."""
    return build_job
