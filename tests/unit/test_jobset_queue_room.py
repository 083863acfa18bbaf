"""The set controller releases a job set's held members only into the room the queue limits leave,
counting the members it has just released, however far the job cache trails its writes.

The room is read from the job cache (`QueueLimits.room`), which learns of a release's jobs from
etcd's watch a moment after the release's transaction. The controller released again at once (a
release is at most `MAX_RELEASE_PER_TXN`, and more may fit), and on a busy server read the room
before its cache had the jobs just released: the same room again, and a set released past the limit
(in process, where nothing yields to the cache's watch between two releases, every member at once;
against etcd, whenever its watch is slower than the controller's next read). It now
waits for its cache to show its own last release before it reads the room again, and releases
nothing while the cache trails.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import pytest

from federation.api.service import JobService
from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CallContext
from federation.jobsets import controller as set_controller
from federation.jobsets.controller import SetController
from federation.jobsets.records import MemberState
from federation.store.job_cache import JobCache
from federation.store.job_store import KvStore
from federation.store.kv_memory import MemoryKv
from federation.store.records import Role, TenantRecord, UserRecord
from placement.model import JobId, JobPhase, TenantId
from tests.e2e.harness import manifest
from tests.unit.job_service import running_service

PEER = "ipv4:127.0.0.1:40000"
VISION = TenantId("vision")


@dataclass
class World:
    store: KvStore
    cache: JobCache
    service: JobService

    def controller(self) -> SetController:
        assert self.service.job_sets is not None
        return self.service.job_sets.controller

    async def queued_in_store(self) -> int:
        jobs, _ = await self.store.list_jobs()
        return sum(1 for s in jobs if s.value.tenant == VISION and s.value.phase is JobPhase.QUEUED)

    async def released(self, name: str) -> int:
        assert self.service.job_sets is not None
        stored = await self.service.job_sets.sets.get(VISION, name)
        assert stored is not None
        return sum(1 for m in stored.value.members if m.state is MemberState.RELEASED)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    """Tenant vision may queue 2 jobs; alice submits to it."""
    store = KvStore(MemoryKv())
    await store.put_tenant(TenantRecord(VISION, max_queued_jobs=2))
    await store.put_user(UserRecord("alice", VISION, Role.MEMBER))
    await store.put_token("alice", "alice")
    async with running_service(store) as (cache, service):
        yield World(store, cache, service)


async def _full_queue_and_a_held_array(world: World) -> JobId:
    """Two queued jobs (the limit) and an array of four, all held; the first job is then cancelled,
    which leaves room for one. Returns the cancelled job's id."""
    ctx = CallContext("alice", PEER)
    first = await world.service.SubmitJob(pb.SubmitJobRequest(manifest=manifest("a1")), ctx)  # type: ignore[arg-type]
    await world.service.SubmitJob(pb.SubmitJobRequest(manifest=manifest("a2")), ctx)  # type: ignore[arg-type]
    request = pb.SubmitJobSetRequest(name="shard", manifests=[manifest("shard")], array="0-3")
    reply = await world.service.SubmitJobSet(request, ctx)  # type: ignore[arg-type]
    assert sum(1 for m in reply.job_set.members if m.held) == 4, reply
    stored = await world.store.get_job(JobId(first.job_id))
    assert stored is not None
    revision = await world.store.commit(
        [(replace(stored.value, phase=JobPhase.CANCELLED), stored.mod_revision)]
    )
    assert revision is not None
    assert await world.cache.wait_for_revision(revision)
    return JobId(first.job_id)


async def test_a_cache_behind_the_controllers_own_release_lets_no_more_through(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _full_queue_and_a_held_array(world)
    # The cache stops where it is: up to date now, it will not see the release that follows, as a
    # busy server's cache does not for a while.
    await world.cache.stop()
    monkeypatch.setattr(set_controller, "ROOM_WAIT_S", 0.05)
    await world.controller().pass_once()
    assert await world.released("shard") == 1
    assert await world.queued_in_store() == 2, "released past the tenant's maxQueuedJobs"
    # Passes while the cache still trails release nothing more.
    await world.controller().pass_once()
    assert await world.released("shard") == 1


async def test_a_cache_that_keeps_up_releases_into_the_room_and_no_further(world: World) -> None:
    await _full_queue_and_a_held_array(world)
    for _ in range(3):
        await world.controller().pass_once()
    assert await world.released("shard") == 1
    assert await world.queued_in_store() == 2
