"""Reads that span etcd and the history store (issue 19): GetJob, ListJobs, the finance reports and
ListAudit over jobs and records archived to SQL, through the real servicers, on a real etcd and a
real SQLite file (PostgreSQL too, through the fixture, for list paging and report equality).

Jobs are archived here the way the archiver does it, in its two steps: written to SQL
(`HistoryStore.write_jobs`, from the records and intervals read back from etcd), then deleted from
etcd. A test can stop between the two steps: that is the window in which a job is in both stores.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import event

from clusters.api import ReplicaState
from federation.api.admin import AdminService
from federation.api.logs import LogsService
from federation.api.reports import ReportService
from federation.api.service import JobService
from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CallRefused as Refused
from federation.datasets.check import DatasetCheck
from federation.datasets.registry import DatasetRegistry
from federation.history.config import HistorySettings
from federation.history.model import ArchivedAttempt, ArchivedAudit, ArchivedJob
from federation.history.sql_store import SqlHistoryStore
from federation.joblogs.archive import KeptReplica, LogArchive, LogsSettings
from federation.ledger.cache import LedgerCache
from federation.metrics import Metrics
from federation.runtime.server import TenantDirectory
from federation.scheduling.archiver import Archiver, PassReport
from federation.scheduling.leader import LeaderElection
from federation.scheduling.members import MemberClusters
from federation.security.auth import Authenticator
from federation.security.tokens import AUDIT, AuditEvent, SecurityStore
from federation.store.intervals import IntervalEnd, LedgerInterval, ledger_key
from federation.store.job_cache import JobCache
from federation.store.job_store import KvStore, job_key
from federation.store.jobs import JobPlacement, PhaseEvent
from federation.store.kv_etcd import EtcdKv
from federation.store.records import Role, TenantRecord, UserRecord
from placement.model import CapacityKind, ClusterName, GpuType, JobId, JobPhase, TenantId
from tests.conftest import build_job
from tests.history_builders import BACKENDS, a_finished_replica, a_kept_attempt, fresh_dsn, open_store
from tests.unit.job_service import as_user

NOW = 1_767_225_600.0 + 20 * 86400.0  # 2026-01-21 00:00 UTC: the reports' "now"
T0 = NOW - 15 * 86400.0  # the first job's submission, in this month and the one before's reach
# job id, tenant, user, cluster, GPU type, price: submitted six hours apart, each ran 5 h 20 min.
JOBS = [
    (f"j{i:02d}", ("vision", "nlp")[i % 3 == 2], ("alice", "carol", "bob")[i % 3], cluster, gpu, price)
    for i, (cluster, gpu, price) in enumerate(
        [("onprem", "H100", 2.0), ("gcp", "A100", 3.5), ("onprem", "A100", 1.25)] * 5
    )
]


def _interval(
    job_id: str, tenant: str, user: str, cluster: str, gpu: str, price: float, t: float
) -> LedgerInterval:
    return LedgerInterval(
        job_id=JobId(job_id),
        attempt=1,
        tenant=TenantId(tenant),
        user=user,
        cluster=ClusterName(cluster),
        provider="onprem" if cluster == "onprem" else "gcp",
        region="eu-west",
        gpu_type=GpuType(gpu),
        gpu_count=8,
        kind=CapacityKind.ON_DEMAND,
        start_s=t + 600.0,
        end_s=t + 600.0 + 5 * 3600.0 + 1200.0,
        usd_per_gpu_hour=price,
        ended=IntervalEnd.FINISHED,
        job_name=f"train-{job_id}",
    )


@dataclass
class World:
    kv: EtcdKv
    store: KvStore
    history: SqlHistoryStore
    cache: JobCache
    ledger: LedgerCache
    jobs: JobService
    reports: ReportService
    admin: AdminService
    security: SecurityStore

    async def archive(self, job_ids: list[str], *, delete: bool = True) -> None:
        """The archiver's two steps: write to SQL what etcd holds, then (unless `delete` is False:
        the window in which a job is in both stores) delete it from etcd."""
        listed, _ = await self.store.list_ledger()
        archived = []
        for job_id in job_ids:
            stored = await self.store.get_job(JobId(job_id))
            assert stored is not None
            record = stored.value
            intervals = tuple(iv for iv in listed if iv.job_id == job_id)
            summary = {
                "attempt": 1,
                "cluster": intervals[0].cluster,
                "gpu_type": intervals[0].gpu_type,
                "capacity_kind": "on_demand",
                "usd_per_gpu_hour": intervals[0].usd_per_gpu_hour,
                "started_at_s": intervals[0].start_s,
                "finished_at_s": intervals[0].end_s,
                "outcome": "SUCCEEDED",
                "reason": "",
                "kept_at_s": intervals[0].end_s,
                "note": "",
                "replicas": [],
            }
            archived.append(
                ArchivedJob(
                    record=record,
                    ended_at_s=record.events[-1].at_s,
                    attempts=(ArchivedAttempt(1, summary),),
                    intervals=intervals,
                )
            )
        assert self.history.write_jobs(archived) == len(archived)
        if delete:
            for job_id in job_ids:
                assert await self.kv.delete(job_key(job_id))
                assert await self.kv.delete(ledger_key(job_id, 1))
            await _until(lambda: all(self.cache.get(JobId(j)) is None for j in job_ids))

    async def list(self, who: str, **fields: Any) -> pb.ListJobsResponse:
        return await self.jobs.ListJobs(pb.ListJobsRequest(**fields), as_user(who))

    async def get(self, who: str, job_id: str) -> pb.Job:
        return await self.jobs.GetJob(pb.GetJobRequest(job_id=job_id), as_user(who))

    async def report(self, who: str = "fin", **fields: Any) -> str:
        request = pb.GetReportRequest(**{"format": "json", **fields})
        request.start.FromNanoseconds(int((NOW - 40 * 86400.0) * 1e9))
        request.end.FromNanoseconds(int(NOW * 1e9))
        reply = await self.reports.GetReport(request, as_user(who))
        return str(reply.content)

    async def focus(self, who: str = "fin") -> str:
        request = pb.ExportFocusRequest(format="csv")
        request.start.FromNanoseconds(int((NOW - 40 * 86400.0) * 1e9))
        reply = await self.reports.ExportFocus(request, as_user(who))
        return str(reply.content)


async def _until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def _world(kv: EtcdKv, history: SqlHistoryStore) -> AsyncIterator[World]:
    store = KvStore(kv)
    for name in ("vision", "nlp"):
        await store.put_tenant(TenantRecord(TenantId(name)))
    for user, tenant, role in [
        ("admin", "vision", Role.ADMIN),
        ("fin", "vision", Role.FINANCE),
        ("alice", "vision", Role.MEMBER),
        ("carol", "vision", Role.MEMBER),
        ("bob", "nlp", Role.MEMBER),
    ]:
        await store.put_user(UserRecord(user, TenantId(tenant), role))
        await store.put_token(user, user)
    for i, (job_id, tenant, user, cluster, gpu, price) in enumerate(JOBS):
        t = T0 + i * 6 * 3600.0
        iv = _interval(job_id, tenant, user, cluster, gpu, price, t)
        job = replace(build_job(job_id, tenant=tenant), user=user, submitted_at_s=t, queued_at_s=t)
        stored, _ = await store.create_job(job, idempotency_key=job_id, manifest_digest="d")
        ended = replace(
            job,
            phase=JobPhase.SUCCEEDED,
            placement=JobPlacement(ClusterName(cluster), GpuType(gpu), CapacityKind.ON_DEMAND, price),
            events=(
                PhaseEvent(JobPhase.QUEUED, t, 1),
                PhaseEvent(JobPhase.RUNNING, iv.start_s, 1),
                PhaseEvent(JobPhase.SUCCEEDED, iv.end_s or 0.0, 1, "done"),
            ),
        )
        assert await store.commit([(ended, stored.mod_revision)], ledger=[iv]) is not None
    # One interval still open: a running job, only ever in etcd.
    running = replace(build_job("live", tenant="vision"), user="alice", submitted_at_s=NOW - 7200.0)
    stored, _ = await store.create_job(running, idempotency_key="live", manifest_digest="d")
    open_iv = replace(
        _interval("live", "vision", "alice", "onprem", "H100", 2.0, NOW - 7800.0), end_s=None, ended=None
    )
    placed = replace(
        running,
        phase=JobPhase.RUNNING,
        placement=JobPlacement(ClusterName("onprem"), GpuType("H100"), CapacityKind.ON_DEMAND, 2.0),
    )
    revision = await store.commit([(placed, stored.mod_revision)], ledger=[open_iv])
    assert revision is not None
    security = SecurityStore(kv)
    for k in range(6):
        await security.append_audit(AuditEvent(T0 + k * 100.0, "admin", "admin", f"action_{k}", "vision"))
    cache = JobCache(store)
    await cache.start()
    assert await cache.wait_for_revision(revision)
    ledger = LedgerCache(store)
    await ledger.start()
    auth = Authenticator(store)
    metrics = Metrics()
    jobs = JobService(
        store=store,
        cache=cache,
        auth=auth,
        metrics=metrics,
        tenants=TenantDirectory(store),
        datasets=DatasetCheck(DatasetRegistry(kv)),
        history=history,
    )
    reports = ReportService(
        ledger=ledger, store=store, auth=auth, metrics=metrics, clock=lambda: NOW, history=history
    )
    admin = AdminService(
        store=store, security=security, cache=cache, auth=auth, metrics=metrics, history=history
    )
    try:
        yield World(kv, store, history, cache, ledger, jobs, reports, admin, security)
    finally:
        await ledger.stop()
        await cache.stop()


@pytest.fixture(params=BACKENDS)
def history(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlHistoryStore]:
    yield from open_store(fresh_dsn(request.param, tmp_path, request))


@pytest.fixture
def sqlite_history(tmp_path: Path) -> Iterator[SqlHistoryStore]:
    yield from open_store(f"sqlite:///{tmp_path / 'history.sqlite3'}")


@pytest.fixture
async def world(etcd_kv: EtcdKv, history: SqlHistoryStore) -> AsyncIterator[World]:
    async for w in _world(etcd_kv, history):
        yield w


@pytest.fixture
async def sqlite_world(etcd_kv: EtcdKv, sqlite_history: SqlHistoryStore) -> AsyncIterator[World]:
    async for w in _world(etcd_kv, sqlite_history):
        yield w


ALL = [j[0] for j in JOBS] + ["live"]
VISION = [j[0] for j in JOBS if j[1] == "vision"] + ["live"]


@contextmanager
def statements(history: SqlHistoryStore) -> Iterator[list[str]]:
    """The SQL statements the history store runs inside the block. What keeps a read fast is what it
    asks of the database, which this counts; its seconds on a busy machine say nothing (the bound of
    0.5 s these tests had was a timed assertion)."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        seen.append(statement)

    event.listen(history.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(history.engine, "before_cursor_execute", record)


# ---- GetJob


async def test_get_of_an_archived_job_reads_sql_with_the_live_isolation(sqlite_world: World) -> None:
    w = sqlite_world
    await w.archive(["j00", "j02"])
    with statements(w.history) as sql:
        job = await w.get("alice", "j00")
    assert (job.job_id, job.phase, job.tenant) == ("j00", pb.JOB_PHASE_SUCCEEDED, "vision")
    assert job.manifest  # GetJob's full answer, as for a live job
    # The job's own rows by its key (job, attempts, waits, intervals), read once for the tenant's
    # check, the answer and its cost, whatever else is archived.
    assert len(sql) <= 4, sql
    assert all("WHERE" in s for s in sql), sql
    # Another tenant's archived job and a job that never existed: the same NOT_FOUND, same words.
    with pytest.raises(Refused) as theirs:
        await w.get("alice", "j02")
    with pytest.raises(Refused) as missing:
        await w.get("alice", "nope-00000000")
    assert theirs.value.code == missing.value.code == grpc.StatusCode.NOT_FOUND
    assert theirs.value.details.replace("j02", "X") == missing.value.details.replace("nope-00000000", "X")
    assert (await w.get("bob", "j02")).job_id == "j02"
    assert (await w.get("admin", "j02")).job_id == "j02"


# ---- ListJobs


async def _pages(
    w: World,
    who: str,
    *,
    archive_between: Sequence[list[str]] = (),
    page_token_from: str = "",
    **fields: Any,
) -> list[list[str]]:
    pages: list[list[str]] = []
    token = page_token_from
    moves = list(archive_between)
    while True:
        reply = await w.list(who, page_token=token, include_archived=True, **fields)
        pages.append([j.job_id for j in reply.jobs])
        token = reply.next_page_token
        if not token:
            return pages
        if moves:
            await w.archive(moves.pop(0))


@pytest.mark.parametrize("newest_first", [False, True], ids=["oldest_first", "newest_first"])
async def test_pages_across_the_boundary_neither_repeat_nor_skip(world: World, newest_first: bool) -> None:
    w = world
    await w.archive(["j00", "j01", "j05"])
    # Between pages, jobs move from etcd to SQL on both sides of the token, and one stays in both.
    moves = [["j03", "j04", "j10"], ["j06", "j13"], ["j14", "j07"]]
    await w.archive(["j08"], delete=False)
    pages = await _pages(w, "admin", archive_between=moves, page_size=4, newest_first=newest_first)
    shown = [j for page in pages for j in page]
    assert shown == (ALL[::-1] if newest_first else ALL)
    assert all(len(p) == 4 for p in pages[:-1])


@pytest.mark.parametrize(
    ("who", "fields", "expected"),
    [
        ("alice", {}, VISION),
        ("bob", {}, [j for j in ALL if j not in VISION]),
        # A member names another tenant or user: still only its own tenant's, live or archived.
        ("alice", {"user": "bob"}, []),
        ("admin", {"tenant": "nlp"}, [j for j in ALL if j not in VISION]),
        ("admin", {"user": "carol"}, [j[0] for j in JOBS if j[2] == "carol"]),
        ("admin", {"cluster": "gcp"}, [j[0] for j in JOBS if j[3] == "gcp"]),
        ("admin", {"phases": [pb.JOB_PHASE_RUNNING]}, ["live"]),
        (
            "admin",
            {"phases": [pb.JOB_PHASE_SUCCEEDED], "user": "alice", "newest_first": True},
            [j[0] for j in JOBS if j[2] == "alice"][::-1],
        ),
    ],
)
async def test_filters_apply_to_both_stores(
    world: World, who: str, fields: dict[str, Any], expected: list[str]
) -> None:
    await world.archive([j[0] for j in JOBS[:8]])
    pages = await _pages(world, who, page_size=3, **fields)
    assert [j for p in pages for j in p] == expected


async def test_since_and_live_only(sqlite_world: World) -> None:
    w = sqlite_world
    await w.archive([j[0] for j in JOBS[:8]])
    live_only = await w.list("admin", page_size=100)
    assert [j.job_id for j in live_only.jobs] == ALL[8:]
    since = pb.ListJobsRequest().since
    since.FromNanoseconds(int((T0 + 4 * 6 * 3600.0) * 1e9))
    for newest_first in (False, True):
        reply = await w.list(
            "admin", include_archived=True, since=since, page_size=100, newest_first=newest_first
        )
        expected = ALL[4:]
        assert [j.job_id for j in reply.jobs] == (expected[::-1] if newest_first else expected)


async def test_a_list_page_across_the_boundary_is_fast(sqlite_world: World) -> None:
    w = sqlite_world
    await w.archive([j[0] for j in JOBS[:8]])
    with statements(w.history) as sql:
        reply = await w.list("admin", include_archived=True, page_size=10)
    assert [j.job_id for j in reply.jobs] == ALL[:10]
    assert reply.next_page_token
    # One query for the archived part of the page, not one per job.
    assert len(sql) == 1, sql


# ---- reports


REPORTS: list[dict[str, Any]] = [
    {"group_by": ["tenant"]},
    {"group_by": ["user"], "bucket": "day"},
    {"group_by": ["cluster", "gpu_type"], "bucket": "week"},
    {"group_by": ["provider", "kind"], "bucket": "month"},
    {"group_by": ["tenant", "user", "cluster", "provider", "gpu_type", "kind"], "bucket": "day"},
]


async def _every_report(w: World) -> list[str]:
    out = [await w.report(**fields) for fields in REPORTS]
    out.append(await w.report(format="html"))
    out.append(await w.report("alice", group_by=["user"], bucket="day"))
    out.append(await w.focus())
    out.append(await w.focus("bob"))
    request = pb.ListLedgerRequest()
    request.start.FromNanoseconds(int((NOW - 40 * 86400.0) * 1e9))
    ledger = await w.reports.ListLedger(request, as_user("fin"))
    out.append(str(sorted((i.job_id, i.attempt, i.start_s, i.end_s, i.cost_usd) for i in ledger.intervals)))
    return out


async def test_reports_read_the_same_before_during_and_after_archiving(world: World) -> None:
    w = world
    before = await _every_report(w)
    assert '"gpu_hours"' in before[0]
    assert "vision" in before[0]
    # During the window: archived in SQL and still in etcd. Not counted twice.
    await w.archive([j[0] for j in JOBS[:9]], delete=False)
    assert await _every_report(w) == before
    # After: gone from etcd (the running ledger cache may still hold its copies; SQL's win).
    for job_id in [j[0] for j in JOBS[:9]]:
        await w.kv.delete(job_key(job_id))
        await w.kv.delete(ledger_key(job_id, 1))
    await w.archive([j[0] for j in JOBS[9:12]])
    assert await _every_report(w) == before
    # A server started now (a fresh ledger cache: etcd holds only what is not archived).
    fresh = LedgerCache(w.store)
    await fresh.start()
    try:
        assert {iv.job_id for iv in fresh.intervals()} == {j[0] for j in JOBS[12:]} | {"live"}
        w.reports._ledger = fresh
        assert await _every_report(w) == before
    finally:
        await fresh.stop()


# ---- ListAudit


async def test_audit_over_both_stores_newest_first_in_pages(sqlite_world: World) -> None:
    w = sqlite_world
    # The archiver's two steps on the first four records; the fourth is still in etcd too.
    listed = await w.kv.range_prefix(AUDIT)
    records = []
    for kv in listed.kvs[:4]:
        d = json.loads(kv.value)
        records.append(
            ArchivedAudit(
                kv.key[len(AUDIT) :].decode(), d["at_s"], d["user"], d["role"], d["action"], d["target"]
            )
        )
    assert w.history.write_audit(records) == 4
    for kv in listed.kvs[:3]:
        await w.kv.delete(kv.key)
    seen: list[str] = []
    token = ""
    while True:
        reply = await w.admin.ListAudit(pb.ListAuditRequest(limit=2, page_token=token), as_user("admin"))
        seen = [e.action for e in reply.events] + seen
        token = reply.next_page_token
        if not token:
            break
    assert seen == [f"action_{k}" for k in range(6)]
    whole = await w.admin.ListAudit(pb.ListAuditRequest(limit=100), as_user("admin"))
    assert [e.action for e in whole.events] == [f"action_{k}" for k in range(6)]
    for who in ("alice", "fin"):
        with pytest.raises(Refused) as refused:
            await w.admin.ListAudit(pb.ListAuditRequest(limit=100), as_user(who))
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED


# ---- DescribeJob and StreamLogs


def _logs_service(w: World, archive: LogArchive) -> LogsService:
    return LogsService(
        store=w.store,
        cache=w.cache,
        auth=Authenticator(w.store),
        metrics=Metrics(),
        members=MemberClusters([], {}),
        archive=archive,
        clock=lambda: NOW,
        history=w.history,
    )


async def _stream(logs: LogsService, who: str, job_id: str) -> list[pb.LogChunk]:
    return [c async for c in logs.StreamLogs(pb.StreamLogsRequest(job_id=job_id), as_user(who))]


async def test_describe_and_logs_of_an_archived_job(sqlite_world: World) -> None:
    w = sqlite_world
    archive = LogArchive(w.kv, LogsSettings(retain_hours=24 * 365.0))
    logs = _logs_service(w, archive)
    await w.archive(["j00", "j02", "j03"])
    described = await logs.DescribeJob(pb.DescribeJobRequest(job_id="j00"), as_user("alice"))
    assert described.job.phase == pb.JOB_PHASE_SUCCEEDED
    [attempt] = described.attempts
    assert (attempt.cluster, attempt.gpu_type, attempt.outcome) == ("onprem", "H100", "SUCCEEDED")
    assert attempt.note.startswith("kept when the attempt ended")
    # Another tenant's archived job: NOT_FOUND, as for a job that does not exist.
    for call in (
        logs.DescribeJob(pb.DescribeJobRequest(job_id="j02"), as_user("alice")),
        _stream(logs, "alice", "j02"),
    ):
        with pytest.raises(Refused) as refused:
            await call
        assert refused.value.code == grpc.StatusCode.NOT_FOUND
    # No kept tails: said plainly, and no follow of an ended job.
    with pytest.raises(Refused) as gone:
        await _stream(logs, "alice", "j00")
    assert gone.value.code == grpc.StatusCode.NOT_FOUND
    assert "archived" in gone.value.details
    assert "no longer kept" in gone.value.details
    # Kept tails still under their lease in etcd are served for an archived job (each kept line
    # starts with its stamp, which is not shown without --timestamps).
    kept = a_kept_attempt(
        1,
        (KeptReplica("worker", 0, _a_replica("j03-worker-0"), 12),),
        started_at_s=NOW - 3600.0,
        finished_at_s=NOW - 60.0,
        gpu_type="A100",
        usd_per_gpu_hour=1.25,
    )
    await archive.keep("j03", kept, {("worker", 0): b"t1 epoch-1\nt2 epoch-2\n"})
    chunks = await _stream(logs, "carol", "j03")
    assert [line for c in chunks for line in c.lines] == ["epoch-1", "epoch-2"]


def _a_replica(pod: str) -> ReplicaState:
    # What the replica's ReplicaState says matters here only as the pod it names.
    return a_finished_replica(pod, "worker", 0, started_at_s=NOW - 3600.0, finished_at_s=NOW - 60.0)


# ---- through the archiver itself (engineer A's `federation.scheduling.archiver`)


async def test_the_reads_agree_before_and_after_the_archiver_runs(world: World) -> None:
    w = world
    logs = _logs_service(w, LogArchive(w.kv, LogsSettings(retain_hours=24 * 365.0)))
    kept = a_kept_attempt(
        1,
        (KeptReplica("worker", 0, _a_replica("j00-worker-0"), 9),),
        started_at_s=T0 + 600.0,
        finished_at_s=T0 + 600.0 + 6 * 3600.0,
        kept_at_s=NOW - 60.0,
        reason="Completed",
    )
    await LogArchive(w.kv, LogsSettings(retain_hours=24 * 365.0)).keep(
        "j00", kept, {("worker", 0): b"t1 done\n"}
    )
    reports = await _every_report(w)
    audit = await w.admin.ListAudit(pb.ListAuditRequest(limit=100), as_user("admin"))
    # The first page is read with everything in etcd; the archiver runs; the rest come from SQL.
    first = await w.list("admin", include_archived=True, page_size=4)
    report = await _archive_once(w)
    assert (report.jobs_archived, report.audit_archived) == (len(JOBS), 6)
    assert w.history.counts().jobs == len(JOBS)
    await _until(lambda: all(w.cache.get(JobId(j[0])) is None for j in JOBS))
    assert [j.job_id for j in (await w.list("admin", page_size=100)).jobs] == ["live"]
    rest = await _pages(w, "admin", page_size=4, page_token_from=first.next_page_token)
    assert [j.job_id for j in first.jobs] + [j for p in rest for j in p] == ALL
    assert await _every_report(w) == reports
    after = await w.admin.ListAudit(pb.ListAuditRequest(limit=100), as_user("admin"))
    assert after.events == audit.events
    assert (await w.get("alice", "j00")).phase == pb.JOB_PHASE_SUCCEEDED
    described = await logs.DescribeJob(pb.DescribeJobRequest(job_id="j00"), as_user("alice"))
    assert [(a.attempt, a.reason, [r.pod for r in a.replicas]) for a in described.attempts] == [
        (1, "Completed", ["j00-worker-0"])
    ]
    # The tail moved with its job: etcd holds no kept-log key of it, the history store its bytes.
    assert (await w.kv.range_prefix(b"/gpufed/logs/j00/")).kvs == ()
    assert [k.data for k in w.history.kept_logs(JobId("j00"), 1)] == [b"t1 done\n"]
    assert [line for c in await _stream(logs, "alice", "j00") for line in c.lines] == ["done"]


# ---- kept tails archived with their job (issue 19: etcd flat after the first hour)

STAMP = "2026-01-20T23:{:02d}:00Z"


def _stamped(lines: list[str]) -> bytes:
    """A kept tail as joblogs keeps one: each line with its RFC 3339 stamp, a minute apart, the last
    at 23:59 of the day before NOW."""
    start = 60 - len(lines)
    return "".join(f"{STAMP.format(start + i)} {line}\n" for i, line in enumerate(lines)).encode()


def _logs_at(w: World, now_s: float, retain_hours: float) -> LogsService:
    archive = LogArchive(w.kv, LogsSettings(retain_hours=retain_hours))
    return LogsService(
        store=w.store,
        cache=w.cache,
        auth=Authenticator(w.store),
        metrics=Metrics(),
        members=MemberClusters([], {}),
        archive=archive,
        clock=lambda: now_s,
        history=w.history,
    )


async def _lines(logs: LogsService, who: str, **request: Any) -> list[str]:
    chunks = logs.StreamLogs(pb.StreamLogsRequest(**request), as_user(who))
    return [line for c in [c async for c in chunks] for line in c.lines]


async def test_logs_of_an_archived_job_are_read_from_the_history_store_cut_and_isolated(world: World) -> None:
    """The archiver moves the tails to SQL and out of etcd; `gpufed logs` reads them there with the
    live path's cutting, retention and isolation."""
    w = world
    lines = [f"epoch-{k}" for k in range(4)] + ["épocha-4 ✓"]
    for job_id in ("j00", "j02"):
        kept = a_kept_attempt(
            1,
            (
                KeptReplica("master", 0, _a_replica(f"{job_id}-master-0"), 1),
                KeptReplica("worker", 0, _a_replica(f"{job_id}-worker-0"), 1),
            ),
            started_at_s=NOW - 7200.0,
            finished_at_s=NOW - 600.0,
        )
        await LogArchive(w.kv, LogsSettings()).keep(
            job_id, kept, {("master", 0): _stamped(lines), ("worker", 0): _stamped(["w-only"])}
        )
    report = await _archive_once(w)
    assert report.tails_archived == 4
    await _until(lambda: w.cache.get(JobId("j00")) is None)
    assert (await w.kv.range_prefix(b"/gpufed/logs/")).kvs == ()
    [master, _] = w.history.kept_logs(JobId("j00"), 1)
    assert master.data == _stamped(lines)

    logs = _logs_at(w, NOW, retain_hours=168.0)
    assert await _lines(logs, "alice", job_id="j00", task="master") == lines
    assert await _lines(logs, "alice", job_id="j00", task="master", tail_lines=2) == lines[3:]
    stamped = await _lines(logs, "alice", job_id="j00", task="master", tail_lines=1, timestamps=True)
    assert stamped == [f"{STAMP.format(59)} {lines[4]}"]
    # --since 3m at 00:00: the lines of 23:57 and later.
    assert await _lines(logs, "alice", job_id="j00", task="master", since_seconds=180) == lines[2:]
    assert await _lines(logs, "alice", job_id="j00", task="worker") == ["w-only"]
    # Another tenant's member: NOT_FOUND in the very words of a job that does not exist; finance,
    # who reads no job's logs, the same.
    for who, job_id in (("bob", "j00"), ("alice", "j02"), ("fin", "j00")):
        with pytest.raises(Refused) as theirs:
            await _lines(logs, who, job_id=job_id)
        with pytest.raises(Refused) as missing:
            await _lines(logs, who, job_id="j99-missing")
        assert theirs.value.code == missing.value.code == grpc.StatusCode.NOT_FOUND, who
        assert theirs.value.details == f"job '{job_id}' not found"
    described = await logs.DescribeJob(pb.DescribeJobRequest(job_id="j00"), as_user("alice"))
    assert [a.logs_kept for a in described.attempts] == [True]

    # Past the retention from when they were kept: not served, as etcd's copy would not be.
    late = _logs_at(w, NOW - 600.0 + 168 * 3600.0 + 1, retain_hours=168.0)
    with pytest.raises(Refused) as gone:
        await _lines(late, "alice", job_id="j00")
    assert gone.value.code == grpc.StatusCode.NOT_FOUND
    assert "no longer kept" in gone.value.details
    described = await late.DescribeJob(pb.DescribeJobRequest(job_id="j00"), as_user("alice"))
    assert [(a.outcome, a.logs_kept) for a in described.attempts] == [("SUCCEEDED", False)]


async def _archive_once(w: World) -> PassReport:
    """One archiver pass at NOW, as the leader runs it (under a leader key of its own)."""
    election = LeaderElection(w.kv, "history-reads-test", ttl_s=5)
    fence = await election.acquire()
    try:
        archiver = Archiver(
            kv=w.kv,
            cache=w.cache,
            history=w.history,
            settings=HistorySettings(retain_in_etcd_s=3600.0, archive_rate_per_s=10_000.0),
            clock=lambda: NOW,
        )
        return await archiver.archive_once(fence)
    finally:
        await election.close()
