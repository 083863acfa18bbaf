"""A finance report reads the same whether its intervals are summed in memory or in SQL (issue 19).

One ledger, built twice: (a) every interval in memory, as etcd's ledger cache holds them, through
`compute_report`; (b) the closed intervals archived to a real database (SQLite, and PostgreSQL
through the process fixture), some of them also still in etcd (the archiver's window between its SQL
commit and its etcd delete), the rest and the open ones in etcd only, through the API's path:
`report_read` -> `HistoryStore.read_report` (GROUP BY in SQL) -> `both_stores` -> `finish_report`.

Every grouping, bucket, period and tenant filter the reports offer must give the same `Report`,
compared with ==: times are whole seconds and prices have few binary digits, so every sum is exact
and the figures agree to the last digit (a double-counted or lost interval changes them, and so
does a piece clipped or bucketed differently). The rendered JSON, CSV and HTML are compared too.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Connection, Row, select

from federation.history import schema
from federation.history.sql_store import SqlHistoryStore
from federation.history.usage_sql import rebuild_rollups
from federation.ledger.report import (
    Bucket,
    Dim,
    ProvisionedInterval,
    ReportQuery,
    compute_report,
    render_csv,
    render_html,
    render_json,
)
from federation.ledger.report.archived import both_stores, report_read
from federation.ledger.report.compute import Report, finish_report, idle_sites
from federation.ledger.report.query import next_month_s
from federation.store.intervals import IntervalEnd, LedgerInterval
from federation.store.records import TenantRecord
from placement.model import CapacityKind, ClusterName, GpuType, JobId, TenantId
from placement.model_policy import GpuQuota
from tests.history_builders import BACKENDS, an_archived_job, fresh_dsn, open_store

# 2026-03-03 12:00:00 UTC: a month boundary and several ISO weeks fall inside the ledger.
NOW = 1_772_539_200.0
DAY = 86400.0
TENANTS = [
    TenantRecord(
        name=TenantId("vision"),
        quotas=(GpuQuota(GpuType("H100"), guaranteed_gpus=16),),
        monthly_budget_gpu_hours=5000.0,
    ),
    TenantRecord(name=TenantId("speech"), parent=TenantId("vision")),
    TenantRecord(name=TenantId("nlp"), quotas=(GpuQuota(GpuType("A100"), guaranteed_gpus=8),)),
]
SITES = [("onprem", "onprem", "H100"), ("gcp", "gcp", "A100"), ("onprem", "onprem", "A100")]


# The ledgers are built once per process and shared by both backends' stores (they are only read):
# so a report's expected value, computed in memory from the same intervals, is computed once too.
@functools.cache
def _ledger(seed: int = 19) -> tuple[list[LedgerInterval], list[LedgerInterval]]:
    """(closed, open) intervals over the 70 days before NOW, whole seconds, some crossing midnights,
    weeks and the month boundary, some jobs with two attempts."""
    rng = random.Random(seed)
    closed: list[LedgerInterval] = []
    opened: list[LedgerInterval] = []
    for i in range(400):
        start = NOW - rng.randrange(0, 70 * int(DAY))
        attempts = 2 if i % 7 == 0 else 1
        for attempt in range(1, attempts + 1):
            cluster, provider, gpu = rng.choice(SITES)
            tenant = rng.choice(["vision", "speech", "nlp", "nlp"])
            is_open = i % 23 == 0 and attempt == attempts
            end = None if is_open else min(NOW - 1, start + rng.choice([600, 3600, 20_000, 90_000, 400_000]))
            iv = LedgerInterval(
                job_id=JobId(f"j{i:04d}"),
                attempt=attempt,
                tenant=TenantId(tenant),
                user=rng.choice(["alice", "bob", "carol"]),
                cluster=ClusterName(cluster),
                provider=provider,
                region="eu-west",
                gpu_type=GpuType(gpu),
                gpu_count=rng.choice([1, 2, 4, 8]),
                kind=rng.choice([CapacityKind.ON_DEMAND, CapacityKind.SPOT]),
                start_s=start,
                end_s=end,
                usd_per_gpu_hour=rng.choice([2.0, 3.5, 1.25, 0.75]),
                ended=None if is_open else IntervalEnd.FINISHED,
                job_name=f"train-{i}",
            )
            (opened if is_open else closed).append(iv)
            if end is not None:
                start = end + 60
    return closed, opened


POOLS = [
    ProvisionedInterval("onprem", "pool-a", "H100", 16, 2.0, NOW - 40 * DAY, NOW - 10 * DAY),
    ProvisionedInterval("onprem", "pool-b", "H100", 8, 2.0, NOW - 20 * DAY, None),
    ProvisionedInterval("gcp", "spot-1", "A100", 8, 3.5, NOW - 30 * DAY, NOW - 2 * DAY, CapacityKind.SPOT),
]


def _stored(
    closed: list[LedgerInterval], opened: list[LedgerInterval], dsn: str
) -> Iterator[tuple[SqlHistoryStore, list[LedgerInterval], list[LedgerInterval]]]:
    """(store, every interval, etcd's intervals): most closed jobs archived and gone from etcd, a
    tenth archived and still in etcd, a tenth not archived yet; open ones in etcd only. Archived in
    batches of 25 jobs, so the month rollup is added to row by row, as the archiver adds to it."""
    by_job: dict[str, list[LedgerInterval]] = {}
    for iv in closed:
        by_job.setdefault(iv.job_id, []).append(iv)
    open_jobs = {iv.job_id for iv in opened}
    live = list(opened)
    to_archive = []
    for n, (job_id, ivs) in enumerate(sorted(by_job.items())):
        if job_id in open_jobs or n % 10 == 0:
            live.extend(ivs)  # not archived yet (a job with an open attempt never is)
            continue
        to_archive.append(an_archived_job(job_id, tenant=ivs[0].tenant, intervals=tuple(ivs)))
        if n % 10 == 1:
            live.extend(ivs)  # archived, not yet deleted from etcd
    for store in open_store(dsn):
        written = sum(store.write_jobs(to_archive[at : at + 25]) for at in range(0, len(to_archive), 25))
        assert written == len(to_archive)
        yield store, closed + opened, live


# The stores below are read, never written (but for a rolled-back transaction), so one store per
# backend serves every case: built once per worker, where the module's cases are spread over the
# workers (session-scoped for that: a module-scoped fixture would hold the module to one worker).
@pytest.fixture(scope="session", params=BACKENDS)
def archived(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SqlHistoryStore, list[LedgerInterval], list[LedgerInterval]]]:
    closed, opened = _ledger()
    dsn = fresh_dsn(str(request.param), tmp_path_factory.mktemp("ledger"), request)
    yield from _stored(closed, opened, dsn)


GROUPINGS: list[tuple[Dim, ...]] = [
    (Dim.TENANT,),
    (Dim.USER,),
    (Dim.CLUSTER,),
    (Dim.PROVIDER,),
    (Dim.GPU_TYPE,),
    (Dim.KIND,),
    (Dim.TENANT, Dim.GPU_TYPE),
    (Dim.TENANT, Dim.USER, Dim.CLUSTER, Dim.PROVIDER, Dim.GPU_TYPE, Dim.KIND),
]
PERIODS = [
    ("this month", NOW - 2 * DAY - 12 * 3600, NOW + 26 * DAY),
    ("last month", NOW - 30 * DAY - 12 * 3600, NOW - 2 * DAY - 12 * 3600),
    # Neither day- nor month-aligned, and running past now.
    ("odd range", NOW - 55 * DAY + 4831, NOW + 3 * DAY),
]


def _both_ways(
    store: SqlHistoryStore, everything: list[LedgerInterval], live: list[LedgerInterval], query: ReportQuery
) -> tuple[Report, Report]:
    pools = POOLS if query.tenants is None else []
    expected = _expected(everything, query)
    sites = idle_sites(pools, query)
    check = tuple((iv.job_id, iv.attempt) for iv in live if iv.end_s is not None)
    asked = report_read(query, check=check, idle_sites=sites)
    sums = both_stores(live, query, asked, store.read_report(asked.read), idle_sites=sites)
    return expected, finish_report(sums, TENANTS, query, provisioned=pools)


# In-memory reports by (ledger, query): each query is compared on SQLite and on PostgreSQL against
# the one value, computed once. A ledger is named by its first interval's identity and its length:
# `_ledger` and `_year_ledger` are cached, so both backends' `everything` hold the very same objects.
_EXPECTED: dict[tuple[int, int, ReportQuery], Report] = {}


def _expected(everything: list[LedgerInterval], query: ReportQuery) -> Report:
    key = (id(everything[0]), len(everything), query)
    found = _EXPECTED.get(key)
    if found is None:
        pools = POOLS if query.tenants is None else []
        found = _EXPECTED[key] = compute_report(everything, TENANTS, query, provisioned=pools)
    return found


def _grouping_id(group_by: tuple[Dim, ...]) -> str:
    return "+".join(d.value for d in group_by)


def _bucket_id(bucket: Bucket | None) -> str:
    return "no-bucket" if bucket is None else f"by-{bucket.value}"


# One case a grouping, each every bucket, period and filter: the cases run side by side on the workers.
@pytest.mark.parametrize("group_by", GROUPINGS, ids=_grouping_id)
def test_every_grouping_bucket_period_and_filter_reads_the_same(
    archived: tuple[SqlHistoryStore, list[LedgerInterval], list[LedgerInterval]], group_by: tuple[Dim, ...]
) -> None:
    store, everything, live = archived
    assert len(live) < len(everything) / 3, "most of the ledger must be summed in SQL"
    compared = 0
    for bucket, (_, start, end), tenants in itertools.product(
        [None, Bucket.DAY, Bucket.WEEK, Bucket.MONTH],
        PERIODS,
        [None, frozenset({TenantId("nlp")}), frozenset({TenantId("vision"), TenantId("speech")})],
    ):
        query = ReportQuery(
            start_s=start, end_s=end, now_s=NOW, group_by=group_by, bucket=bucket, tenants=tenants
        )
        expected, got = _both_ways(store, everything, live, query)
        assert got == expected, (group_by, bucket, start, tenants)
        assert expected.rows, "every query here has usage to compare"
        compared += 1
    assert compared == 4 * 3 * 3


def test_the_tenant_by_gpu_type_month_report_renders_the_same(
    archived: tuple[SqlHistoryStore, list[LedgerInterval], list[LedgerInterval]],
) -> None:
    store, everything, live = archived
    query = ReportQuery.last_month(NOW, group_by=(Dim.TENANT, Dim.GPU_TYPE), bucket=Bucket.MONTH)
    expected, got = _both_ways(store, everything, live, query)
    assert expected.idle, "the every-tenant report carries idle cost"
    assert {r.key for r in expected.rows} >= {("nlp", "A100"), ("vision", "H100")}
    for render in (render_json, render_csv, render_html):
        assert render(got) == render(expected)


def test_an_interval_in_both_stores_counts_once(
    archived: tuple[SqlHistoryStore, list[LedgerInterval], list[LedgerInterval]],
) -> None:
    """Without the held check, the intervals in the archiving window count twice: the test above
    would not notice a broken dedup unless it changes the figures, so show that it does."""
    store, everything, live = archived
    query = ReportQuery(start_s=NOW - 70 * DAY, end_s=NOW, now_s=NOW)
    asked = report_read(query, check=(), idle_sites=None)
    doubled = finish_report(
        both_stores(live, query, asked, store.read_report(asked.read), idle_sites=None), TENANTS, query
    )
    expected, got = _both_ways(store, everything, live, query)
    assert got == expected
    assert doubled.total_gpu_hours > expected.total_gpu_hours


# ---- a year of ledger: the whole months of a range are read from the month rollup

JAN_2026 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
# 2026-12-20 12:00:00 UTC: the year's last weeks are still running.
YEAR_NOW = 1_797_724_800.0 + 12 * 3600


def _month(n: int) -> float:
    """The first instant of the n-th month of 2026 (1-based; 13 is January 2027)."""
    return datetime(2026 + (n - 1) // 12, (n - 1) % 12 + 1, 1, tzinfo=UTC).timestamp()


@functools.cache
def _year_ledger(seed: int = 26) -> tuple[list[LedgerInterval], list[LedgerInterval]]:
    """(closed, open) intervals over 2026, whole seconds: short ones, ones crossing months, ones
    spanning several months, and ones starting or ending exactly at a month's midnight."""
    rng = random.Random(seed)
    closed: list[LedgerInterval] = []
    opened: list[LedgerInterval] = []
    # (start, duration): random ones, then the edge cases.
    spans: list[tuple[float, float | None]] = []
    for _ in range(360):
        start = JAN_2026 + rng.randrange(0, int(YEAR_NOW - JAN_2026) - 3600)
        spans.append(
            (start, rng.choice([600.0, 3600.0, 20_000.0, 90_000.0, 400_000.0, 3_000_000.0, 8_000_000.0]))
        )
    for n in range(2, 13):
        spans.append(
            (_month(n), rng.choice([3600.0, 86_400.0, 40 * 86_400.0]))
        )  # begins at a month's midnight
        spans.append((_month(n) - 7200.0, 7200.0))  # ends at a month's midnight
        spans.append((_month(n) - 5 * 86_400.0, 70 * 86_400.0 + 1.0))  # across three months
    spans.append((_month(1), 200 * 86_400.0))  # from the year's first instant, through seven months
    spans.append((_month(3), None))  # open since a month's midnight
    for i, (start, duration) in enumerate(spans):
        cluster, provider, gpu = rng.choice(SITES)
        is_open = duration is None or (i % 41 == 0 and start + duration >= YEAR_NOW - 3600)
        end = None if is_open or duration is None else min(YEAR_NOW - 1, start + duration)
        iv = LedgerInterval(
            job_id=JobId(f"y{i:04d}"),
            attempt=1 + i % 2,
            tenant=TenantId(rng.choice(["vision", "speech", "nlp", "nlp"])),
            user=rng.choice(["alice", "bob", "carol"]),
            cluster=ClusterName(cluster),
            provider=provider,
            region="eu-west",
            gpu_type=GpuType(gpu),
            gpu_count=rng.choice([1, 2, 4, 8]),
            kind=rng.choice([CapacityKind.ON_DEMAND, CapacityKind.SPOT]),
            start_s=start,
            end_s=end,
            usd_per_gpu_hour=rng.choice([2.0, 3.5, 1.25, 0.75]),
            ended=None if end is None else IntervalEnd.FINISHED,
            job_name=f"year-{i}",
        )
        (opened if end is None else closed).append(iv)
    return closed, opened


@pytest.fixture(scope="session", params=BACKENDS)
def archived_year(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SqlHistoryStore, list[LedgerInterval], list[LedgerInterval]]]:
    """Like `archived`, a year's: read only, one store per backend and worker."""
    closed, opened = _year_ledger()
    dsn = fresh_dsn(str(request.param), tmp_path_factory.mktemp("year"), request)
    yield from _stored(closed, opened, dsn)


YEAR_PERIODS = [
    # The year: eleven whole months, and December up to now from the days.
    ("2026", _month(1), _month(13)),
    ("whole months only", _month(1), _month(12)),
    ("one whole month", _month(6), _month(7)),
    ("mid-month to mid-month", _month(1) + 16 * DAY + 18_191, _month(11) + 19 * DAY + 46_807),
    ("from a month's midnight to mid-month", _month(2), _month(5) + 14 * DAY + 43_200),
    ("from mid-month to a month's midnight", _month(3) + 9 * DAY + 25_200, _month(7)),
    # No whole month inside: from the days alone, as before.
    ("across one month boundary", _month(4) + 14 * DAY, _month(5) + 19 * DAY),
]
YEAR_GROUPINGS: list[tuple[Dim, ...]] = [
    (Dim.TENANT,),
    (Dim.GPU_TYPE,),
    (Dim.TENANT, Dim.GPU_TYPE),
    (Dim.CLUSTER, Dim.PROVIDER, Dim.KIND),
    (Dim.USER,),  # not in the rollup: the days, for contrast
]


# One case a grouping and bucket (PostgreSQL takes seconds for a case's 14 queries on a busy machine).
@pytest.mark.parametrize("bucket", [None, Bucket.MONTH, Bucket.WEEK, Bucket.DAY], ids=_bucket_id)
@pytest.mark.parametrize("group_by", YEAR_GROUPINGS, ids=_grouping_id)
def test_reports_over_whole_months_read_the_same(
    archived_year: tuple[SqlHistoryStore, list[LedgerInterval], list[LedgerInterval]],
    group_by: tuple[Dim, ...],
    bucket: Bucket | None,
) -> None:
    store, everything, live = archived_year
    compared = 0
    for (name, start, end), tenants in itertools.product(YEAR_PERIODS, [None, frozenset({TenantId("nlp")})]):
        query = ReportQuery(
            start_s=start, end_s=end, now_s=YEAR_NOW, group_by=group_by, bucket=bucket, tenants=tenants
        )
        expected, got = _both_ways(store, everything, live, query)
        assert got == expected, (name, group_by, bucket, tenants)
        assert expected.rows, "every query here has usage to compare"
        compared += 1
    assert compared == 7 * 2


def test_a_year_counts_an_interval_once_however_many_months_it_spans(
    archived_year: tuple[SqlHistoryStore, list[LedgerInterval], list[LedgerInterval]],
) -> None:
    """The year's total counts each interval with usage in it once, and a month bucket each interval
    with usage in that month: checked against the ledger itself, not only against the in-memory sum."""
    store, everything, live = archived_year
    query = ReportQuery(start_s=_month(1), end_s=_month(13), now_s=YEAR_NOW, group_by=(Dim.TENANT,))
    expected, got = _both_ways(store, everything, live, query)
    assert got == expected
    counted = {r.key[0]: r.intervals for r in got.rows}
    assert counted == {
        tenant: sum(1 for iv in everything if iv.tenant == tenant and (iv.end_s or YEAR_NOW) > iv.start_s)
        for tenant in counted
    }
    by_month = replace(query, bucket=Bucket.MONTH)
    expected, got = _both_ways(store, everything, live, by_month)
    assert got == expected
    spanning = [iv for iv in everything if iv.end_s is not None and iv.end_s - iv.start_s > 60 * DAY]
    assert spanning, "the ledger has intervals over several months"
    for r in got.rows:
        assert r.bucket_start_s is not None
        since, until = r.bucket_start_s, next_month_s(r.bucket_start_s)
        assert r.intervals == sum(
            1
            for iv in everything
            if iv.tenant == r.key[0] and min(iv.end_s or YEAR_NOW, until) > max(iv.start_s, since)
        ), r


def test_the_rollups_written_row_by_row_are_the_rollups_rebuilt_from_the_days(
    archived_year: tuple[SqlHistoryStore, list[LedgerInterval], list[LedgerInterval]],
) -> None:
    """The archive's increments and the migration's (and bulk load's) fill from the day rows agree."""
    store, _, _ = archived_year

    def exact(found: Sequence[Row[Any]]) -> list[tuple[Any, ...]]:
        # All but `cost_usd` (0002's, divided by 3600 per write, so its last digit depends on the order).
        return [tuple(v for k, v in r._mapping.items() if k != "cost_usd") for r in found]

    tables = (schema.usage_months, schema.usage_tenant_days)

    def read(conn: Connection) -> list[Sequence[Row[Any]]]:
        return [conn.execute(select(t).order_by(*t.primary_key.columns)).all() for t in tables]

    with store.engine.connect() as conn, conn.begin() as transaction:
        written = read(conn)
        rebuild_rollups(conn)
        rebuilt = read(conn)
        # Rolled back: the other cases read this store as the archive wrote it.
        transaction.rollback()
    with store.engine.connect() as conn:
        assert read(conn) == written
    assert len(written[0]) > 12
    assert len(written[1]) > 300
    for before, after in zip(written, rebuilt, strict=True):
        assert exact(before) == exact(after)
    assert [r.cost_usd for r in written[0]] == pytest.approx([r.cost_usd for r in rebuilt[0]])
