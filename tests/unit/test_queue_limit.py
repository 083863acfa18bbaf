"""Queue limits (`federation/api/queue_limit.py`): a submission that would take a tenant's queue, or
the federation's, past its `maxQueuedJobs` is refused with RESOURCE_EXHAUSTED and stores nothing; a
neighbour's submissions and an accepted key's retry go through; a job set's members are released
only into the room left; the limits are read from the config and the tenant document, with a
clear error for a bad value."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import grpc
import pytest

from federation.api.queue_limit import QueueCounts, refusal, room
from federation.api.service import JobService
from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CallRefused
from federation.errors import InvalidSpec
from federation.jobsets.decide import held_reason, to_release
from federation.jobsets.records import JobSetRecord, MemberState, SetMember, SetTemplate
from federation.store.config_policy import parse_settings, parse_tenant, tenant_document
from federation.store.job_cache import JobCache
from federation.store.job_store import KvStore
from federation.store.jobs import Owner
from federation.store.kv_memory import MemoryKv
from federation.store.records import (
    DEFAULT_MAX_QUEUED_JOBS,
    DEFAULT_MAX_QUEUED_JOBS_PER_TENANT,
    Role,
    SchedulingSettings,
    TenantRecord,
    UserRecord,
    settings_from_dict,
    settings_to_dict,
    tenant_from_dict,
    tenant_to_dict,
)
from placement.model import JobId, JobPhase, TenantId
from tests.e2e.harness import manifest
from tests.unit.job_service import as_user, running_service


@dataclass
class World:
    store: KvStore
    cache: JobCache
    service: JobService

    async def submit(self, user: str, name: str, key: str = "") -> pb.SubmitJobResponse:
        request = pb.SubmitJobRequest(manifest=manifest(name), idempotency_key=key)
        return await self.service.SubmitJob(request, as_user(user))

    async def refused(self, user: str, name: str) -> CallRefused:
        with pytest.raises(CallRefused) as refused:
            await self.submit(user, name)
        return refused.value

    async def stored_ids(self) -> set[str]:
        jobs, _ = await self.store.list_jobs()
        return {s.value.job_id for s in jobs}


@pytest.fixture
async def world() -> AsyncIterator[World]:
    """Tenant vision may queue 2 jobs (alice); nlp has no limit of its own (bob); the federation
    may queue 4."""
    store = KvStore(MemoryKv())
    await store.put_settings(SchedulingSettings(max_queued_jobs=4))
    await store.put_tenant(TenantRecord(TenantId("vision"), max_queued_jobs=2))
    await store.put_tenant(TenantRecord(TenantId("nlp")))
    for user, tenant in (("alice", "vision"), ("bob", "nlp")):
        await store.put_user(UserRecord(user, TenantId(tenant), Role.MEMBER))
        await store.put_token(user, user)
    async with running_service(store) as (cache, service):
        yield World(store, cache, service)


async def test_a_tenant_past_its_limit_is_refused_and_nothing_is_stored(world: World) -> None:
    await world.submit("alice", "a1")
    await world.submit("alice", "a2")
    before = await world.stored_ids()
    refused = await world.refused("alice", "a3")
    assert refused.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "tenant vision has 2 jobs queued and its limit is 2 (maxQueuedJobs)" in refused.details
    assert await world.stored_ids() == before


async def test_a_neighbour_still_submits_and_learns_nothing_of_the_other_tenants_queue(world: World) -> None:
    await world.submit("alice", "a1")
    await world.submit("alice", "a2")
    await world.refused("alice", "a3")
    # nlp has no limit of its own: it queues up to the federation's 4, and is then told the
    # federation's limit, with no count of anyone's jobs (vision's two are not its business).
    await world.submit("bob", "b1")
    await world.submit("bob", "b2")
    refused = await world.refused("bob", "b3")
    assert refused.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.details.startswith("the federation's queue is full (at most 4 jobs queued")
    assert "vision" not in refused.details
    assert "2" not in refused.details.replace("4", "")


async def test_a_tenant_without_its_own_limit_has_the_federations_default_for_one(world: World) -> None:
    """One team's burst must not fill the federation's whole queue and have every other team
    refused: a tenant whose document sets no limit has `policy.maxQueuedJobsPerTenant`, and the
    tenants with room still submit."""
    await world.store.put_settings(SchedulingSettings(max_queued_jobs=100, max_queued_jobs_per_tenant=3))
    world.service._tenants.forget()  # type: ignore[attr-defined]
    for n in range(3):
        await world.submit("bob", f"b{n}")
    refused = await world.refused("bob", "b3")
    assert refused.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "tenant nlp has 3 jobs queued and its limit is 3 (policy.maxQueuedJobsPerTenant" in refused.details
    await world.submit("alice", "a1")  # vision's own limit (2) is its own, whatever the default


async def test_a_retry_of_an_accepted_submission_is_answered_even_at_the_limit(world: World) -> None:
    first = await world.submit("alice", "a1", key="k-1")
    await world.submit("alice", "a2")
    again = await world.submit("alice", "a1", key="k-1")
    assert (again.job_id, again.created) == (first.job_id, False)


async def test_room_opens_as_queued_jobs_leave_the_queue(world: World) -> None:
    first = await world.submit("alice", "a1")
    await world.submit("alice", "a2")
    await world.refused("alice", "a3")
    # The placer admits one: it holds GPUs now, and no longer counts against the queue.
    stored = await world.store.get_job(JobId(first.job_id))
    assert stored is not None
    admitted = stored.value.transition(JobPhase.ADMITTED, by=Owner.SCHEDULER, at_s=1.0)
    revision = await world.store.commit([(admitted, stored.mod_revision)])
    assert revision is not None
    await world.cache.wait_for_revision(revision)
    assert world.cache.count_in(TenantId("vision"), JobPhase.QUEUED) == 1
    assert (await world.submit("alice", "a3")).created


async def test_the_refusals_are_counted_by_tenant_and_reason(world: World) -> None:
    await world.submit("alice", "a1")
    await world.submit("alice", "a2")
    await world.refused("alice", "a3")
    await world.refused("alice", "a4")
    metric = world.service._metrics.submissions_refused
    assert metric.labels(tenant="vision", reason="queue_full")._value.get() == 2


def _counts(
    tenant_limit: int | None, tenant_queued: int, federation_limit: int | None, queued: int
) -> QueueCounts:
    return QueueCounts(TenantId("vision"), tenant_limit, tenant_queued, federation_limit, queued)


@pytest.mark.parametrize(
    ("counts", "expected_room"),
    [
        pytest.param(_counts(None, 5, None, 50), None, id="no-limits"),
        pytest.param(_counts(10, 5, None, 50), 5, id="tenant"),
        pytest.param(_counts(10, 5, 52, 50), 2, id="federation-tighter"),
        pytest.param(_counts(3, 5, None, 50), 0, id="lowered-below-the-queue"),
    ],
)
def test_room_is_the_tightest_limit_never_negative(counts: QueueCounts, expected_room: int | None) -> None:
    assert room(counts) == expected_room
    fits = expected_room is None or expected_room >= 1
    assert (refusal(counts) is None) is fits


def test_a_set_releases_only_into_the_room_the_queue_leaves() -> None:
    template = SetTemplate(spec=None, priority=0, digest="d")  # type: ignore[arg-type]
    members = tuple(
        SetMember(key=str(i), template=0, array_index=i, job_id=JobId(f"j{i}"), state=MemberState.HELD)
        for i in range(5)
    )
    record = JobSetRecord(
        tenant=TenantId("vision"),
        name="sweep",
        user="alice",
        created_at_s=0.0,
        digest="x",
        max_parallel=0,
        array="0-4",
        templates=(template,),
        members=members,
    )
    assert [m.key for m in to_release(record, lambda _: False).members] == ["0", "1", "2", "3", "4"]
    assert [m.key for m in to_release(record, lambda _: False, queue_room=2).members] == ["0", "1"]
    assert to_release(record, lambda _: False, queue_room=0).members == ()
    assert "queue is at its limit (maxQueuedJobs)" in held_reason(record, live=2, queue_room=0)
    assert "queue" not in held_reason(record, live=2, queue_room=3)
    limited = replace(record, max_parallel=2)
    assert "the set allows at most 2 jobs at once" in held_reason(limited, live=2, queue_room=0)
    assert "queue is at its limit" in held_reason(limited, live=1, queue_room=0)


def test_the_limits_are_read_from_the_config_and_round_trip() -> None:
    tenant = parse_tenant({"name": "vision", "maxQueuedJobs": 500}, "tenant", priority_classes=())
    assert tenant.max_queued_jobs == 500
    assert parse_tenant(tenant_document(tenant), "tenant", priority_classes=()) == tenant
    assert tenant_from_dict(tenant_to_dict(tenant)) == tenant
    assert parse_tenant({"name": "nlp"}, "tenant", priority_classes=()).max_queued_jobs is None

    assert parse_settings({}).max_queued_jobs == DEFAULT_MAX_QUEUED_JOBS
    assert parse_settings({}).max_queued_jobs_per_tenant == DEFAULT_MAX_QUEUED_JOBS_PER_TENANT
    assert parse_settings({"policy": {"maxQueuedJobsPerTenant": 9}}).max_queued_jobs_per_tenant == 9
    assert parse_settings({"policy": {"maxQueuedJobsPerTenant": None}}).max_queued_jobs_per_tenant is None
    assert parse_settings({"policy": {"maxQueuedJobs": 200000}}).max_queued_jobs == 200_000
    assert parse_settings({"policy": {"maxQueuedJobs": None}}).max_queued_jobs is None
    for settings in (
        SchedulingSettings(max_queued_jobs=7, max_queued_jobs_per_tenant=2),
        SchedulingSettings(max_queued_jobs=None, max_queued_jobs_per_tenant=None),
    ):
        assert settings_from_dict(settings_to_dict(settings)) == settings
    # Settings written before the field existed read as the default limit.
    old = settings_to_dict(SchedulingSettings())
    del old["max_queued_jobs"], old["max_queued_jobs_per_tenant"]
    assert settings_from_dict(old).max_queued_jobs == DEFAULT_MAX_QUEUED_JOBS
    assert settings_from_dict(old).max_queued_jobs_per_tenant == DEFAULT_MAX_QUEUED_JOBS_PER_TENANT


@pytest.mark.parametrize("value", [0, -1, "many", 10**12])
def test_a_bad_limit_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(InvalidSpec) as bad:
        parse_tenant({"name": "vision", "maxQueuedJobs": value}, "tenant", priority_classes=())
    assert bad.value.field == "tenant.maxQueuedJobs"
    for key in ("maxQueuedJobs", "maxQueuedJobsPerTenant"):
        with pytest.raises(InvalidSpec) as bad_policy:
            parse_settings({"policy": {key: value}})
        assert bad_policy.value.field == f"policy.{key}"
