"""The reads the API makes through `HistoryStore` (issue 19): jobs newest first and by user, audit
newest first, archived intervals by range a page at a time, and a report's SQL sums with the held
check, on SQLite (a file) and a real PostgreSQL (the process fixture), each from a fresh database.

Each read is checked for its order, its paging (pages neither repeat nor skip), and tenant
isolation: a query for one tenant never returns another's rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from federation.errors import InvalidArgument
from federation.history import report_sql
from federation.history.model import ArchivedJob, GroupBy, IntervalQuery, JobFilter, Period
from federation.history.sql_store import SqlHistoryStore
from federation.history.sums import EdgesQuery, ReportRead, SumsQuery, SumsRow, UsageEdge
from federation.store.intervals import LedgerInterval
from placement.model import JobId, TenantId
from tests.history_builders import BACKENDS, an_archived_job, an_audit, an_interval, fresh_dsn, open_store

DAY = 86_400.0
# 2026-03-02T00:00:00Z, a Monday, the day after a month boundary.
MONDAY = 1_772_409_600.0


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlHistoryStore]:
    yield from open_store(fresh_dsn(request.param, tmp_path, request))


def _job(
    job_id: str, *ivs: LedgerInterval, tenant: str = "t1", user: str = "alice", at: float = 1000.0
) -> ArchivedJob:
    job = an_archived_job(job_id, tenant=tenant, submitted_at_s=at, intervals=ivs or None)
    return replace(job, record=replace(job.record, user=user))


# ---- list_jobs: newest first, user filter


def _walk(store: SqlHistoryStore, query: JobFilter) -> list[str]:
    seen: list[str] = []
    while True:
        page = store.list_jobs(query)
        seen += [j.job_id for j in page.jobs]
        if page.next_after is None:
            return seen
        query = replace(query, after=page.next_after)


def test_jobs_page_newest_first_by_user_within_a_tenant(store: SqlHistoryStore) -> None:
    # Pairs share a submission time, so the job id breaks the tie in both orders.
    jobs = [
        _job(f"j{i:02d}", tenant=("t1", "t2")[i % 2], user=("alice", "bob")[i % 3 == 0], at=1000.0 + i // 2)
        for i in range(14)
    ]
    store.write_jobs(jobs)
    order = sorted(jobs, key=lambda j: (j.record.submitted_at_s, j.record.job_id))
    newest = [j.record.job_id for j in reversed(order)]
    assert _walk(store, JobFilter(page_size=3, newest_first=True)) == newest
    assert _walk(store, JobFilter(page_size=4)) == newest[::-1]

    t1_bob = [j.record.job_id for j in reversed(order) if j.record.tenant == "t1" and j.record.user == "bob"]
    got = _walk(store, JobFilter(tenant=TenantId("t1"), user="bob", page_size=1, newest_first=True))
    assert got == t1_bob
    assert len(got) >= 2
    # Isolation: t2's list never holds t1's jobs, whatever the other filters.
    for user in ("", "alice", "bob"):
        for newest_first in (False, True):
            ids = _walk(
                store, JobFilter(tenant=TenantId("t2"), user=user, page_size=2, newest_first=newest_first)
            )
            assert ids
            assert all(int(i[1:]) % 2 == 1 for i in ids)
    assert _walk(store, JobFilter(user="nobody", newest_first=True)) == []


def test_newest_first_continues_below_its_position(store: SqlHistoryStore) -> None:
    store.write_jobs([_job(f"j{i}", at=1000.0 + i) for i in range(5)])
    page = store.list_jobs(JobFilter(after=(1003.0, "j3"), newest_first=True))
    assert [j.job_id for j in page.jobs] == ["j2", "j1", "j0"]
    assert page.next_after is None


# ---- list_audit_newest


def test_audit_newest_first_before_a_time(store: SqlHistoryStore) -> None:
    store.write_audit([an_audit(f"a{i}", 100.0 + i // 2) for i in range(8)])
    assert [a.audit_id for a in store.list_audit_newest(limit=3)] == ["a7", "a6", "a5"]
    assert [a.audit_id for a in store.list_audit_newest(before_s=102.0)] == [
        "a5",
        "a4",
        "a3",
        "a2",
        "a1",
        "a0",
    ]
    assert store.list_audit_newest(before_s=99.0) == []
    with pytest.raises(InvalidArgument, match="limit"):
        store.list_audit_newest(limit=0)


# ---- intervals_page


def _all_intervals(store: SqlHistoryStore, query: IntervalQuery) -> list[LedgerInterval]:
    found: list[LedgerInterval] = []
    while True:
        page = store.intervals_page(query)
        assert len(page.intervals) <= query.limit
        found += page.intervals
        if page.next_after is None:
            return found
        query = replace(query, after=page.next_after)


def test_intervals_by_range_whole_each_once_in_pages(store: SqlHistoryStore) -> None:
    ivs = {
        # Across three midnights and the range's start: read once, whole.
        "long": an_interval("long", start_s=MONDAY - 2 * DAY + 100, end_s=MONDAY + DAY + 50),
        # Starts on a later day of the range, crosses a midnight.
        "late": an_interval("late", start_s=MONDAY + 0.5 * DAY, end_s=MONDAY + 1.5 * DAY),
        # On the range's first day, but ended before the range starts.
        "early": an_interval("early", start_s=MONDAY - DAY + 10, end_s=MONDAY - DAY + 20),
        # After the range.
        "after": an_interval("after", start_s=MONDAY + 3 * DAY, end_s=MONDAY + 3 * DAY + 60),
        "other": an_interval("other", start_s=MONDAY, end_s=MONDAY + 60, tenant="t2"),
    }
    many = [
        an_interval(f"m{i:02d}", start_s=MONDAY + i * 3000.0, end_s=MONDAY + i * 3000.0 + 5000.0)
        for i in range(30)
    ]
    store.write_jobs(
        [_job(k, iv, tenant=iv.tenant) for k, iv in ivs.items()] + [_job(iv.job_id, iv) for iv in many]
    )
    since, until = MONDAY - DAY + 100, MONDAY + 2 * DAY
    everyone = _all_intervals(store, IntervalQuery(since_s=since, until_s=until, limit=4))
    ids = [iv.job_id for iv in everyone]
    assert sorted(ids) == sorted(["long", "late", "other", *(iv.job_id for iv in many)])
    assert len(ids) == len(set(ids)), "an interval crossing midnights is read once"
    assert {iv.job_id: iv for iv in everyone}[JobId("long")] == ivs["long"], "whole, not clipped"
    # One page, or many: the same intervals.
    assert sorted(
        iv.job_id for iv in _all_intervals(store, IntervalQuery(since_s=since, until_s=until))
    ) == sorted(ids)
    t2 = _all_intervals(
        store, IntervalQuery(since_s=since, until_s=until, tenants=frozenset({TenantId("t2")}), limit=1)
    )
    assert [iv.job_id for iv in t2] == ["other"]
    t1 = _all_intervals(
        store, IntervalQuery(since_s=since, until_s=until, tenants=frozenset({TenantId("t1")}), limit=7)
    )
    assert "other" not in {iv.job_id for iv in t1}
    assert len(t1) == len(ids) - 1
    with pytest.raises(InvalidArgument, match="until_s"):
        IntervalQuery(since_s=until, until_s=since)


# ---- read_report


def _report_store(store: SqlHistoryStore) -> None:
    store.write_jobs(
        [
            # t1 alice, 8 H100 over Sunday 20:00 to Monday 04:00: two days, two ISO weeks.
            _job("a", an_interval("a", start_s=MONDAY - 4 * 3600, end_s=MONDAY + 4 * 3600)),
            # t1 bob, 2 A100 on Tuesday for 3 h at $3.5.
            _job(
                "b",
                an_interval(
                    "b",
                    start_s=MONDAY + DAY,
                    end_s=MONDAY + DAY + 3 * 3600,
                    user="bob",
                    gpu_type="A100",
                    gpu_count=2,
                    usd_per_gpu_hour=3.5,
                ),
                user="bob",
            ),
            # t2, 4 H100 on Monday for 1 h.
            _job(
                "c",
                an_interval("c", start_s=MONDAY + 3600, end_s=MONDAY + 7200, tenant="t2", gpu_count=4),
                tenant="t2",
            ),
        ]
    )


def _sums(store: SqlHistoryStore, query: SumsQuery) -> tuple[SumsRow, ...]:
    return store.read_report(ReportRead(sums=(query,))).sums[0]


def test_sums_group_by_dimension_and_bucket(store: SqlHistoryStore) -> None:
    _report_store(store)
    week = (MONDAY - 7 * DAY, MONDAY + 7 * DAY)
    by_tenant = _sums(store, SumsQuery(*week, (GroupBy.TENANT,)))
    assert by_tenant == (
        # Cost in whole micro-dollars (federation.store.money).
        SumsRow(("t1",), None, 8 * 8 * 3600 + 2 * 3 * 3600, 8 * 8 * 2_000_000 + 2 * 3 * 3_500_000, 2),
        SumsRow(("t2",), None, 4 * 3600, 4 * 2 * 1_000_000, 1),
    )
    by_day = _sums(store, SumsQuery(*week, (GroupBy.USER,), Period.DAY))
    assert [(r.keys, r.bucket, r.gpu_seconds, r.intervals) for r in by_day] == [
        (("alice",), "2026-03-01", 8 * 4 * 3600, 1),
        (("alice",), "2026-03-02", 8 * 4 * 3600 + 4 * 3600, 2),
        (("bob",), "2026-03-03", 2 * 3 * 3600, 1),
    ]
    by_month = _sums(store, SumsQuery(*week, (GroupBy.GPU_TYPE,), Period.MONTH))
    assert [(r.keys, r.bucket, r.gpu_seconds) for r in by_month] == [
        (("A100",), "2026-03", 6 * 3600),
        (("H100",), "2026-03", 64 * 3600 + 4 * 3600),
    ]
    # Across the month boundary: Saturday 28 February 22:00 to Sunday 1 March 02:00.
    store.write_jobs(
        [_job("feb", an_interval("feb", start_s=MONDAY - DAY - 2 * 3600, end_s=MONDAY - DAY + 2 * 3600))]
    )
    by_month = _sums(store, SumsQuery(*week, (GroupBy.GPU_TYPE,), Period.MONTH))
    assert [(r.keys, r.bucket, r.gpu_seconds, r.intervals) for r in by_month] == [
        (("H100",), "2026-02", 16 * 3600, 1),
        (("A100",), "2026-03", 6 * 3600, 1),
        (("H100",), "2026-03", 16 * 3600 + 64 * 3600 + 4 * 3600, 3),
    ]
    # ISO weeks as bucket starts: interval "a" is in both weeks, counted once in each.
    weeks = _sums(store, SumsQuery(*week, (GroupBy.CLUSTER,), starts=("2026-02-23", "2026-03-02")))
    assert [(r.bucket, r.gpu_seconds, r.intervals) for r in weeks] == [
        ("2026-02-23", 32 * 3600 + 32 * 3600, 2),
        ("2026-03-02", 32 * 3600 + 6 * 3600 + 4 * 3600, 3),
    ]
    # Clipped to the range: Monday 01:30 to 02:30 holds 1 h of "a" and the last half hour of "c".
    clipped = _sums(store, SumsQuery(MONDAY + 5400, MONDAY + 9000, (GroupBy.TENANT, GroupBy.KIND)))
    assert [(r.keys, r.gpu_seconds) for r in clipped] == [
        (("t1", "on_demand"), 8 * 3600),
        (("t2", "on_demand"), 4 * 1800),
    ]
    # Without the count (the reports' daily and per-tenant sums): the same sums, intervals 0.
    uncounted = _sums(store, SumsQuery(*week, (GroupBy.GPU_TYPE,), Period.MONTH, count_intervals=False))
    assert [(r.keys, r.bucket, r.gpu_seconds, r.intervals) for r in uncounted] == [
        (r.keys, r.bucket, r.gpu_seconds, 0) for r in by_month
    ]
    # Nothing in range: no rows (not one row of NULL sums).
    assert _sums(store, SumsQuery(MONDAY + 30 * DAY, MONDAY + 31 * DAY)) == ()


def test_sums_of_one_tenant_never_carry_anothers(store: SqlHistoryStore) -> None:
    _report_store(store)
    for group_by in [
        (),
        (GroupBy.USER,),
        (GroupBy.GPU_TYPE,),
        (GroupBy.CLUSTER, GroupBy.PROVIDER, GroupBy.KIND),
    ]:
        # Two whole days (the day rollup, by day), and a range holding the whole of March (the
        # month rollup, without a bucket or by month).
        for (since, until), period in itertools.product(
            [(MONDAY - DAY, MONDAY + DAY), (MONDAY - 2 * DAY, MONDAY + 31 * DAY)],
            (None, Period.DAY, Period.MONTH),
        ):
            t2 = _sums(store, SumsQuery(since, until, group_by, period, tenants=frozenset({TenantId("t2")})))
            assert sum(r.gpu_seconds for r in t2) == 4 * 3600, (group_by, period, since)
            assert sum(r.intervals for r in t2) == 1
    answer = store.read_report(
        ReportRead(
            sums=(
                SumsQuery(
                    MONDAY - DAY, MONDAY + 2 * DAY, (GroupBy.TENANT,), tenants=frozenset({TenantId("t1")})
                ),
            )
        )
    )
    assert {r.keys for r in answer.sums[0]} == {("t1",)}


def test_edges_are_gpus_in_use_changes_per_instant(store: SqlHistoryStore) -> None:
    _report_store(store)
    # Another interval on (onprem, H100) ending when a next one starts: those instants cancel.
    store.write_jobs(
        [
            _job("d", an_interval("d", start_s=MONDAY + 6 * 3600, end_s=MONDAY + 7 * 3600, gpu_count=4)),
            _job("e", an_interval("e", start_s=MONDAY + 7 * 3600, end_s=MONDAY + 8 * 3600, gpu_count=4)),
        ]
    )
    since, until = MONDAY - 2 * 3600, MONDAY + 10 * 3600
    answer = store.read_report(
        ReportRead(sums=(), edges=EdgesQuery(since, until, frozenset({("onprem", "H100")})))
    )
    assert answer.edges == (
        UsageEdge("onprem", "H100", since, 8),  # "a" clipped to the range's start; its midnight cancels
        UsageEdge("onprem", "H100", MONDAY + 3600, 4),
        UsageEdge("onprem", "H100", MONDAY + 7200, -4),
        UsageEdge("onprem", "H100", MONDAY + 4 * 3600, -8),
        UsageEdge("onprem", "H100", MONDAY + 6 * 3600, 4),
        UsageEdge("onprem", "H100", MONDAY + 8 * 3600, -4),
    )
    assert store.read_report(ReportRead(sums=(), edges=EdgesQuery(since, until, frozenset()))).edges == ()


def test_held_names_the_archived_intervals_of_a_list(store: SqlHistoryStore) -> None:
    _report_store(store)
    answer = store.read_report(ReportRead(sums=(), check=(("a", 1), ("a", 2), ("b", 1), ("zz", 1))))
    assert answer.held == frozenset({("a", 1), ("b", 1)})
    many = (*tuple((f"x{i}", 1) for i in range(1200)), ("c", 1))
    assert store.read_report(ReportRead(sums=(), check=many)).held == frozenset({("c", 1)})


def test_a_report_reads_one_snapshot(store: SqlHistoryStore) -> None:
    """A job archived while a report reads is in all of the report's answers or in none."""
    _report_store(store)
    query = SumsQuery(MONDAY - 7 * DAY, MONDAY + 7 * DAY)
    with store._snapshot() as conn:
        before = report_sql.sums(conn, query)
        store.write_jobs([_job("late", an_interval("late", start_s=MONDAY, end_s=MONDAY + 3600))])
        assert report_sql.sums(conn, query) == before
        assert report_sql.held(conn, [("late", 1)]) == frozenset()
    assert store.read_report(ReportRead(sums=(), check=(("late", 1),))).held == frozenset({("late", 1)})


def test_bad_sums_queries_name_the_problem() -> None:
    with pytest.raises(InvalidArgument, match="until_s"):
        SumsQuery(MONDAY, MONDAY)
    with pytest.raises(InvalidArgument, match="group_by"):
        SumsQuery(MONDAY, MONDAY + DAY, (GroupBy.USER, GroupBy.USER))
    with pytest.raises(InvalidArgument, match="starts"):
        SumsQuery(MONDAY, MONDAY + DAY, (), Period.DAY, ("2026-03-02",))
    with pytest.raises(InvalidArgument, match="starts"):
        SumsQuery(MONDAY, MONDAY + DAY, starts=("2026-03-09", "2026-03-02"))
