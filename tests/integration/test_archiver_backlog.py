"""A backlog of thousands of ended jobs, archived by a real server's leader at the bounded rate while
its scheduling cycle goes on: the wiring (one history store per server, SQLite under the state dir,
the archiver beside the loop) and the figures (archive rate, cycle time and event-loop lag during
the backlog). The figures are printed, not asserted: this machine's CPU is shared."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import pytest

from federation.history.config import HistorySettings
from federation.history.engine import DEFAULT_FILE
from federation.history.sql_store import SqlHistoryStore
from federation.runtime.bootstrap import bootstrap
from federation.runtime.config import load_config
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.server import FederationServer, ServerConfig
from federation.scheduling.scheduler import CycleResult, Scheduler
from federation.store.intervals import LEDGER_PREFIX
from federation.store.job_store import JOBS, Fence, KvStore
from federation.store.kv_etcd import EtcdKv
from tests.conftest import build_job
from tests.contract.helpers import eventually
from tests.integration.test_archiver import seed_ended

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).parents[1] / "e2e" / "federation.yaml"
BACKLOG = 3000
RATE_PER_S = 600.0
QUEUED = 40
# Loop-lag samples (one per 10 ms sleep, so a second or more) taken once the archiver has caught up,
# the figures to compare the backlog's with.
CAUGHT_UP_SAMPLES = 100


def _lag(lags: list[float]) -> str:
    ordered = sorted(lags)
    return (
        f"median {1000 * statistics.median(ordered):.1f}, p99 {1000 * ordered[int(0.99 * len(ordered))]:.1f},"
        f" max {1000 * ordered[-1]:.1f}"
    )


def _cycle_sample(server: FederationServer) -> tuple[float, float]:
    registry = server.metrics.registry
    total = registry.get_sample_value("gpufed_scheduling_cycle_seconds_sum") or 0.0
    count = registry.get_sample_value("gpufed_scheduling_cycle_seconds_count") or 0.0
    return total, count


async def test_a_backlog_is_archived_at_the_bounded_rate_while_cycles_go_on(
    etcd_kv: EtcdKv, etcd_process: EtcdProcess, tmp_path: Path
) -> None:
    store = KvStore(etcd_kv)
    await bootstrap(store, load_config(CONFIG), tmp_path / "tokens")
    ended_at = time.time() - 2 * 3600
    for start in range(0, BACKLOG, 200):
        await asyncio.gather(
            *(
                seed_ended(store, f"old-{i:05d}", ended_at_s=ended_at + i * 0.001, tenant="vision")
                for i in range(start, min(start + 200, BACKLOG))
            )
        )
    # Live work for the cycle: queued jobs too big to place, so every cycle plans them.
    for i in range(QUEUED):
        await store.create_job(
            build_job(f"queued-{i:03d}", tenant="vision", gpus=64),
            idempotency_key=f"q{i}",
            manifest_digest="d",
        )
    state = tmp_path / "state"
    server = FederationServer(
        ServerConfig(
            etcd_endpoint=etcd_process.endpoint,
            state_dir=state,
            identity="backlog",
            cycle_interval_s=0.2,
            history=HistorySettings(archive_batch=100, archive_rate_per_s=RATE_PER_S),
            archive_idle_s=0.2,
        )
    )
    lags: list[float] = []
    stop = asyncio.Event()

    async def probe() -> None:
        # How late a 10 ms sleep wakes: what any API call or cycle waits for the loop.
        while not stop.is_set():
            asked = time.monotonic()
            await asyncio.sleep(0.01)
            lags.append(time.monotonic() - asked - 0.01)

    await server.start()
    try:
        assert server.history is not None
        cycle_before = _cycle_sample(server)
        prober = asyncio.create_task(probe())
        started = time.monotonic()
        first_archived: float | None = None
        while True:
            counts = await asyncio.to_thread(server.history.counts)
            if counts.jobs and first_archived is None:
                first_archived = time.monotonic()
            if counts.jobs >= BACKLOG:
                break
            assert time.monotonic() - started < 120, f"archived {counts.jobs} of {BACKLOG}"
            await asyncio.sleep(0.2)
        took = time.monotonic() - (first_archived or started)
        cycle_after = _cycle_sample(server)
        during = list(lags)
        # The same figures with the archiver caught up, to compare with.
        lags.clear()
        caught_up = time.monotonic()

        async def enough_samples() -> bool:
            return len(lags) >= CAUGHT_UP_SAMPLES

        await eventually(enough_samples, timeout_s=60, what=f"{CAUGHT_UP_SAMPLES} loop-lag samples")
        caught_up_s = time.monotonic() - caught_up
        stop.set()
        await prober
        idle_cycles = _cycle_sample(server)
        left = (await etcd_kv.range_prefix(JOBS)).kvs
        intervals_left = (await etcd_kv.range_prefix(LEDGER_PREFIX)).kvs
    finally:
        await server.stop()

    # Every old job moved, none doubled; the queued ones stay.
    assert (counts.jobs, counts.intervals) == (BACKLOG, BACKLOG)
    assert sorted(kv.key.decode().rsplit("/", 1)[1] for kv in left) == [
        f"queued-{i:03d}" for i in range(QUEUED)
    ]
    assert intervals_left == ()
    # The history is SQLite under the state dir, and it closed with the server.
    reopened = SqlHistoryStore.open(f"sqlite:///{state / DEFAULT_FILE}")
    assert reopened.counts().jobs == BACKLOG
    reopened.close()
    # Never faster than the bound (the first batch is free of its wait, hence one batch of slack).
    rate = (BACKLOG - 100) / took
    assert rate <= RATE_PER_S * 1.1
    cycles = cycle_after[1] - cycle_before[1]
    mean_cycle_ms = 1000 * (cycle_after[0] - cycle_before[0]) / max(cycles, 1)
    idle = idle_cycles[1] - cycle_after[1]
    idle_cycle_ms = 1000 * (idle_cycles[0] - cycle_after[0]) / max(idle, 1)
    print(
        f"\narchive_rate_jobs_per_s: {rate:.0f} (bound {RATE_PER_S:.0f}) over {BACKLOG} jobs in {took:.1f} s"
        f"\ncycles: during the backlog {cycles:.0f} in {took:.1f} s, mean {mean_cycle_ms:.1f} ms;"
        f" after it {idle:.0f} in {caught_up_s:.1f} s, mean {idle_cycle_ms:.1f} ms"
        f"\nloop_lag_ms during: {_lag(during)}\nloop_lag_ms after:  {_lag(lags)}"
    )
    assert cycles > 0


# Leader passes (a reconciler tick and a scheduling cycle each) that the test below waits for after
# the first: an archiver, had it been on, starts at the first and passes every 0.1 s meanwhile.
PASSES_AFTER_THE_FIRST = 5


async def test_archive_false_leaves_everything_in_etcd(
    etcd_kv: EtcdKv, etcd_process: EtcdProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The leader's passes, counted: an idle cycle is skipped before the cycle metric sees it.
    passes: list[float] = []
    real_run_cycle = Scheduler.run_cycle

    async def counted_run_cycle(self: Scheduler, fence: Fence | None) -> CycleResult:
        result = await real_run_cycle(self, fence)
        passes.append(time.monotonic())
        return result

    monkeypatch.setattr(Scheduler, "run_cycle", counted_run_cycle)
    store = KvStore(etcd_kv)
    await bootstrap(store, load_config(CONFIG), tmp_path / "tokens")
    await seed_ended(store, "old", ended_at_s=time.time() - 2 * 3600, tenant="vision")
    server = FederationServer(
        ServerConfig(
            etcd_endpoint=etcd_process.endpoint,
            state_dir=tmp_path / "state",
            identity="no-archive",
            cycle_interval_s=0.1,
            history=HistorySettings(archive=False),
            archive_idle_s=0.1,
        )
    )
    await server.start()
    try:
        # Several of the archiver's passes, had it been on: it starts once the leader's first pass
        # is done, and passes every 0.1 s while the leader makes five more.
        async def first_pass_done() -> bool:
            return server.first_pass_done

        await eventually(first_pass_done, timeout_s=30, what="the leader's first pass")
        after_first = len(passes)

        async def passes_made() -> bool:
            return len(passes) >= after_first + PASSES_AFTER_THE_FIRST

        await eventually(passes_made, timeout_s=30, what=f"{PASSES_AFTER_THE_FIRST} more leader passes")
        assert server.metrics.is_leader._value.get() == 1
        assert server.history is not None
        assert server.history.counts().jobs == 0
    finally:
        await server.stop()
    assert [kv.key for kv in (await etcd_kv.range_prefix(JOBS)).kvs] == [JOBS + b"old"]
