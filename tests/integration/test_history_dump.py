"""The history database through a backup and back, row for row: SQLite's online copy restored into a
real PostgreSQL, that dumped portably and restored into an empty SQLite file. Every table's rows,
read back in primary-key order, are the source's exactly: texts, floats to the last bit, and kept log
tails as bytes (arbitrary ones, not UTF-8). A target that holds history is refused unless forced, and
a forced SQLite restore keeps the old file aside."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, select

from federation.history.engine import open_engine
from federation.history.sql_store import SqlHistoryStore
from federation.runtime.backup_manifest import BackupRefused
from federation.runtime.history_dump import (
    PORTABLE_FILE,
    SQLITE_FILE,
    HistoryDumpError,
    dump_history,
    held_rows,
    load_history,
)
from federation.runtime.postgres_process import PostgresProcess
from federation.runtime.restore import check_targets
from tests.history_builders import an_archived_job, an_audit, with_kept_tails

pytestmark = pytest.mark.integration

# Every byte value, twice: what a UTF-8 or text round trip would mangle.
TAIL = bytes(range(256)) * 2


def _rows(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    engine = open_engine(dsn)
    try:
        with engine.connect() as connection:
            meta = MetaData()
            meta.reflect(connection, only=lambda name, _m: name.startswith("history_"))
            out = {}
            for name, table in sorted(meta.tables.items()):
                order = list(table.primary_key.columns) or list(table.columns)
                out[name] = [
                    tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                    for row in connection.execute(select(table).order_by(*order))
                ]
            return out
    finally:
        engine.dispose()


def _source(path: Path) -> str:
    dsn = f"sqlite:///{path}"
    store = SqlHistoryStore.open(dsn)
    try:
        now = time.time()
        jobs = [
            an_archived_job(f"j{i}", tenant=f"t{i % 2}", submitted_at_s=now - 7200 - i / 3) for i in range(5)
        ]
        jobs[0] = with_kept_tails(jobs[0], {("worker", 0): TAIL, ("master", 0): b""}, kept_at_s=now - 60)
        store.write_jobs(jobs)
        store.write_audit([an_audit(f"a{i}", now - i * 0.1) for i in range(3)])
    finally:
        store.close()
    return dsn


def test_history_comes_back_row_for_row_across_backends(
    tmp_path: Path, postgres_process: PostgresProcess
) -> None:
    source = _source(tmp_path / "source.sqlite3")
    expected = _rows(source)
    assert expected["history_kept_logs"]
    assert expected["history_jobs"]
    first = tmp_path / "b1"
    first.mkdir()
    dump = dump_history(source, first)
    assert dump.file == SQLITE_FILE
    assert dump.rows_by_table["history_jobs"] == 5

    postgres = postgres_process.create_database(f"dump_{int(time.time() * 1000) % 10**9}")
    counts, kept = load_history(first / dump.file, postgres, expected=dump.rows_by_table)
    assert kept is None
    assert counts == dump.rows_by_table
    assert _rows(postgres) == expected
    # Again into the same database, now holding history: its tables are replaced in one transaction.
    with pytest.raises(BackupRefused, match="already holds rows"):
        check_targets(None, postgres, force=False)
    load_history(first / dump.file, postgres, expected=dump.rows_by_table)
    assert _rows(postgres) == expected

    second = tmp_path / "b2"
    second.mkdir()
    again = dump_history(postgres, second)
    assert again.file == PORTABLE_FILE
    assert again.rows_by_table == dump.rows_by_table
    target = f"sqlite:///{tmp_path / 'target.sqlite3'}"
    load_history(second / again.file, target, expected=again.rows_by_table)
    assert _rows(target) == expected


def test_a_target_with_history_is_refused_unless_forced_and_kept_aside(tmp_path: Path) -> None:
    source = _source(tmp_path / "source.sqlite3")
    backup = tmp_path / "b"
    backup.mkdir()
    dump = dump_history(source, backup)
    occupied = _source(tmp_path / "occupied.sqlite3")
    before = (tmp_path / "occupied.sqlite3").read_bytes()
    with pytest.raises(BackupRefused, match=r"already holds rows \(history_attempts 5, history_audit 3"):
        check_targets(None, occupied, force=False)
    assert held_rows(occupied)["history_jobs"] == 5
    check_targets(None, occupied, force=True)
    _, kept = load_history(backup / dump.file, occupied, expected=dump.rows_by_table, keep_aside=True)
    assert kept is not None
    assert kept.read_bytes() == before
    assert _rows(occupied) == _rows(source)


def test_a_history_from_a_newer_gpufed_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    source = _source(tmp_path / "source.sqlite3")
    engine = open_engine(source)
    with engine.begin() as connection:
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    engine.dispose()
    backup = tmp_path / "b"
    backup.mkdir()
    dump = dump_history(source, backup)
    assert dump.revision == "9999"
    target = tmp_path / "target.sqlite3"
    with pytest.raises(HistoryDumpError, match="history schema is unknown to this gpufed"):
        load_history(backup / dump.file, f"sqlite:///{target}", expected=dump.rows_by_table)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("target")) == []
