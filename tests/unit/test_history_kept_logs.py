"""Kept log tails in the history store, on SQLite and a real PostgreSQL: written with their job in
its one transaction, read back byte for byte, never doubled by a second write, and pruned by the
time they were kept, a bounded batch at a time."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import event

from federation.errors import InvalidArgument
from federation.history.model import ArchivedJob, KeptLog
from federation.history.rows import record_json
from federation.history.sql_store import SqlHistoryStore
from placement.model import JobId
from tests.history_builders import BACKENDS, an_archived_job, fresh_dsn, open_store

# Every byte value, a NUL, invalid UTF-8 and a line without its newline: a text column would mangle it.
BINARY = bytes(range(256)) + b"\x00\xff\xfe not utf-8 \xc3\x28\n2026-11-27T10:00:00Z last"


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlHistoryStore]:
    yield from open_store(fresh_dsn(request.param, tmp_path, request))


def with_tails(job_id: str, *, kept_at_s: float = 5000.0, big: int = 0) -> ArchivedJob:
    job = an_archived_job(job_id)
    tails = (
        KeptLog(job_id, 1, "master", 0, kept_at_s, BINARY),
        KeptLog(job_id, 1, "worker", 0, kept_at_s, b"x" * big or b"t1 line\n"),
        KeptLog(job_id, 1, "worker", 1, kept_at_s, b""),
    )
    return replace(job, logs=tails)


def test_tails_read_back_byte_for_byte_by_task_and_replica(store: SqlHistoryStore) -> None:
    job = with_tails("j1", big=256 * 1024)
    assert store.write_jobs([job]) == 1
    got = store.kept_logs(JobId("j1"), 1)
    assert got == sorted(job.logs, key=lambda k: (k.task, k.replica))
    assert got[0].data == BINARY
    assert isinstance(got[0].data, bytes)
    assert len(got[1].data) == 256 * 1024
    assert store.kept_logs(JobId("j1"), 2) == []
    assert store.kept_logs(JobId("other"), 1) == []
    assert store.counts().kept_logs == 3
    # The job reads back whole without its tails (get_job never loads them).
    found = store.get_job(JobId("j1"))
    assert found is not None
    assert found.logs == ()
    assert found == replace(job, logs=())


def test_a_second_write_of_the_job_neither_doubles_nor_changes_its_tails(store: SqlHistoryStore) -> None:
    # What a crash between the SQL commit and the etcd delete brings: the same job again; and a
    # deposed leader's copy with other bytes: the first copy stays.
    first = with_tails("j1")
    store.write_jobs([first])
    changed = replace(first, logs=tuple(replace(k, data=b"changed") for k in first.logs))
    assert store.write_jobs([first, changed, with_tails("j2")]) == 1
    assert store.counts().kept_logs == 6
    assert [k.data for k in store.kept_logs(JobId("j1"), 1)] == [k.data for k in first.logs]


def test_a_job_written_without_its_tails_gains_them_on_a_rewrite(store: SqlHistoryStore) -> None:
    """A job an older archiver wrote (no tails) before a crash kept it in etcd: the next pass's
    write adds its tails, so the archiver can delete them from etcd."""
    job = with_tails("j1")
    assert store.write_jobs([replace(job, logs=())]) == 1
    assert store.kept_logs(JobId("j1"), 1) == []
    assert store.write_jobs([job]) == 0
    assert [k.data for k in store.kept_logs(JobId("j1"), 1)] == [k.data for k in job.logs]


def test_prune_deletes_only_tails_kept_before_the_cut_oldest_first_in_batches(store: SqlHistoryStore) -> None:
    for i in range(5):
        store.write_jobs([with_tails(f"old{i}", kept_at_s=1000.0 + i)])
    store.write_jobs([with_tails("fresh", kept_at_s=9000.0)])
    assert store.counts().kept_logs == 18

    assert store.prune_kept_logs(kept_before_s=2000.0, limit=4) == 4
    # The oldest went first: old0's three tails and one of old1's.
    assert store.kept_logs(JobId("old0"), 1) == []
    assert len(store.kept_logs(JobId("old1"), 1)) == 2
    assert store.prune_kept_logs(kept_before_s=2000.0, limit=100) == 11
    assert store.prune_kept_logs(kept_before_s=2000.0, limit=100) == 0
    assert store.counts().kept_logs == 3
    assert len(store.kept_logs(JobId("fresh"), 1)) == 3
    # The jobs themselves stay: only their tails expire.
    assert store.counts().jobs == 6


def test_a_tail_of_another_job_or_attempt_zero_is_refused() -> None:
    job = an_archived_job("j1")
    with pytest.raises(InvalidArgument, match="logs\\[0\\] belongs to job j2"):
        replace(job, logs=(KeptLog("j2", 1, "worker", 0, 1.0, b""),))
    with pytest.raises(InvalidArgument, match="attempts start at 1"):
        KeptLog("j1", 0, "worker", 0, 1.0, b"")


def test_held_copies_read_a_batch_records_and_tails_in_two_queries(store: SqlHistoryStore) -> None:
    """The archiver's check before it deletes from etcd reads what SQL holds of a whole batch at
    once: each archived job's record as stored and its tails of every attempt, its own only."""
    two = replace(with_tails("j2"), logs=(*with_tails("j2").logs, KeptLog("j2", 2, "master", 0, 1.0, b"a2")))
    assert store.write_jobs([with_tails("j1"), two, an_archived_job("j3")]) == 3
    statements: list[str] = []

    def listener(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(store.engine, "before_cursor_execute", listener)
    try:
        held = store.held_copies([JobId("j1"), JobId("j2"), JobId("j3"), JobId("not-archived")])
    finally:
        event.remove(store.engine, "before_cursor_execute", listener)

    assert len(statements) == 2
    assert set(held) == {"j1", "j2", "j3"}
    assert held[JobId("j1")].logs == {(k.attempt, k.task, k.replica): k.data for k in with_tails("j1").logs}
    assert held[JobId("j1")].logs[(1, "master", 0)] == BINARY
    assert held[JobId("j2")].logs[(2, "master", 0)] == b"a2"
    assert held[JobId("j3")].logs == {}
    found = store.get_job(JobId("j2"))
    assert found is not None
    assert held[JobId("j2")].record_json == record_json(found.record)
