"""The archiver's read of an ended job takes the job cache's record where etcd holds it at the same
mod revision (the same bytes) instead of decoding it again (issue 33), and etcd's where it does not:
a record written after the cache's copy (or another job's copy) is never taken for it."""

from __future__ import annotations

import asyncio

from federation.store.archive_txn import read_jobs
from federation.store.job_store import KvStore, Stored
from federation.store.jobs import Owner
from federation.store.kv_memory import MemoryKv
from placement.model import JobId, JobPhase
from tests.conftest import build_job


def test_the_cache_record_at_etcds_revision_is_taken_and_any_other_is_not() -> None:
    async def scenario() -> None:
        kv = MemoryKv()
        store = KvStore(kv)
        first, _ = await store.create_job(build_job("a"), idempotency_key="ka", manifest_digest="d")
        other, _ = await store.create_job(build_job("b"), idempotency_key="kb", manifest_digest="d")
        # Taken as it is: the same object, not a decode of the same bytes.
        (same,) = await read_jobs(kv, [(JobId("a"), 1)], known=[first])
        assert same is not None
        assert same.job is first
        # Another job's record is never taken for this one, even at a revision that matched.
        (not_b,) = await read_jobs(kv, [(JobId("a"), 1)], known=[other])
        assert not_b is not None
        assert not_b.job.value.job_id == "a"
        # Written since the cache's copy: etcd's newer record, decoded.
        cancelled = first.value.transition(JobPhase.CANCELLED, by=Owner.DISPATCHER, at_s=5.0)
        revision = await store.commit([(cancelled, first.mod_revision)])
        assert revision is not None
        (newer,) = await read_jobs(kv, [(JobId("a"), 1)], known=[first])
        assert newer is not None
        assert newer.job == Stored(cancelled, revision)
        assert newer.job.value.phase is JobPhase.CANCELLED

    asyncio.run(scenario())
