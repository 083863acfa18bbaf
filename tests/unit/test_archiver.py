"""Which jobs the archiver takes, exactly, and the `history:` knobs that drive it."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from federation.errors import InvalidSpec
from federation.history.config import HistorySettings, parse_history
from federation.history.model import UsageQuery, UsageRow
from federation.history.sql_store import SqlHistoryStore
from federation.ledger.usage import TenantUsage
from federation.scheduling.archived_usage import ArchivedUsage
from federation.scheduling.archiver import due_jobs, ended_at_s, named_tails, tail_reads
from federation.store.archive_txn import batches
from federation.store.job_store import Stored
from federation.store.jobs import JobRecord, PhaseEvent
from federation.store.kv import Delete, KvError, Txn, check_batch_shape
from placement.model import GpuType, JobPhase, TenantId
from tests.conftest import build_job
from tests.history_builders import an_archived_job

NOW = 1_000_000.0
HOUR = 3600.0


def a_job(job_id: str, phase: JobPhase, ended_at_s: float | None) -> Stored[JobRecord]:
    events: tuple[PhaseEvent, ...] = (PhaseEvent(JobPhase.QUEUED, 10.0, 1),)
    if ended_at_s is not None:
        events += (PhaseEvent(phase, ended_at_s, 1),)
    return Stored(replace(build_job(job_id), phase=phase, events=events), 1)


@pytest.mark.parametrize(
    ("jobs", "due"),
    [
        pytest.param([], [], id="nothing"),
        pytest.param([a_job("a", JobPhase.SUCCEEDED, NOW - HOUR - 1)], ["a"], id="ended-over-an-hour-ago"),
        pytest.param([a_job("a", JobPhase.SUCCEEDED, NOW - HOUR)], [], id="ended-exactly-an-hour-ago"),
        pytest.param([a_job("a", JobPhase.FAILED, NOW - 60)], [], id="ended-a-minute-ago"),
        pytest.param(
            [a_job("q", JobPhase.QUEUED, None), a_job("r", JobPhase.RUNNING, NOW - 5 * HOUR)],
            [],
            id="live-jobs-never-however-old",
        ),
        pytest.param(
            [
                a_job("late", JobPhase.CANCELLED, NOW - 2 * HOUR),
                a_job("b", JobPhase.FAILED, NOW - 3 * HOUR),
                a_job("a", JobPhase.SUCCEEDED, NOW - 3 * HOUR),
                a_job("recent", JobPhase.SUCCEEDED, NOW - 10),
                a_job("run", JobPhase.RUNNING, NOW - 9 * HOUR),
            ],
            ["a", "b", "late"],
            id="oldest-end-first-ties-by-id",
        ),
    ],
)
def test_due_jobs(jobs: list[Stored[JobRecord]], due: list[str]) -> None:
    assert [s.value.job_id for s in due_jobs(jobs, now_s=NOW, retain_s=HOUR)] == due


def test_an_ended_job_ended_at_its_last_event() -> None:
    job = a_job("a", JobPhase.SUCCEEDED, 500.0).value
    assert ended_at_s(job) == 500.0
    # No events at all (never written so, but read safely): its submission time.
    assert ended_at_s(replace(job, events=())) == job.submitted_at_s


def test_retain_zero_takes_every_ended_job() -> None:
    jobs = [a_job("a", JobPhase.SUCCEEDED, NOW - 0.5), a_job("q", JobPhase.QUEUED, None)]
    assert [s.value.job_id for s in due_jobs(jobs, now_s=NOW, retain_s=0.0)] == ["a"]


def test_archive_settings_default_and_parse() -> None:
    assert parse_history({}) == HistorySettings()
    assert HistorySettings().archive is True
    got = parse_history(
        {"history": {"archive": False, "archiveBatch": 50, "archiveRatePerS": 20, "retainInEtcd": "2h"}}
    )
    assert (got.archive, got.archive_batch, got.archive_rate_per_s, got.retain_in_etcd_s) == (
        False,
        50,
        20.0,
        7200.0,
    )


@pytest.mark.parametrize(
    ("section", "field"),
    [
        pytest.param({"archive": "yes"}, "history.archive", id="archive-not-a-bool"),
        pytest.param({"archiveBatch": 0}, "history.archiveBatch", id="batch-zero"),
        pytest.param({"archiveBatch": 129}, "history.archiveBatch", id="batch-over-one-etcd-request"),
        pytest.param({"archiveRatePerS": 0}, "history.archiveRatePerS", id="rate-zero"),
        pytest.param({"archiveRatePerS": "fast"}, "history.archiveRatePerS", id="rate-not-a-number"),
    ],
)
def test_bad_archive_settings_name_the_field(section: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidSpec) as error:
        parse_history({"history": section})
    assert error.value.field == field


def test_archived_hours_still_count_against_budgets_and_in_fair_share(tmp_path: Path) -> None:
    """What the archiver moved to SQL is added to etcd's usage: this month's hours up the tenant
    tree, the decayed history per leaf tenant; last month's only in the decayed history."""
    now = datetime(2026, 11, 20, 12, tzinfo=UTC).timestamp()
    this_month = now - 5 * 86_400.0
    last_month = datetime(2026, 10, 30, 12, tzinfo=UTC).timestamp()
    store = SqlHistoryStore.open(f"sqlite:///{tmp_path / 'history.sqlite3'}")
    try:
        store.write_jobs(
            [
                an_archived_job("a", tenant="team", submitted_at_s=this_month),
                an_archived_job("b", tenant="team", submitted_at_s=last_month),
            ]
        )
        usage = ArchivedUsage(store)
        live = {TenantId("team"): TenantUsage(2.0, ((GpuType("H100"), 1.0),))}
        asyncio.run(usage.refresh(now, half_life_h=24.0))
        got = usage.add_to(live, now_s=now, half_life_h=24.0, parents={TenantId("team"): TenantId("org")})
    finally:
        store.close()
    # Each archived job ran 8 GPUs for an hour.
    assert got[TenantId("team")].month_gpu_hours == pytest.approx(2.0 + 8.0)
    assert got[TenantId("org")].month_gpu_hours == pytest.approx(8.0)
    ((gpu, decayed),) = got[TenantId("team")].decayed_gpu_hours
    assert gpu == "H100"
    # Five days back at a one-day half-life weighs 1/32 (the day's middle is used: within a few %),
    # three weeks back next to nothing.
    assert decayed == pytest.approx(1.0 + 8.0 / 32, rel=0.05)
    assert got[TenantId("org")].decayed_gpu_hours == ()


_removals = itertools.count()


def _removal(ops: int) -> Txn:
    n = next(_removals)
    return Txn((), tuple(Delete(f"/k/{n}/{i}".encode()) for i in range(ops)))


@pytest.mark.parametrize(
    ("sizes", "groups"),
    [
        pytest.param([], [], id="none"),
        pytest.param([5] * 100, [100], id="a hundred small ones share one request"),
        pytest.param([28] * 100, [100], id="100 nested leave each 28 ops"),
        pytest.param([29] * 100, [99, 1], id="29 ops each: 99 share, one waits"),
        pytest.param([127, 127], [1, 1], id="the largest go alone"),
        pytest.param([5] * 10 + [120, 5], [10, 2], id="a wide one starts a request of its own"),
    ],
)
def test_removals_are_cut_into_requests_etcd_takes(sizes: list[int], groups: list[int]) -> None:
    cut = batches([_removal(n) for n in sizes])
    assert [len(g) for g in cut] == groups
    for g in cut:
        check_batch_shape(g)  # etcd's own rule (as MemoryKv applies it): none refused


def test_etcds_nested_op_rule_is_applied_by_the_shape_check() -> None:
    with pytest.raises(KvError, match="more than 28 ops"):
        check_batch_shape([_removal(29) for _ in range(100)])


def test_tails_are_named_by_their_summaries_and_read_in_bounded_parts() -> None:
    summary = {
        "kept_at_s": 5.0,
        "replicas": [
            {"task": "master", "replica": 0, "size_bytes": 1024 * 1024},
            {"task": "worker", "replica": 3, "size_bytes": 1024 * 1024},
            {"task": "worker", "replica": 4, "size_bytes": 10},
        ],
    }
    tails = named_tails("j1", {1: json.dumps(summary).encode(), 2: b"not json"})
    assert [(t.key, t.kept_at_s) for t in tails] == [
        (b"/gpufed/logs/j1/1/master-0", 5.0),
        (b"/gpufed/logs/j1/1/worker-3", 5.0),
        (b"/gpufed/logs/j1/1/worker-4", 5.0),
    ]
    assert [[t.replica for t in part] for part in tail_reads(tails)] == [[0, 3], [4]]


def test_the_first_read_started_while_listing_is_the_one_the_first_cycle_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarting server starts the archived usage's first read while it lists etcd
    (`ArchivedUsage.refresh_if_due` on a usage never read); the leader's first cycle waits for that read instead of querying
    again, and reads anew only if the half-life it plans with is not the one read for."""
    now = datetime(2026, 11, 20, 12, tzinfo=UTC).timestamp()
    store = SqlHistoryStore.open(f"sqlite:///{tmp_path / 'history.sqlite3'}")
    queries: list[float] = []
    original = store.usage
    # The first read is held on its worker thread until the first cycle is waiting for it.
    first_read_started = threading.Event()
    first_cycle_waits = threading.Event()

    def counted(query: UsageQuery) -> list[UsageRow]:
        queries.append(query.since_s)
        if len(queries) == 1:
            first_read_started.set()
            # Bounded, so that a cycle that never waits fails the asserts below instead of hanging.
            first_cycle_waits.wait(timeout=10)
        return original(query)

    monkeypatch.setattr(store, "usage", counted)

    async def scenario() -> None:
        usage = ArchivedUsage(store)
        usage.refresh_if_due(now, 24.0)
        usage.refresh_if_due(now, 24.0)  # one read in flight at a time
        first_cycle = asyncio.create_task(usage.read_once(now + 1.0, 24.0))
        assert await asyncio.to_thread(first_read_started.wait, 10), "the prefetch never read"
        assert not first_cycle.done(), "the first cycle went on without the read in flight"
        first_cycle_waits.set()
        await first_cycle
        assert len(queries) == 1
        assert not usage.never_read
        await usage.read_once(now + 2.0, 24.0)
        assert len(queries) == 1
        await usage.read_once(now + 3.0, 72.0)  # settings changed between the prefetch and the cycle
        assert len(queries) == 2
        assert queries[1] < queries[0]  # eight 3-day half-lives reach back before the month
        await usage.close()

    try:
        store.write_jobs([an_archived_job("a", tenant="team", submitted_at_s=now - 86_400.0)])
        asyncio.run(scenario())
    finally:
        store.close()
