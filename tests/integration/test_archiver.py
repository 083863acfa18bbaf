"""The archiver against a real etcd and a real history database (a SQLite file; PostgreSQL through
the process fixture): what a pass moves and what it leaves, a crash between the SQL write and the
etcd delete, a deposed leader's delete, a job changed after it was read, and the audit trail."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from sqlalchemy import event, text

from federation.datasets.outputs import OutputRecord, OutputRecords, OutputState
from federation.errors import NotLeader, StoreUnavailable
from federation.history.config import HistorySettings
from federation.history.engine import DEFAULT_FILE
from federation.history.sql_store import SqlHistoryStore
from federation.joblogs.archive import PREFIX as LOGS_PREFIX
from federation.joblogs.archive import KeptReplica, LogArchive, LogsSettings, replica_key
from federation.ledger.cache import LedgerCache
from federation.runtime.config import FederationConfig
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.history_wiring import open_history
from federation.scheduling.archiver import OUTPUT_HOLD_S, Archiver, summary_key
from federation.scheduling.leader import LeaderElection
from federation.security.tokens import AUDIT, AuditEvent, SecurityStore
from federation.spec.jobspec import OutputSpec
from federation.store.intervals import LEDGER_PREFIX, LedgerInterval, interval_to_dict, ledger_key
from federation.store.job_cache import JobCache
from federation.store.job_store import IDEM, JOBS, WAITS, Fence, KvStore, job_key
from federation.store.jobs import JobPlacement, JobRecord, PhaseEvent
from federation.store.kv import KeyValue, Txn, TxnResult
from federation.store.kv_etcd import EtcdKv
from placement.model import CapacityKind, ClusterName, GpuType, JobPhase, TenantId
from placement.model_plan import WaitCode, WaitReason
from tests.conftest import build_job
from tests.etcdctl import etcdctl
from tests.history_builders import a_finished_replica, a_kept_attempt, an_interval, fresh_dsn

pytestmark = pytest.mark.integration

NOW = 2_000_000.0
HOUR = 3600.0
OLD = NOW - 2 * HOUR
RECENT = NOW - 60.0


async def seed_ended(
    store: KvStore,
    job_id: str,
    *,
    ended_at_s: float,
    tenant: str = "t1",
    phase: JobPhase = JobPhase.SUCCEEDED,
    attempts: int = 1,
    outputs: tuple[OutputSpec, ...] = (),
) -> int:
    """An ended job as the reconciler leaves it: record, one closed interval per attempt, the wait
    reasons of its last wait, its attempts' kept summaries and its idempotency key. Returns the
    revision of its last write."""
    queued = build_job(job_id, tenant=tenant)
    if outputs:
        queued = replace(queued, spec=replace(queued.spec, outputs=outputs))
    stored, _ = await store.create_job(queued, idempotency_key=f"key-{job_id}", manifest_digest="d")
    await store.put_wait_reasons(
        queued.job_id,
        [WaitReason(WaitCode.TENANT_CAP_REACHED, "cap", tenant=TenantId(tenant), at_s=1001.0)],
    )
    events = [PhaseEvent(JobPhase.QUEUED, 1000.0, 1)]
    intervals: list[LedgerInterval] = []
    for a in range(1, attempts + 1):
        start = ended_at_s - 600.0 * (attempts - a + 1)
        end = start + 500.0
        events.append(PhaseEvent(JobPhase.RUNNING, start, a))
        intervals.append(an_interval(job_id, a, start_s=start, end_s=end if a < attempts else ended_at_s))
        await store.kv.put(summary_key(job_id, a), json.dumps({"attempt": a, "outcome": "done"}).encode())
    events.append(PhaseEvent(phase, ended_at_s, attempts, "done"))
    ended = replace(
        queued,
        phase=phase,
        attempt=attempts,
        placement=JobPlacement(ClusterName("onprem"), GpuType("H100"), CapacityKind.ON_DEMAND, 2.0),
        events=tuple(events),
    )
    revision = await store.commit([(ended, stored.mod_revision)], ledger=intervals)
    assert revision is not None
    return revision


def tail_bytes(job_id: str, attempt: int, task: str, replica: int) -> bytes:
    """A tail no text column would keep: stamped lines, a NUL, invalid UTF-8, and its own name."""
    return (
        f"2026-11-27T10:00:00Z {job_id} attempt {attempt} {task}-{replica}\n".encode()
        + bytes(range(256))
        + b"\x00\xc3\x28 no newline"
    )


async def seed_tails(
    kv: EtcdKv, job_id: str, attempt: int, replicas: int, *, kept_at_s: float = OLD
) -> dict[tuple[int, str, int], bytes]:
    """An attempt kept as `joblogs` keeps one (under its lease): a master and workers, a tail each."""
    slots = [("master", 0)] + [("worker", i) for i in range(replicas - 1)]
    logs = {(task, i): tail_bytes(job_id, attempt, task, i) for task, i in slots}
    state = a_finished_replica(f"{job_id}-pod", "worker", 0, finished_at_s=kept_at_s)
    kept = a_kept_attempt(
        attempt,
        tuple(KeptReplica(t, i, state, len(data)) for (t, i), data in logs.items()),
        started_at_s=kept_at_s - 60,
        finished_at_s=kept_at_s,
    )
    await LogArchive(kv, LogsSettings()).keep(job_id, kept, logs)
    return {(attempt, t, i): data for (t, i), data in logs.items()}


def sql_tails(history: SqlHistoryStore, job_id: str, attempts: int) -> dict[tuple[int, str, int], bytes]:
    return {
        (k.attempt, k.task, k.replica): k.data
        for a in range(1, attempts + 1)
        for k in history.kept_logs(build_job(job_id).job_id, a)
    }


def etcdctl_keys(endpoint: str, prefix: str) -> list[str]:
    """etcd's own account of the keys under a prefix, from etcdctl (not our client)."""
    out = etcdctl(endpoint, "get", "--prefix", "--keys-only", prefix).stdout
    return [line for line in out.splitlines() if line]


async def seed_running(store: KvStore, job_id: str, *, started_at_s: float) -> int:
    """A running job with its interval open."""
    queued = build_job(job_id)
    stored, _ = await store.create_job(queued, idempotency_key=f"key-{job_id}", manifest_digest="d")
    running = replace(
        queued,
        phase=JobPhase.RUNNING,
        placement=JobPlacement(ClusterName("onprem"), GpuType("H100"), CapacityKind.ON_DEMAND, 2.0),
        events=(PhaseEvent(JobPhase.QUEUED, 1000.0, 1), PhaseEvent(JobPhase.RUNNING, started_at_s, 1)),
    )
    interval = replace(an_interval(job_id, start_s=started_at_s, end_s=0.0), end_s=None, ended=None)
    revision = await store.commit([(running, stored.mod_revision)], ledger=[interval])
    assert revision is not None
    return revision


async def etcd_keys(kv: EtcdKv, prefix: bytes) -> list[bytes]:
    return [item.key for item in (await kv.range_prefix(prefix)).kvs]


@dataclass
class World:
    kv: EtcdKv
    store: KvStore
    cache: JobCache
    history: SqlHistoryStore
    election: LeaderElection
    fence: Fence

    def archiver(
        self, kv: EtcdKv | None = None, *, logs_retain_s: float | None = None, **settings: object
    ) -> Archiver:
        return Archiver(
            kv=kv or self.kv,
            cache=self.cache,
            history=self.history,
            settings=HistorySettings(retain_in_etcd_s=HOUR, archive_rate_per_s=10_000.0, **settings),  # type: ignore[arg-type]
            clock=lambda: NOW,
            logs_retain_s=logs_retain_s,
        )

    async def synced(self, revision: int) -> None:
        assert await self.cache.wait_for_revision(revision)


@pytest.fixture
def history(tmp_path: Path) -> Iterator[SqlHistoryStore]:
    store = SqlHistoryStore.open(f"sqlite:///{tmp_path / 'history.sqlite3'}")
    yield store
    store.close()


async def _world(kv: EtcdKv, history: SqlHistoryStore) -> AsyncIterator[World]:
    store = KvStore(kv)
    cache = JobCache(store)
    await cache.start()
    election = LeaderElection(kv, "archiver-test", ttl_s=5)
    fence = await election.acquire()
    try:
        yield World(kv, store, cache, history, election, fence)
    finally:
        await election.close()
        await cache.stop()


@pytest.fixture
async def world(etcd_kv: EtcdKv, history: SqlHistoryStore) -> AsyncIterator[World]:
    async for w in _world(etcd_kv, history):
        yield w


async def _a_pass_moves_ended_jobs(w: World, endpoint: str) -> None:
    await seed_ended(w.store, "old-ok", ended_at_s=OLD, attempts=2)
    # Kept tails: attempt 1 of a gang of three, attempt 2 of a gang of two (over the seeded summaries).
    tails = await seed_tails(w.kv, "old-ok", 1, 3) | await seed_tails(w.kv, "old-ok", 2, 2)
    await seed_ended(w.store, "old-failed", ended_at_s=OLD - 10, phase=JobPhase.FAILED, tenant="t2")
    await seed_ended(w.store, "recent", ended_at_s=RECENT)
    await seed_tails(w.kv, "recent", 1, 2, kept_at_s=RECENT)
    last = await seed_running(w.store, "running", started_at_s=OLD - HOUR)
    await w.synced(last)

    report = await w.archiver().archive_once(w.fence)

    assert (report.jobs_due, report.jobs_archived, report.jobs_left, report.tails_archived) == (2, 2, 0, 5)
    # In SQL: the two old jobs whole, with their attempts, intervals, wait and tails byte for byte.
    assert sql_tails(w.history, "old-ok", 2) == tails
    assert w.history.counts().kept_logs == 5
    counts = w.history.counts()
    assert (counts.jobs, counts.intervals) == (2, 3)
    kept = w.history.get_job(build_job("old-ok").job_id)
    assert kept is not None
    assert kept.record.phase is JobPhase.SUCCEEDED
    assert [a.attempt for a in kept.attempts] == [1, 2]
    assert [iv.attempt for iv in kept.intervals] == [1, 2]
    assert [r.code for w_ in kept.waits for r in w_.reasons] == [WaitCode.TENANT_CAP_REACHED]
    assert w.history.get_job(build_job("recent").job_id) is None
    assert w.history.get_job(build_job("running").job_id) is None
    # Gone from etcd: record, intervals, waits, idempotency keys, kept summaries and tails. Left: the
    # recent and running jobs with all of theirs.
    assert await etcd_keys(w.kv, JOBS) == [job_key("recent"), job_key("running")]
    assert await etcd_keys(w.kv, LEDGER_PREFIX) == [ledger_key("recent", 1), ledger_key("running", 1)]
    assert await etcd_keys(w.kv, WAITS) == [WAITS + b"recent"]
    assert len(await etcd_keys(w.kv, IDEM)) == 2
    recent_logs = [summary_key("recent", 1), replica_key("recent", 1, "master", 0)]
    recent_logs.append(replica_key("recent", 1, "worker", 0))
    assert sorted(await etcd_keys(w.kv, LOGS_PREFIX)) == sorted(recent_logs)
    # And by etcd's own account.
    assert sorted(etcdctl_keys(endpoint, LOGS_PREFIX.decode())) == sorted(k.decode() for k in recent_logs)
    # And from the cache, which follows etcd's watch.
    assert w.cache.get(build_job("old-ok").job_id) is None
    # A second pass finds nothing more to do.
    again = await w.archiver().archive_once(w.fence)
    assert (again.jobs_due, again.jobs_archived) == (0, 0)


async def test_a_pass_moves_ended_jobs_and_leaves_running_and_recent_ones(
    world: World, etcd_process: EtcdProcess
) -> None:
    await _a_pass_moves_ended_jobs(world, etcd_process.endpoint)


async def test_a_pass_on_postgresql(
    etcd_kv: EtcdKv, etcd_process: EtcdProcess, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = SqlHistoryStore.open(fresh_dsn("postgres", tmp_path, request))
    try:
        async for w in _world(etcd_kv, store):
            await _a_pass_moves_ended_jobs(w, etcd_process.endpoint)
    finally:
        store.close()


class FailingDeletes:
    """etcd as the archiver sees it, with its deletes failing as a crash before them would leave
    things: SQL written, etcd untouched."""

    def __init__(self, kv: EtcdKv) -> None:
        self._kv = kv

    def __getattr__(self, name: str) -> object:
        return getattr(self._kv, name)

    async def txn_many(self, txns: Sequence[Txn]) -> list[TxnResult]:
        raise StoreUnavailable("etcd went away before the delete")


async def test_a_crash_between_the_sql_write_and_the_etcd_delete_neither_loses_nor_doubles(
    world: World,
) -> None:
    await _a_crash_between_write_and_delete(world)


async def test_a_crash_between_write_and_delete_on_postgresql(
    etcd_kv: EtcdKv, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = SqlHistoryStore.open(fresh_dsn("postgres", tmp_path, request))
    try:
        async for w in _world(etcd_kv, store):
            await _a_crash_between_write_and_delete(w)
    finally:
        store.close()


async def _a_crash_between_write_and_delete(world: World) -> None:
    tails: dict[str, dict[tuple[int, str, int], bytes]] = {}
    for i in range(5):
        last = await seed_ended(world.store, f"j{i}", ended_at_s=OLD + i, attempts=1 + i % 2)
        tails[f"j{i}"] = {}
        for a in range(1, 2 + i % 2):
            tails[f"j{i}"] |= await seed_tails(world.kv, f"j{i}", a, 2)
    await world.synced(last)
    logs_before = await etcd_keys(world.kv, LOGS_PREFIX)

    with pytest.raises(StoreUnavailable):
        await world.archiver(FailingDeletes(world.kv)).archive_once(world.fence)  # type: ignore[arg-type]
    # In both stores now, tails included.
    assert (world.history.counts().jobs, world.history.counts().intervals) == (5, 7)
    assert world.history.counts().kept_logs == 14
    assert len(await etcd_keys(world.kv, JOBS)) == 5
    assert await etcd_keys(world.kv, LOGS_PREFIX) == logs_before

    report = await world.archiver().archive_once(world.fence)

    assert report.jobs_archived == 5
    assert (world.history.counts().jobs, world.history.counts().intervals) == (5, 7)
    # Neither lost nor doubled, byte for byte.
    assert world.history.counts().kept_logs == 14
    for i in range(5):
        assert sql_tails(world.history, f"j{i}", 2) == tails[f"j{i}"]
    assert await etcd_keys(world.kv, JOBS) == []
    assert await etcd_keys(world.kv, LEDGER_PREFIX) == []
    assert await etcd_keys(world.kv, LOGS_PREFIX) == []


async def test_a_deposed_leaders_delete_fails(world: World) -> None:
    last = await seed_ended(world.store, "j1", ended_at_s=OLD)
    await world.synced(last)
    old_fence = world.fence
    await world.election.resign()
    successor = LeaderElection(world.kv, "successor", ttl_s=5)
    try:
        new_fence = await successor.acquire()
        with pytest.raises(NotLeader):
            await world.archiver().archive_once(old_fence)
        # Written to SQL (harmless: idempotent), but not deleted from etcd.
        assert await etcd_keys(world.kv, JOBS) == [job_key("j1")]
        assert await etcd_keys(world.kv, LEDGER_PREFIX) == [ledger_key("j1", 1)]
        # The new leader finishes the job.
        report = await world.archiver().archive_once(new_fence)
        assert report.jobs_archived == 1
        assert await etcd_keys(world.kv, JOBS) == []
        assert world.history.counts().jobs == 1
    finally:
        await successor.close()


class TouchBeforeDelete:
    """etcd, where someone rewrites a job between the archiver's read and its delete."""

    def __init__(self, kv: EtcdKv, store: KvStore, change: JobRecord | None) -> None:
        self._kv, self._store, self._change = kv, store, change

    def __getattr__(self, name: str) -> object:
        return getattr(self._kv, name)

    async def txn_many(self, txns: Sequence[Txn]) -> list[TxnResult]:
        current = await self._store.get_job(build_job("j1").job_id)
        assert current is not None
        await self._store.commit([(self._change or current.value, current.mod_revision)])
        return await self._kv.txn_many(txns)


@pytest.mark.parametrize("changed", [False, True], ids=["rewritten-as-it-was", "rewritten-with-a-change"])
async def test_a_job_changed_after_it_was_read_is_not_deleted(world: World, changed: bool) -> None:
    last = await seed_ended(world.store, "j1", ended_at_s=OLD)
    await world.synced(last)
    current = await world.store.get_job(build_job("j1").job_id)
    assert current is not None
    change = replace(current.value, message="edited after the archive read it") if changed else None

    report = await world.archiver(TouchBeforeDelete(world.kv, world.store, change)).archive_once(world.fence)  # type: ignore[arg-type]

    assert (report.jobs_archived, report.jobs_left) == (0, 1)
    assert await etcd_keys(world.kv, JOBS) == [job_key("j1")]
    revision = (await world.kv.get(job_key("j1"))).mod_revision  # type: ignore[union-attr]
    await world.synced(revision)
    # Next pass: SQL already has the job. Deleted only if SQL holds it as etcd does now.
    again = await world.archiver().archive_once(world.fence)
    if changed:
        assert (again.jobs_archived, again.jobs_left) == (0, 1)
        assert await etcd_keys(world.kv, JOBS) == [job_key("j1")]
    else:
        assert again.jobs_archived == 1
        assert await etcd_keys(world.kv, JOBS) == []
    assert world.history.counts().jobs == 1


async def test_audit_records_older_than_the_retention_move_to_sql(world: World) -> None:
    security = SecurityStore(world.kv)
    for i in range(7):
        await security.append_audit(AuditEvent(OLD + i, "root", "admin", "tenant.put", f"t{i}"))
    await security.append_audit(AuditEvent(RECENT, "root", "admin", "token.issue", "alice"))

    report = await world.archiver(archive_batch=3).archive_once(world.fence)

    assert report.audit_archived == 7
    archived = world.history.list_audit()
    assert [a.target for a in archived] == [f"t{i}" for i in range(7)]
    assert archived[0].at_s == OLD
    left = await etcd_keys(world.kv, AUDIT)
    assert len(left) == 1
    assert [e.action for e in await security.list_audit()] == ["token.issue"]
    # Again: nothing due, nothing doubled.
    assert (await world.archiver().archive_once(world.fence)).audit_archived == 0
    assert world.history.counts().audit == 7


async def test_a_deposed_leader_archives_no_audit_record_away(world: World) -> None:
    security = SecurityStore(world.kv)
    await security.append_audit(AuditEvent(OLD, "root", "admin", "tenant.put", "t1"))
    old_fence = world.fence
    await world.election.resign()
    successor = LeaderElection(world.kv, "successor", ttl_s=5)
    try:
        await successor.acquire()
        with pytest.raises(NotLeader):
            await world.archiver().archive_once(old_fence)
        assert len(await etcd_keys(world.kv, AUDIT)) == 1
    finally:
        await successor.close()


async def test_the_ledger_cache_forgets_archived_intervals_and_keeps_the_rest(world: World) -> None:
    """The cache holds etcd's part of the ledger: once archived, an interval is SQL's alone, so reports
    and budgets that add the two never count it twice (after the delete)."""
    ledger = LedgerCache(world.store)
    await ledger.start()
    try:
        await seed_ended(world.store, "old", ended_at_s=OLD, attempts=2)
        last = await seed_running(world.store, "running", started_at_s=OLD)
        await world.synced(last)
        for _ in range(50):
            if len(ledger.intervals()) == 3:
                break
            await asyncio.sleep(0.05)
        await world.archiver().archive_once(world.fence)
        for _ in range(100):
            if len(ledger.intervals()) == 1:
                break
            await asyncio.sleep(0.05)
        assert [(iv.job_id, iv.end_s) for iv in ledger.intervals()] == [("running", None)]
    finally:
        await ledger.stop()


async def test_open_history_takes_the_configs_database_else_sqlite_under_the_state_dir(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    default = open_history(FederationConfig(tenants=(), users=(), clusters=()), state)
    try:
        assert default.engine.url.database == str((state / DEFAULT_FILE).resolve())
    finally:
        default.close()
    monkeypatch.setenv("GPUFED_TEST_HISTORY_DSN", fresh_dsn("postgres", tmp_path, request))
    postgres = open_history(HistorySettings(dsn_env="GPUFED_TEST_HISTORY_DSN"), state)
    try:
        assert postgres.engine.dialect.name == "postgresql"
        assert postgres.counts().jobs == 0
    finally:
        postgres.close()


async def test_a_record_the_history_refuses_stays_in_etcd_and_holds_up_no_other(world: World) -> None:
    last = await seed_ended(world.store, "a-bad", ended_at_s=OLD - 100)
    await seed_ended(world.store, "b-good", ended_at_s=OLD)
    # An interval under a-bad's key that names another job: ArchivedJob refuses it.
    wrong = an_interval("someone-else", start_s=OLD - 700, end_s=OLD - 100)
    await world.kv.put(ledger_key("a-bad", 1), json.dumps(interval_to_dict(wrong)).encode())
    last = await seed_ended(world.store, "c-good", ended_at_s=OLD + 1)
    await world.synced(last)

    report = await world.archiver(archive_batch=3).archive_once(world.fence)

    assert (report.jobs_archived, report.jobs_left) == (2, 1)
    assert await etcd_keys(world.kv, JOBS) == [job_key("a-bad")]
    assert world.history.get_job(build_job("a-bad").job_id) is None


async def test_a_tail_rewritten_after_a_crashed_pass_wrote_it_is_not_deleted(world: World) -> None:
    last = await seed_ended(world.store, "j1", ended_at_s=OLD)
    await seed_tails(world.kv, "j1", 1, 2)
    await world.synced(last)
    with pytest.raises(StoreUnavailable):
        await world.archiver(FailingDeletes(world.kv)).archive_once(world.fence)  # type: ignore[arg-type]
    # SQL holds the first bytes; etcd now holds others under the same key.
    await world.kv.put(replica_key("j1", 1, "worker", 0), b"other bytes")

    report = await world.archiver().archive_once(world.fence)

    assert (report.jobs_archived, report.jobs_left) == (0, 1)
    assert await etcd_keys(world.kv, JOBS) == [job_key("j1")]
    assert replica_key("j1", 1, "worker", 0) in await etcd_keys(world.kv, LOGS_PREFIX)
    assert sql_tails(world.history, "j1", 1)[(1, "worker", 0)] == tail_bytes("j1", 1, "worker", 0)


async def test_jobs_with_many_tails_share_requests_within_etcds_op_limits(world: World) -> None:
    """A removal of 115 ops cannot be nested with others (etcd gives each nested transaction the
    limit less the request's own count): each goes alone, and all go."""
    for i in range(6):
        last = await seed_ended(world.store, f"gang{i}", ended_at_s=OLD + i)
        await seed_tails(world.kv, f"gang{i}", 1, 110)
    for i in range(30):
        last = await seed_ended(world.store, f"small{i:02d}", ended_at_s=OLD + 10 + i)
        await seed_tails(world.kv, f"small{i:02d}", 1, 4)
    await world.synced(last)

    report = await world.archiver().archive_once(world.fence)

    assert (report.jobs_archived, report.jobs_left) == (36, 0)
    assert report.tails_archived == 6 * 110 + 30 * 4
    assert world.history.counts().kept_logs == 6 * 110 + 30 * 4
    assert await etcd_keys(world.kv, JOBS) == []
    assert await etcd_keys(world.kv, LOGS_PREFIX) == []


async def test_a_gang_with_more_tails_than_one_removal_takes_leaves_them_under_their_lease(
    world: World,
) -> None:
    last = await seed_ended(world.store, "huge", ended_at_s=OLD)
    await seed_tails(world.kv, "huge", 1, 130)
    await world.synced(last)

    report = await world.archiver().archive_once(world.fence)

    # The job goes (summary included); its 130 tails stay in etcd, where readers still find them
    # until their lease ends.
    assert (report.jobs_archived, report.tails_archived) == (1, 0)
    assert await etcd_keys(world.kv, JOBS) == []
    left = await etcd_keys(world.kv, LOGS_PREFIX)
    assert len(left) == 130
    assert summary_key("huge", 1) not in left
    assert world.history.counts().kept_logs == 0
    kept = world.history.get_job(build_job("huge").job_id)
    assert kept is not None
    assert len(kept.attempts[0].summary["replicas"]) == 130


async def test_tails_past_the_logs_retention_are_pruned_from_sql_in_batches(world: World) -> None:
    week = 168 * HOUR
    old = await seed_ended(world.store, "expired", ended_at_s=OLD)
    await seed_tails(world.kv, "expired", 1, 7, kept_at_s=NOW - week - 10)
    last = await seed_ended(world.store, "kept", ended_at_s=OLD + 1)
    await seed_tails(world.kv, "kept", 1, 2, kept_at_s=NOW - week + 10)
    await world.synced(max(old, last))
    # Moved first (nothing pruned: this archiver has no logs retention).
    assert (await world.archiver().archive_once(world.fence)).tails_archived == 9
    assert world.history.counts().kept_logs == 9

    report = await world.archiver(logs_retain_s=week, archive_batch=3).archive_once(world.fence)

    assert report.tails_pruned == 7
    assert world.history.counts().kept_logs == 2
    assert set(sql_tails(world.history, "kept", 1)) == {(1, "master", 0), (1, "worker", 0)}
    assert world.history.counts().jobs == 2


async def test_a_pass_over_jobs_already_in_sql_checks_the_batch_in_two_queries(world: World) -> None:
    """Jobs a crashed pass wrote are checked against SQL before they leave etcd: the batch is read
    at once (records and tails), not a `get_job` and a `kept_logs` per job and attempt. A record
    SQL holds in another form (another build's JSON: other spacing, other key order) is the same
    record and goes; one that differs stays (test_a_job_changed_after_it_was_read_is_not_deleted)."""
    for i in range(20):
        last = await seed_ended(world.store, f"j{i:02d}", ended_at_s=OLD + i, attempts=1 + i % 2)
        await seed_tails(world.kv, f"j{i:02d}", 1, 2)
    await world.synced(last)
    with pytest.raises(StoreUnavailable):
        await world.archiver(FailingDeletes(world.kv)).archive_once(world.fence)  # type: ignore[arg-type]
    with world.history.engine.begin() as conn:
        stored = conn.execute(text("SELECT record_json FROM history_jobs WHERE job_id = 'j03'")).scalar_one()
        other_form = json.dumps(dict(reversed(list(json.loads(stored).items()))), indent=2)
        conn.execute(text("UPDATE history_jobs SET record_json = :r WHERE job_id = 'j03'"), {"r": other_form})
    selects: list[str] = []

    def count(*args: object) -> None:
        if str(args[2]).lstrip().upper().startswith("SELECT"):
            selects.append(str(args[2]))

    event.listen(world.history.engine, "before_cursor_execute", count)
    try:
        report = await world.archiver().archive_once(world.fence)
    finally:
        event.remove(world.history.engine, "before_cursor_execute", count)

    assert (report.jobs_archived, report.jobs_left) == (20, 0)
    assert len(selects) == 2, selects
    assert await etcd_keys(world.kv, JOBS) == []
    assert await etcd_keys(world.kv, LOGS_PREFIX) == []
    assert world.history.counts().jobs == 20


async def test_a_succeeded_jobs_outputs_are_settled_before_it_leaves_etcd(world: World) -> None:
    """The outputs controller registers outputs of the succeeded jobs the job cache holds: a job
    archived first would never have its outputs registered. So a succeeded job with an output not
    yet registered or refused stays; a failed one (its output is never registered) goes; and past
    OUTPUT_HOLD_S one goes anyway, its output refused with the reason, for its owner to read."""
    w = world
    out = (OutputSpec(dataset="ckpt", path="runs/"),)
    await seed_ended(w.store, "waiting", ended_at_s=OLD, outputs=out)
    await seed_ended(w.store, "settled", ended_at_s=OLD, outputs=out)
    await seed_ended(w.store, "failed", ended_at_s=OLD, outputs=out, phase=JobPhase.FAILED)
    last = await seed_ended(w.store, "given-up", ended_at_s=OLD - OUTPUT_HOLD_S, outputs=out)
    records = OutputRecords(w.kv)
    await records.settle("settled", 0, OutputRecord(OutputState.REGISTERED, "t1/ckpt", "settled"), 0)
    await records.settle("waiting", 0, OutputRecord(OutputState.REGISTERING, "t1/ckpt", "waiting"), 0)
    await w.synced(last)

    report = await w.archiver().archive_once(w.fence)

    assert report.jobs_archived == 3
    assert await etcd_keys(w.kv, JOBS) == [job_key("waiting")]
    assert w.history.get_job(build_job("waiting").job_id) is None
    given_up = await records.get("given-up", 0)
    assert given_up is not None
    assert given_up.state is OutputState.REFUSED
    assert "archived" in given_up.reason
    registered = await records.get("settled", 0)
    assert registered is not None
    assert registered.state is OutputState.REGISTERED

    # Registered at last: the next pass takes it.
    _, read_at = await records.read("waiting", 0)
    await records.settle("waiting", 0, OutputRecord(OutputState.REGISTERED, "t1/ckpt", "waiting"), read_at)
    again = await w.archiver().archive_once(w.fence)
    assert again.jobs_archived == 1
    assert await etcd_keys(w.kv, JOBS) == []


class RegistersAfterTheRead:
    """etcd, where another server's registrar registers the job's output between the archiver's
    read of its record and the archiver's write of the refusal."""

    def __init__(self, kv: EtcdKv, key: bytes) -> None:
        self._kv, self._key, self.raced = kv, key, False

    def __getattr__(self, name: str) -> object:
        return getattr(self._kv, name)

    async def get(self, key: bytes) -> KeyValue | None:
        found = await self._kv.get(key)
        if key == self._key and not self.raced:
            self.raced = True
            records = OutputRecords(self._kv)
            done = OutputRecord(OutputState.REGISTERED, "t1/ckpt", "late", "onprem", "runs/late/a1/")
            await records.settle("late", 0, done, 0 if found is None else found.mod_revision)
        return found


async def test_a_refusal_never_overwrites_a_registration_made_after_the_archiver_read(world: World) -> None:
    """The registrars run on every server and the archiver on the leader: both settle the same
    record. A plain put let the archiver's "not registered before the job was archived" land over
    a version registered a moment before, so the registry held the version while its job said it
    was refused."""
    out = (OutputSpec(dataset="ckpt", path="runs/"),)
    last = await seed_ended(world.store, "late", ended_at_s=OLD - OUTPUT_HOLD_S, outputs=out)
    await world.synced(last)
    racing = RegistersAfterTheRead(world.kv, b"/gpufed/outputs/late/0")
    records = OutputRecords(world.kv)

    report = await world.archiver(racing).archive_once(world.fence)  # type: ignore[arg-type]

    assert racing.raced, "the registration did not land between the read and the write"
    settled = await records.get("late", 0)
    assert settled is not None
    assert settled.state is OutputState.REGISTERED, settled
    assert report.jobs_archived == 1
