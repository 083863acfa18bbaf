"""The history store on both backends: SQLite (a file) and a real PostgreSQL (a process fixture).

Every test runs on each backend with a fresh, migrated database, so the two cannot drift apart.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from federation.errors import InvalidArgument
from federation.history.model import GroupBy, JobFilter, Period, UsageQuery, UsageRow
from federation.history.sql_store import SqlHistoryStore
from federation.history.usage_sql import rebuild_rollups
from placement.model import JobId, JobPhase, TenantId
from tests.history_builders import BACKENDS, an_archived_job, an_audit, an_interval, fresh_dsn, open_store

DAY = 86_400.0
# 2026-03-01T00:00:00Z: a month boundary, so day and month buckets are easy to read.
MARCH = 1_772_323_200.0


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlHistoryStore]:
    yield from open_store(fresh_dsn(request.param, tmp_path, request))


def test_a_job_reads_back_whole(store: SqlHistoryStore) -> None:
    job = an_archived_job("j1")
    assert store.write_jobs([job]) == 1
    assert store.get_job(JobId("j1")) == job
    assert store.get_job(JobId("missing")) is None


def test_archived_ids_names_only_archived_jobs_across_chunks(store: SqlHistoryStore) -> None:
    # More ids than one IN (...) chunk holds, so the chunking is exercised on both backends.
    store.write_jobs([an_archived_job(f"a{i:04d}") for i in range(0, 1200, 3)])
    asked = [JobId(f"a{i:04d}") for i in range(1200)] + [JobId("a0000")]
    assert store.archived_ids(asked) == {JobId(f"a{i:04d}") for i in range(0, 1200, 3)}
    assert store.archived_ids([]) == set()


def test_writing_a_job_twice_leaves_one_copy(store: SqlHistoryStore) -> None:
    # What a crash between the SQL commit and the etcd delete looks like: the batch comes again.
    first = [an_archived_job("j1"), an_archived_job("j2")]
    assert store.write_jobs(first) == 2
    assert store.write_jobs([*first, an_archived_job("j3")]) == 1
    counts = store.counts()
    assert (counts.jobs, counts.intervals) == (3, 3)
    hours = store.usage(UsageQuery(since_s=0, until_s=10_000))
    assert hours[0].gpu_hours == pytest.approx(3 * 8.0)


def test_a_rewrite_keeps_the_first_copy(store: SqlHistoryStore) -> None:
    store.write_jobs([an_archived_job("j1", name="first")])
    store.write_jobs([an_archived_job("j1", name="second")])
    archived = store.get_job(JobId("j1"))
    assert archived is not None
    assert archived.record.spec.name == "first"


def test_audit_is_idempotent_and_in_time_order(store: SqlHistoryStore) -> None:
    records = [an_audit("00000000000000000002-bb", 2.0), an_audit("00000000000000000001-aa", 1.0)]
    assert store.write_audit(records) == 2
    assert store.write_audit(records) == 0
    listed = store.list_audit()
    assert [a.audit_id for a in listed] == ["00000000000000000001-aa", "00000000000000000002-bb"]
    assert store.list_audit(after=(listed[0].at_s, listed[0].audit_id)) == [listed[1]]
    assert store.list_audit(since_s=1.5) == [listed[1]]


def test_list_pages_in_the_live_order_with_the_live_filters(store: SqlHistoryStore) -> None:
    jobs = [
        an_archived_job(f"j{i:02d}", tenant="t1" if i % 2 else "t2", submitted_at_s=1000.0 + i // 2)
        for i in range(10)
    ]
    store.write_jobs([*jobs, an_archived_job("x1", name="eval-x1", phase=JobPhase.FAILED)])
    seen: list[str] = []
    after = None
    while True:
        page = store.list_jobs(JobFilter(page_size=3, after=after))
        seen += [j.job_id for j in page.jobs]
        if page.next_after is None:
            break
        after = page.next_after
    expected = sorted(
        [*jobs, an_archived_job("x1")], key=lambda j: (j.record.submitted_at_s, j.record.job_id)
    )
    assert seen == [j.record.job_id for j in expected]

    t2 = store.list_jobs(JobFilter(tenant=TenantId("t2")))
    assert {j.tenant for j in t2.jobs} == {"t2"}
    assert len(t2.jobs) == 5
    failed = store.list_jobs(JobFilter(phases=frozenset({JobPhase.FAILED})))
    assert [j.job_id for j in failed.jobs] == ["x1"]
    assert [j.job_id for j in store.list_jobs(JobFilter(name_prefix="eval-")).jobs] == ["x1"]
    recent = store.list_jobs(JobFilter(since_s=1004.0))
    assert {j.job_id for j in recent.jobs} == {"j08", "j09"}


def test_a_name_prefix_is_not_a_pattern(store: SqlHistoryStore) -> None:
    store.write_jobs([an_archived_job("a", name="x_1"), an_archived_job("b", name="xy1")])
    assert [j.job_id for j in store.list_jobs(JobFilter(name_prefix="x_")).jobs] == ["a"]


def _job_with(job_id: str, *intervals: tuple[float, float, str, str]) -> object:
    return an_archived_job(
        job_id,
        tenant=intervals[0][2],
        intervals=tuple(
            an_interval(job_id, n + 1, start_s=s, end_s=e, tenant=t, gpu_type=g)
            for n, (s, e, t, g) in enumerate(intervals)
        ),
    )


def test_usage_is_clipped_to_the_period_and_split_at_midnight(store: SqlHistoryStore) -> None:
    # 8 GPUs at $2/GPU-hour from 22:00 on 1 March to 02:00 on 2 March: 2 hours on each day.
    job = an_archived_job(
        "j1", intervals=(an_interval("j1", start_s=MARCH + 22 * 3600, end_s=MARCH + DAY + 2 * 3600),)
    )
    store.write_jobs([job])
    by_day = store.usage(UsageQuery(since_s=MARCH, until_s=MARCH + 2 * DAY, period=Period.DAY))
    assert [r.period for r in by_day] == ["2026-03-01", "2026-03-02"]
    assert [r.gpu_hours for r in by_day] == pytest.approx([16.0, 16.0])
    assert [r.cost_usd for r in by_day] == pytest.approx([32.0, 32.0])
    # A period that starts and ends inside the interval counts only its part: 23:00 to 01:00.
    inner = store.usage(UsageQuery(since_s=MARCH + 23 * 3600, until_s=MARCH + DAY + 3600))
    assert inner[0].gpu_hours == pytest.approx(16.0)
    assert store.usage(UsageQuery(since_s=MARCH + 2 * DAY, until_s=MARCH + 3 * DAY)) == []


def test_usage_groups_by_every_dimension_and_month(store: SqlHistoryStore) -> None:
    store.write_jobs(
        [
            an_archived_job(
                "a", tenant="t1", intervals=(an_interval("a", start_s=MARCH, end_s=MARCH + 3600),)
            ),
            an_archived_job(
                "b",
                tenant="t2",
                intervals=(
                    an_interval(
                        "b",
                        start_s=MARCH + 31 * DAY,
                        end_s=MARCH + 31 * DAY + 7200,
                        tenant="t2",
                        gpu_type="A100",
                    ),
                ),
            ),
        ]
    )
    query = UsageQuery(
        since_s=MARCH,
        until_s=MARCH + 61 * DAY,
        group_by=(GroupBy.TENANT, GroupBy.GPU_TYPE),
        period=Period.MONTH,
    )
    rows = store.usage(query)
    assert [(r.keys, r.period) for r in rows] == [(("t1", "H100"), "2026-03"), (("t2", "A100"), "2026-04")]
    assert [r.gpu_hours for r in rows] == pytest.approx([8.0, 16.0])
    for dimension in GroupBy:
        grouped = store.usage(replace(query, group_by=(dimension,), period=None))
        assert sum(r.gpu_hours for r in grouped) == pytest.approx(24.0), dimension
    only_t2 = store.usage(replace(query, tenant=TenantId("t2")))
    assert [r.keys for r in only_t2] == [("t2", "A100")]


def _by_month(found: list[UsageRow]) -> dict[tuple[tuple[str, ...], str], float]:
    sums: dict[tuple[tuple[str, ...], str], float] = {}
    for r in found:
        assert r.period is not None
        key = (r.keys, r.period[:7])
        sums[key] = sums.get(key, 0.0) + r.gpu_hours
    return sums


def test_whole_months_from_the_rollup_agree_with_the_days(store: SqlHistoryStore) -> None:
    # Intervals that cross day and month boundaries, for two tenants and two GPU types.
    jobs = [
        an_archived_job(
            f"j{n}",
            tenant=f"t{n % 2}",
            intervals=(
                an_interval(
                    f"j{n}",
                    start_s=MARCH + n * 5.3 * DAY,
                    end_s=MARCH + n * 5.3 * DAY + (n + 1) * 0.7 * DAY,
                    tenant=f"t{n % 2}",
                    gpu_type="H100" if n % 3 else "A100",
                    gpu_count=n + 1,
                ),
            ),
        )
        for n in range(20)
    ]
    store.write_jobs(jobs)
    store.write_jobs(jobs)  # a rewrite must not add to the rollup
    # From mid-February to mid-June: March, April and May whole (rollup), the ends from the days.
    since, until = MARCH - 12.5 * DAY, MARCH + 106.5 * DAY
    dims = (GroupBy.TENANT, GroupBy.GPU_TYPE)
    by_month = store.usage(UsageQuery(since, until, dims, Period.MONTH))
    by_day = store.usage(UsageQuery(since, until, dims, Period.DAY))
    assert _by_month(by_month) == pytest.approx(_by_month(by_day))
    total = sum(r.gpu_hours for r in by_month)
    expected = sum(iv.gpu_hours(since_s=since, until_s=until) for j in jobs for iv in j.intervals)
    assert total == pytest.approx(expected)
    cost = sum(r.cost_usd for r in store.usage(UsageQuery(since, until)))
    assert cost == pytest.approx(expected * 2.0)
    with store.engine.begin() as conn:
        rebuild_rollups(conn)
    rebuilt = store.usage(UsageQuery(since, until, dims, Period.MONTH))
    assert [(r.keys, r.period) for r in rebuilt] == [(r.keys, r.period) for r in by_month]
    assert [r.cost_usd for r in rebuilt] == pytest.approx([r.cost_usd for r in by_month])


@pytest.mark.parametrize(
    ("build", "names"),
    [
        pytest.param(lambda: UsageQuery(since_s=10, until_s=10), "until_s", id="empty-period"),
        pytest.param(
            lambda: UsageQuery(since_s=0, until_s=1, group_by=(GroupBy.USER, GroupBy.USER)),
            "group_by",
            id="dimension-twice",
        ),
        pytest.param(lambda: JobFilter(page_size=0), "page_size", id="page-size-zero"),
        pytest.param(lambda: JobFilter(page_size=501), "page_size", id="page-size-over-500"),
        pytest.param(
            lambda: an_archived_job("j1", phase=JobPhase.RUNNING), "has not ended", id="job-not-ended"
        ),
        pytest.param(
            lambda: an_archived_job(
                "j1", intervals=(replace(an_interval("j1", start_s=0, end_s=1), end_s=None),)
            ),
            "still open",
            id="open-interval",
        ),
        pytest.param(
            lambda: an_archived_job("j1", intervals=(an_interval("other", start_s=0, end_s=1),)),
            "belongs to job other",
            id="interval-of-another-job",
        ),
    ],
)
def test_bad_input_names_the_problem(build: Callable[[], object], names: str) -> None:
    with pytest.raises(InvalidArgument, match=names):
        build()


def test_audit_limit_is_checked(store: SqlHistoryStore) -> None:
    with pytest.raises(InvalidArgument, match="limit"):
        store.list_audit(limit=0)


def test_sqlite_reads_the_days_in_key_order_across_tenants(tmp_path: Path) -> None:
    # The hint names SQLite's auto index of the WITHOUT ROWID key: if the schema changed its name,
    # this plan (and every report across tenants) would fail with "no such index".
    from sqlalchemy.dialects import sqlite

    from federation.history import usage_sql

    for store in open_store(f"sqlite:///{tmp_path / 'h.sqlite3'}"):
        query = UsageQuery(MARCH, MARCH + 10 * DAY, (GroupBy.TENANT, GroupBy.GPU_TYPE))
        stmt = usage_sql._days_select(query, query.since_s, query.until_s)
        sql = str(stmt.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))
        with store.engine.connect() as conn:
            plan = " ".join(str(r[3]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql))
        assert "USING PRIMARY KEY (day>? AND day<?)" in plan


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_writers_racing_on_the_same_jobs_leave_one_copy(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # A deposed leader still finishing a batch while the new leader archives the same jobs: on
    # PostgreSQL the second waits on the first's keys, then skips them; the rollup must not double.
    dsn = fresh_dsn(backend, tmp_path, request)
    stores = [SqlHistoryStore.open(dsn), SqlHistoryStore.open(dsn)]
    jobs = [
        an_archived_job(f"j{n:03d}", intervals=(an_interval(f"j{n:03d}", start_s=MARCH, end_s=MARCH + 3600),))
        for n in range(300)
    ]
    start = threading.Barrier(2)
    written: list[int] = []

    def write(store: SqlHistoryStore) -> None:
        start.wait()
        written.append(store.write_jobs(jobs))

    threads = [threading.Thread(target=write, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert sorted(written) == [0, 300]
        assert stores[0].counts().intervals == 300
        month = stores[0].usage(UsageQuery(MARCH, MARCH + 31 * DAY))  # whole March: the rollup
        assert month[0].gpu_hours == pytest.approx(300 * 8.0)
    finally:
        for s in stores:
            s.close()
