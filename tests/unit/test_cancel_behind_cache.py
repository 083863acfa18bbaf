"""A cancel made while this server's job cache trails etcd still goes through.

CancelJob reads the job from the cache (as every read of one's own job does) and commits the
cancel request against that record's revision. When the leader has just written the job (a phase
change a moment before the user's cancel) and the watch has not brought it yet, that commit fails
its compare. The retry must then commit against the record read from etcd: retrying from the
cache again met the same stale revision each time, and after five tries in 50 ms the user was told
"changing too fast to cancel" about a job nothing was changing any more (a busy server's cache
trails by longer than that).

The store's watch is held back by a gate, as in test_submit_read_your_writes.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import pytest

from federation.api.service import JobService
from federation.api.v1 import gpufed_pb2 as pb
from federation.store.job_cache import JobCache
from placement.model import JobId
from tests.e2e.harness import manifest
from tests.unit.job_service import GatedStore, as_user, gated_service_for_alice


@dataclass
class World:
    store: GatedStore
    cache: JobCache
    service: JobService


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with gated_service_for_alice() as (store, cache, service):
        yield World(store, cache, service)


async def test_a_cancel_while_the_cache_trails_a_write_commits_against_etcds_record(world: World) -> None:
    ctx = as_user("alice")
    submitted = await world.service.SubmitJob(pb.SubmitJobRequest(manifest=manifest("train")), ctx)
    job_id = JobId(submitted.job_id)
    assert world.cache.get(job_id) is not None

    # The leader writes the job (here: its message) while this server's watch is held back.
    world.store.gate.clear()
    stored = await world.store.get_job(job_id)
    assert stored is not None
    written = replace(stored.value, message="the leader's write")
    assert await world.store.commit([(written, stored.mod_revision)]) is not None
    cached = world.cache.get(job_id)
    assert cached is not None
    assert cached.mod_revision == stored.mod_revision, "the cache trails the leader's write"

    shown = await world.service.CancelJob(pb.CancelJobRequest(job_id=job_id, reason="not needed"), ctx)
    assert shown.cancel_requested
    after = await world.store.get_job(job_id)
    assert after is not None
    assert after.value.cancel_requested
    assert after.value.message == "not needed"
    world.store.gate.set()
