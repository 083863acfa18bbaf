"""The history schema's migrations, on SQLite and on a real PostgreSQL: from an empty database to
the newest revision, from the previous revision with rows in it, and the newest revision agreeing
with the metadata the queries are written against."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from federation.errors import InvalidArgument
from federation.history import schema
from federation.history.engine import current_revision, migrate, open_engine, parse_dsn
from federation.history.model import GroupBy, UsageQuery
from federation.history.sql_store import SqlHistoryStore
from placement.model import JobId
from tests.history_builders import BACKENDS, an_archived_job, fresh_dsn

NEWEST = "0002"


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
        SqlHistoryStore(engine).write_jobs([an_archived_job("j1"), an_archived_job("j2", tenant="t2")])
        migrate(engine)
        assert current_revision(engine) == NEWEST
        assert "ix_history_usage_days_tenant_day" in {
            ix["name"] for ix in inspect(engine).get_indexes("history_usage_days")
        }
        store = SqlHistoryStore(engine)
        assert store.get_job(JobId("j1")) == an_archived_job("j1")
        rows = store.usage(UsageQuery(since_s=0, until_s=10_000, group_by=(GroupBy.TENANT,)))
        assert [(r.keys, r.gpu_hours) for r in rows] == [(("t1",), 8.0), (("t2",), 8.0)]
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
