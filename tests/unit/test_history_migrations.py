"""The history schema's migrations, on SQLite and on a real PostgreSQL: from an empty database to
the newest revision, from the previous revision with rows in it, and the newest revision agreeing
with the metadata the queries are written against."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, func, inspect, select

from federation.errors import InvalidArgument
from federation.history import rows, schema
from federation.history.engine import (
    NEWEST_REVISION,
    _alembic_config,
    at_newest_revision,
    current_revision,
    migrate,
    open_engine,
    parse_dsn,
)
from federation.history.model import ArchivedJob, GroupBy, KeptLog, UsageQuery
from federation.history.sql_store import SqlHistoryStore
from federation.history.sums import ReportRead, SumsQuery
from federation.history.usage_sql import month_rollup_rows, tenant_day_rollup_rows
from placement.model import JobId
from tests.history_builders import BACKENDS, an_archived_job, an_interval, fresh_dsn

NEWEST = "0007"
MARCH = 1_772_323_200.0  # 2026-03-01T00:00:00Z
APRIL = MARCH + 31 * 86_400.0


def _spanning_march(job_id: str, tenant: str) -> ArchivedJob:
    """Two days of 8 GPUs in the middle of March."""
    at = MARCH + 10 * 86_400.0
    interval = an_interval(job_id, start_s=at, end_s=at + 2 * 86_400.0, tenant=tenant)
    return an_archived_job(job_id, tenant=tenant, intervals=(interval,))


@pytest.fixture(params=BACKENDS)
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fresh_dsn(request.param, tmp_path, request)


def test_an_empty_database_upgrades_to_the_newest_revision(dsn: str) -> None:
    engine = open_engine(dsn)
    try:
        assert current_revision(engine) is None
        migrate(engine)
        assert current_revision(engine) == NEWEST
        tables = set(inspect(engine).get_table_names())
        assert set(schema.metadata.tables) <= tables
        migrate(engine)  # a second run is a no-op
        assert current_revision(engine) == NEWEST
    finally:
        engine.dispose()


def test_the_newest_revision_constant_is_alembics_head(tmp_path: Path) -> None:
    # A migration added without moving NEWEST_REVISION would leave every database that a server
    # opens at the revision before it: the open skips Alembic for a database "at the newest".
    engine = open_engine(f"sqlite:///{tmp_path / 'h.sqlite3'}")
    try:
        assert ScriptDirectory.from_config(_alembic_config(engine)).get_heads() == [NEWEST_REVISION]
    finally:
        engine.dispose()


def test_opening_a_database_behind_migrates_it_and_one_at_the_newest_is_left_alone(dsn: str) -> None:
    engine = open_engine(dsn)
    try:
        assert not at_newest_revision(engine)  # no version table yet
        migrate(engine, "0003")
        assert not at_newest_revision(engine)
        SqlHistoryStore.open(dsn).close()
        assert current_revision(engine) == NEWEST
        assert at_newest_revision(engine)
    finally:
        engine.dispose()


def test_opening_a_database_at_the_newest_revision_does_not_import_alembic(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'h.sqlite3'}"
    SqlHistoryStore.open(dsn).close()
    # A process of its own: this one has imported Alembic already.
    code = (
        "import sys\n"
        "from federation.history.sql_store import SqlHistoryStore\n"
        f"SqlHistoryStore.open({dsn!r}).close()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_newest_revision_is_the_schema_the_queries_use(dsn: str) -> None:
    engine = open_engine(dsn)
    try:
        migrate(engine)
        with engine.connect() as connection:
            differences = compare_metadata(MigrationContext.configure(connection), schema.metadata)
        assert differences == []
    finally:
        engine.dispose()


def test_the_previous_revision_with_rows_upgrades_and_keeps_them(dsn: str) -> None:
    engine = open_engine(dsn)
    try:
        migrate(engine, "0001")
        assert "ix_history_usage_days_tenant_day" not in {
            ix["name"] for ix in inspect(engine).get_indexes("history_usage_days")
        }
        # Rows as 0001 kept them: no month rollup yet, so they are written table by table.
        jobs = [_spanning_march("j1", "t1"), _spanning_march("j2", "t2")]
        with engine.begin() as connection:
            for job in jobs:
                connection.execute(schema.jobs.insert(), rows.job_row(job))
                job_id = job.record.job_id
                connection.execute(
                    schema.attempts.insert(), [rows.attempt_row(job_id, a) for a in job.attempts]
                )
                connection.execute(
                    schema.waits.insert(), [rows.wait_row(job_id, n, w) for n, w in enumerate(job.waits)]
                )
                connection.execute(schema.intervals.insert(), _old_interval_rows(job))
                connection.execute(schema.usage_days.insert(), _old_day_rows(job))
        migrate(engine)
        assert current_revision(engine) == NEWEST
        assert "ix_history_usage_days_tenant_day" in {
            ix["name"] for ix in inspect(engine).get_indexes("history_usage_days")
        }
        store = SqlHistoryStore(engine)
        assert store.get_job(JobId("j1")) == jobs[0]
        # March whole: read from the rollup 0002 filled from the rows 0001 kept.
        found = store.usage(UsageQuery(since_s=MARCH, until_s=APRIL, group_by=(GroupBy.TENANT,)))
        assert [(r.keys, r.gpu_hours) for r in found] == [(("t1",), 8.0 * 48), (("t2",), 8.0 * 48)]
        with engine.connect() as connection:
            assert connection.execute(select(func.count()).select_from(schema.usage_months)).scalar() == 2
    finally:
        engine.dispose()


def test_0002_with_rows_upgrades_to_kept_logs_and_keeps_them(dsn: str) -> None:
    """0003 adds the kept-log table: the jobs, usage and rollup 0002 held read as before, and a job
    archived after the upgrade keeps its tails byte for byte."""
    engine = open_engine(dsn)
    try:
        migrate(engine, "0002")
        assert "history_kept_logs" not in inspect(engine).get_table_names()
        jobs = [_spanning_march("j1", "t1"), _spanning_march("j2", "t2")]
        _write_as_0002(engine, jobs)
        migrate(engine)
        assert current_revision(engine) == NEWEST
        assert {ix["name"] for ix in inspect(engine).get_indexes("history_kept_logs")} == {
            "ix_history_kept_logs_kept_at"
        }
        store = SqlHistoryStore(engine)
        assert store.get_job(JobId("j1")) == jobs[0]
        found = store.usage(UsageQuery(since_s=MARCH, until_s=APRIL, group_by=(GroupBy.TENANT,)))
        assert [(r.keys, r.gpu_hours) for r in found] == [(("t1",), 8.0 * 48), (("t2",), 8.0 * 48)]
        assert store.counts().kept_logs == 0
        tail = KeptLog("j3", 1, "worker", 0, MARCH, b"\x00\xff binary \n")
        assert store.write_jobs([replace(_spanning_march("j3", "t1"), logs=(tail,))]) == 1
        assert store.kept_logs(JobId("j3"), 1) == [tail]
    finally:
        engine.dispose()


def test_sqlite_runs_in_wal_mode(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'deep' / 'history.sqlite3'}")
    try:
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("dsn", "names"),
    [
        pytest.param("not a url", "not a database URL", id="garbage"),
        pytest.param("mysql://db/history", "not supported", id="other-backend"),
        pytest.param("postgresql+psycopg2://db/history", "psycopg 3", id="other-postgres-driver"),
        pytest.param("sqlite+pysqlcipher:///x.db", "plain sqlite", id="other-sqlite-driver"),
    ],
)
def test_a_bad_dsn_names_the_problem(dsn: str, names: str) -> None:
    with pytest.raises(InvalidArgument, match=f"history.dsn: .*{names}"):
        parse_dsn(dsn)


def test_postgres_urls_go_through_psycopg_3() -> None:
    assert parse_dsn("postgresql://u@h/db").drivername == "postgresql+psycopg"


def test_revision_0002_with_rows_upgrades_to_rollup_counts(dsn: str) -> None:
    """0004 refills the month rollup with interval counts and undivided cost from the day rows: an
    interval over three months counts once in a range of them, and in each month's bucket."""
    engine = open_engine(dsn)
    try:
        # 0003 (the kept-log table) left the usage tables as 0002 made them.
        migrate(engine, "0003")
        feb = MARCH - 28 * 86_400.0
        across = an_interval("j1", start_s=feb + 20 * 86_400.0, end_s=APRIL + 3 * 86_400.0 + 1.0)
        at_midnight = an_interval("j2", start_s=MARCH, end_s=MARCH + 3_600.0, gpu_count=2)
        jobs = [
            an_archived_job("j1", intervals=(across,)),
            an_archived_job("j2", intervals=(at_midnight,)),
            _spanning_march("j3", "t2"),
        ]
        _write_as_0002(engine, jobs)
        migrate(engine)
        assert current_revision(engine) == NEWEST
        m = schema.usage_months
        with engine.connect() as connection:
            found = connection.execute(
                select(
                    m.c.month,
                    m.c.tenant,
                    m.c.gpu_seconds,
                    m.c.cost_gpu_seconds,
                    m.c.intervals,
                    m.c.intervals_begun,
                ).order_by(m.c.month, m.c.tenant)
            ).all()
        feb_s, march_s = 8 * 8 * 86_400.0, 8 * 31 * 86_400.0 + 2 * 3_600.0
        april_s = 8 * (3 * 86_400.0 + 1.0)
        assert [tuple(r) for r in found] == [
            ("2026-02", "t1", feb_s, feb_s * 2.0, 1, 1),
            ("2026-03", "t1", march_s, march_s * 2.0, 2, 1),  # j1 carried in, j2 begun at midnight
            ("2026-03", "t2", 8 * 48 * 3_600.0, 8 * 48 * 3_600.0 * 2.0, 1, 1),
            ("2026-04", "t1", april_s, april_s * 2.0, 1, 0),
        ]
        t = schema.usage_tenant_days
        with engine.connect() as connection:
            by_day = connection.execute(
                select(t.c.day, t.c.tenant, t.c.gpu_seconds, t.c.intervals).where(t.c.day == "2026-03-01")
            ).all()
        # j1 all day, j2 its hour from midnight: two intervals that day.
        assert [tuple(r) for r in by_day] == [("2026-03-01", "t1", 8 * 86_400.0 + 2 * 3_600.0, 2)]
        store = SqlHistoryStore(engine)
        # February to April whole: from the rollup alone; j1 counts once over the three months.
        read = ReportRead((SumsQuery(feb, APRIL + 30 * 86_400.0, (GroupBy.TENANT,)),))
        (t1, t2) = store.read_report(read).sums[0]
        assert (t1.keys, t1.intervals, t1.gpu_seconds) == (("t1",), 2, feb_s + march_s + april_s)
        assert (t2.keys, t2.intervals) == (("t2",), 1)
    finally:
        engine.dispose()


def _old_interval_rows(job: ArchivedJob) -> list[dict[str, object]]:
    """Interval rows as revisions before 0006 kept them: without the set and the burst offer."""
    new = {"job_set", "set_kind", *rows.OFFER_COLUMNS}
    return [{k: v for k, v in rows.interval_row(iv).items() if k not in new} for iv in job.intervals]


def _old_day_rows(job: ArchivedJob) -> list[dict[str, object]]:
    """Day rows as revisions before 0005 kept them: without `cost_micro_usd` (nor 0007's set)."""
    out = []
    for iv in job.intervals:
        for d in rows.usage_day_rows(iv):
            for name in ("cost_micro_usd", "job_set", "set_kind"):
                d.pop(name)
            out.append(d)
    return out


def _write_as_0002(engine: Engine, jobs: Sequence[ArchivedJob]) -> None:
    """The jobs as 0002's write path left them: rows, intervals, day rows and its month rollup (without
    the columns 0004 adds); today's store writes tables an older schema lacks."""
    with engine.begin() as connection:
        for job in jobs:
            connection.execute(schema.jobs.insert(), rows.job_row(job))
            job_id = job.record.job_id
            if job.attempts:
                connection.execute(
                    schema.attempts.insert(), [rows.attempt_row(job_id, a) for a in job.attempts]
                )
            if job.waits:
                connection.execute(
                    schema.waits.insert(), [rows.wait_row(job_id, n, w) for n, w in enumerate(job.waits)]
                )
            connection.execute(schema.intervals.insert(), _old_interval_rows(job))
            connection.execute(schema.usage_days.insert(), _old_day_rows(job))
        connection.exec_driver_sql(
            "INSERT INTO history_usage_months"
            " (month, tenant, cluster, provider, gpu_type, kind, gpu_seconds, cost_usd)"
            " SELECT substr(day, 1, 7), tenant, cluster, provider, gpu_type, kind,"
            " SUM(gpu_count * (end_s - start_s)), SUM(gpu_count * (end_s - start_s) * usd_per_gpu_hour) / 3600.0"
            " FROM history_usage_days GROUP BY substr(day, 1, 7), tenant, cluster, provider, gpu_type, kind"
        )


def test_revision_0006_day_rows_take_their_intervals_set_in_0007(dsn: str) -> None:
    """0007 copies each interval's set and kind (0006's columns) onto its day rows: archived set
    jobs report by set after the upgrade, and rows without a set (a job alone, or an interval
    archived before 0006 kept it) read as "no set"."""
    engine = open_engine(dsn)
    try:
        migrate(engine, "0006")
        at = MARCH + 10 * 86_400.0
        in_sweep = replace(
            an_interval("j1", start_s=at, end_s=at + 3_600.0, tenant="t1"), job_set="lr", set_kind="sweep"
        )
        # Another tenant's set of the same name (an array): never the same row as t1's.
        in_array = replace(
            an_interval("j2", start_s=at, end_s=at + 7_200.0, tenant="t2"), job_set="lr", set_kind="array"
        )
        alone = an_interval("j3", start_s=at, end_s=at + 2 * 86_400.0, tenant="t1")
        jobs = [
            an_archived_job(iv.job_id, tenant=iv.tenant, intervals=(iv,))
            for iv in (in_sweep, in_array, alone)
        ]
        days = [d for job in jobs for iv in job.intervals for d in rows.usage_day_rows(iv)]
        months, tenant_days = month_rollup_rows(days), tenant_day_rollup_rows(days)
        for d in days:  # as 0006 kept them
            d.pop("job_set")
            d.pop("set_kind")
        with engine.begin() as connection:
            connection.execute(schema.jobs.insert(), [rows.job_row(job) for job in jobs])
            connection.execute(
                schema.intervals.insert(), [rows.interval_row(iv) for iv in (in_sweep, in_array)]
            )
            # j3 as revisions before 0006 kept it: no set column written at all.
            connection.execute(schema.intervals.insert(), _old_interval_rows(jobs[2]))
            connection.execute(schema.usage_days.insert(), days)
            connection.execute(schema.usage_months.insert(), months)
            connection.execute(schema.usage_tenant_days.insert(), tenant_days)
        migrate(engine)
        assert current_revision(engine) == NEWEST
        store = SqlHistoryStore(engine)
        by_set = SumsQuery(MARCH, APRIL, (GroupBy.TENANT, GroupBy.SET))
        by_sweep = SumsQuery(MARCH, APRIL, (GroupBy.TENANT, GroupBy.SWEEP))
        got_set, got_sweep = store.read_report(ReportRead((by_set, by_sweep))).sums
        assert [(r.keys, r.gpu_seconds, r.intervals) for r in got_set] == [
            (("t1", ""), 8 * 2 * 86_400.0, 1),
            (("t1", "lr"), 8 * 3_600.0, 1),
            (("t2", "lr"), 8 * 7_200.0, 1),
        ]
        # The array is no sweep: t2's hours are under "no sweep".
        assert [(r.keys, r.gpu_seconds) for r in got_sweep] == [
            (("t1", ""), 8 * 2 * 86_400.0),
            (("t1", "lr"), 8 * 3_600.0),
            (("t2", ""), 8 * 7_200.0),
        ]
        # A day row written after the upgrade carries its set itself.
        later = replace(
            an_interval("j4", start_s=at, end_s=at + 60.0, tenant="t2"), job_set="lr", set_kind="array"
        )
        store.write_jobs([an_archived_job("j4", tenant="t2", intervals=(later,))])
        (got,) = store.read_report(ReportRead((by_set,))).sums
        assert [(r.keys, r.intervals) for r in got][-1] == (("t2", "lr"), 2)
    finally:
        engine.dispose()
