"""The job watch yields the record this process wrote, rather than decoding its bytes again, only
when the event carries exactly the bytes written (`federation.store.written`); anything else is
decoded as before, and writes that did not happen leave nothing behind.

Issue 33: the leader decoded every record it had just written, five a job, when its job cache's
watch brought them back."""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace

import pytest

from federation.store.job_store import JobEvent, JobEventType, KvStore, job_key
from federation.store.jobs import JobRecord, job_from_json, job_to_dict
from federation.store.kv import Put
from federation.store.kv_memory import MemoryKv
from federation.store.schema_version import dumps
from federation.store.written import CHECK_ENV, WrittenRecordDiffers, WrittenRecords
from placement.model import JobPhase
from tests.conftest import build_job


async def _events(store: KvStore, start: int, count: int) -> list[JobEvent]:
    out: list[JobEvent] = []
    events = store.watch_jobs(start_revision=start)
    async with contextlib.aclosing(events):
        async for ev in events:
            out.append(ev)
            if len(out) == count:
                break
    return out


async def _created(store: KvStore, job: JobRecord) -> tuple[JobRecord, int]:
    stored, made = await store.create_job(job, idempotency_key=f"k-{job.job_id}", manifest_digest="d")
    assert made
    return stored.value, stored.mod_revision


async def test_own_writes_come_back_as_the_records_written_and_equal_to_their_decoding() -> None:
    kv = MemoryKv()
    store = KvStore(kv)
    created, rev = await _created(store, build_job("a"))
    (first,) = await _events(store, rev, 1)
    assert first.job is created, "not decoded again"
    admitted = replace(created, phase=JobPhase.ADMITTED, message="placed")
    assert await store.commit([(admitted, rev)]) is not None
    (second,) = await _events(store, rev + 1, 1)
    assert second.job is admitted
    # What decoding would have given: the same record.
    now = await kv.get(job_key(admitted.job_id))
    assert now is not None
    assert job_from_json(now.value) == admitted
    assert len(store._written) == 0, "each kept until seen, once"


async def test_a_record_written_by_another_process_is_decoded() -> None:
    kv = MemoryKv()
    ours, theirs = KvStore(kv), KvStore(kv)
    created, rev = await _created(theirs, build_job("b"))
    (ev,) = await _events(ours, rev, 1)
    assert ev.job == created
    assert ev.job is not created


async def test_bytes_that_differ_from_what_was_written_are_decoded() -> None:
    kv = MemoryKv()
    store = KvStore(kv)
    created, rev = await _created(store, build_job("c"))
    # Another writer replaces the record before this process's watch reads it.
    other = replace(created, message="changed elsewhere")
    await kv.put(job_key(created.job_id), dumps(job_to_dict(other)))
    events = await _events(store, rev, 2)
    assert events[0].job is created
    assert events[1].job == other
    assert events[1].job is not other


async def test_a_key_written_again_before_its_watch_saw_it_is_decoded_the_first_time() -> None:
    kv = MemoryKv()
    store = KvStore(kv)
    created, rev = await _created(store, build_job("a2"))
    admitted = replace(created, phase=JobPhase.ADMITTED, message="placed")
    assert await store.commit([(admitted, rev)]) is not None
    first, second = await _events(store, rev, 2)
    assert first.job == created
    assert first.job is not created
    assert second.job is admitted


async def test_a_lost_compare_leaves_nothing_kept() -> None:
    kv = MemoryKv()
    store = KvStore(kv)
    created, rev = await _created(store, build_job("d"))
    await _events(store, rev, 1)
    stale = replace(created, phase=JobPhase.ADMITTED, message="placed")
    assert await store.commit([(stale, rev - 1)]) is None
    assert len(store._written) == 0


async def test_a_write_that_raises_leaves_nothing_kept() -> None:
    class Broken(MemoryKv):
        async def txn_many(self, txns):  # type: ignore[no-untyped-def]
            raise ConnectionError("etcd went away")

        async def txn(self, compares, success, failure=()):  # type: ignore[no-untyped-def]
            raise ConnectionError("etcd went away")

    store = KvStore(Broken())
    with pytest.raises(ConnectionError):
        await store.create_job(build_job("e"), idempotency_key="k", manifest_digest="d")
    assert len(store._written) == 0


async def test_a_deleted_job_is_forgotten_and_the_kept_are_bounded() -> None:
    kv = MemoryKv()
    store = KvStore(kv)
    created, rev = await _created(store, build_job("f"))
    # Seen by no watch of this store (as when its watch broke), then deleted.
    await kv.delete(job_key(created.job_id))
    events = await _events(store, rev + 1, 1)
    assert events[0].type is JobEventType.DELETE
    assert len(store._written) == 0

    kept = WrittenRecords(max_kept=2, check=False)  # placeholder bytes, not a record's encoding
    job = build_job("g")
    for n in range(5):
        kept.add(f"k{n}".encode(), b"v", job)
    assert len(kept) == 2
    assert kept.take(b"k4", b"v") is job
    assert kept.take(b"k0", b"v") is None


async def test_a_put_through_the_kv_alone_is_not_taken_for_a_write_of_the_store() -> None:
    kv = MemoryKv()
    store = KvStore(kv)
    job = build_job("h")
    # The bytes a create would write, put by something else: nothing was kept for them.
    await kv.txn([], [Put(job_key(job.job_id), dumps(job_to_dict(job)))])
    (ev,) = await _events(store, 1, 1)
    assert ev.job == job
    assert ev.job is not job


def test_under_the_check_a_record_unlike_its_decoding_stops_the_process() -> None:
    """The shortcut rests on a record equalling the decoding of its encoding. Under the test suite's
    check (`CHECK_ENV`, which tests/conftest.py sets for every test and the servers they start), a
    record held in a form its bytes do not decode to (here its events as a list, which decode as a
    tuple) raises a `BaseException`, which no `except Exception` on the watch's way can turn into a
    relist; without the check it is handed back as written."""
    job = build_job("a")
    unlike = replace(job, events=list(job.events))  # type: ignore[arg-type]
    key, value = job_key(job.job_id), dumps(job_to_dict(unlike))
    assert job_from_json(value) == job
    assert unlike != job

    checked = WrittenRecords(check=True)
    checked.add(key, value, unlike)
    with pytest.raises(WrittenRecordDiffers, match=r"differs from its decoding in \['events'\]"):
        checked.take(key, value)
    assert not isinstance(WrittenRecordDiffers("x"), Exception)

    unchecked = WrittenRecords(check=False)
    unchecked.add(key, value, unlike)
    assert unchecked.take(key, value) is unlike


def test_the_suite_runs_with_the_check_on() -> None:
    assert os.environ.get(CHECK_ENV) == "1"
    assert WrittenRecords()._check
