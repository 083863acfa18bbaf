"""The history schema's migrations, on SQLite and on a real PostgreSQL: from an empty database to
the newest revision, from the previous revision with rows in it, and the newest revision agreeing
with the metadata the queries are written against."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import func, inspect, select

from federation.errors import InvalidArgument
from federation.history import rows, schema
from federation.history.engine import current_revision, migrate, open_engine, parse_dsn
from federation.history.model import ArchivedJob, GroupBy, KeptLog, UsageQuery
from federation.history.sql_store import SqlHistoryStore
from placement.model import JobId
from tests.history_builders import BACKENDS, an_archived_job, an_interval, fresh_dsn

NEWEST = "0003"
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
                connection.execute(schema.intervals.insert(), [rows.interval_row(iv) for iv in job.intervals])
                connection.execute(
                    schema.usage_days.insert(), [d for iv in job.intervals for d in rows.usage_day_rows(iv)]
                )
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
        before = SqlHistoryStore(engine)
        # 0002's write path is today's minus the tails table: write with no tails, as 0002 did.
        jobs = [_spanning_march("j1", "t1"), _spanning_march("j2", "t2")]
        assert before.write_jobs(jobs) == 2
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
