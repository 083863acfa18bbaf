"""Preemption carried out: the scheduler orders it, the reconciler evicts with the grace period and
requeues the victim at its old position, and the victim runs again once there is room."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from federation.store.records import ApprovalRecord, SchedulingSettings, TenantRecord
from placement.model import GpuQuota, GpuType, JobPhase, PolicyConfig, TenantId, WaitCode
from tests.unit.reconcile_world import World, a_job, build_world, submit

A100 = GpuType("A100")
GRACE_S = 20.0

# One private cluster of 16 A100 (2 nodes x 8). Each team is guaranteed half and may borrow the rest.
TENANTS = (
    TenantRecord(TenantId("vision"), quotas=(GpuQuota(A100, guaranteed_gpus=8, borrowing_limit_gpus=8),)),
    TenantRecord(TenantId("nlp"), quotas=(GpuQuota(A100, guaranteed_gpus=8, borrowing_limit_gpus=8),)),
)
SETTINGS = SchedulingSettings(policy=PolicyConfig(default_grace_period_s=GRACE_S))


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with build_world(tenants=TENANTS, settings=SETTINGS) as w:
        yield w


async def test_a_guarantee_is_reclaimed_from_a_borrower_who_runs_again_later_at_its_old_place(
    world: World,
) -> None:
    borrower = await submit(world, a_job("borrower", tenant="nlp", gpus=8, duration="10m", queued_at_s=900.0))
    await world.step()
    assert (await world.job(borrower)).phase is JobPhase.RUNNING  # all 16 GPUs, 8 of them borrowed

    owner = await submit(world, a_job("owner", tenant="vision", gpus=4, duration="60s"))
    await world.step()
    victim = await world.job(borrower)
    assert victim.preemption is not None
    assert victim.preemption.for_job == owner
    assert victim.preemption.reason == "reclaim_guarantee"
    # The grace period: the gang keeps running, and the owner waits for it.
    assert victim.phase is JobPhase.RUNNING
    assert (await world.job(owner)).phase is JobPhase.QUEUED

    await world.step(GRACE_S + 1)
    victim = await world.job(borrower)
    assert victim.phase is not JobPhase.RUNNING or victim.attempt == 2
    assert victim.attempt == 2
    assert victim.retries_used == 0, "a preemption is not the job's fault"
    assert victim.queued_at_s == 900.0, "requeued at its original position"
    assert victim.preemption is None
    assert "preempted for" in " ".join(e.reason for e in victim.events)
    assert (await world.job(owner)).phase is JobPhase.RUNNING

    # Only one attempt of the borrower ever ran at a time, and the first is gone from the cluster.
    assert {(s.job_id, s.attempt) for s in world.cluster.running_gangs()} & {(borrower, 1)} == set()

    await world.step(61)
    assert (await world.job(owner)).phase is JobPhase.SUCCEEDED
    await world.step()
    back = await world.job(borrower)
    assert back.phase is JobPhase.RUNNING
    assert back.attempt == 2


async def test_within_a_tenant_a_higher_priority_evicts_a_lower_one(world: World) -> None:
    # Each team runs 8 GPUs, within its guarantee: the cluster is full and no one borrows, so the
    # only room for vision's high job is vision's own low one.
    low = await submit(
        world, a_job("low", tenant="vision", gpus=4, duration="10m", priority_class="low", priority=100)
    )
    other = await submit(world, a_job("other", tenant="nlp", gpus=4, duration="10m"))
    await world.step()
    assert (await world.job(low)).phase is JobPhase.RUNNING
    assert (await world.job(other)).phase is JobPhase.RUNNING
    high = await submit(
        world, a_job("high", tenant="vision", gpus=4, duration="1m", priority_class="high", priority=10_000)
    )
    await world.step()
    order = (await world.job(low)).preemption
    assert order is not None
    assert order.for_job == high
    assert order.reason == "lower_priority"
    await world.step(GRACE_S + 1)
    assert (await world.job(high)).phase is JobPhase.RUNNING
    assert (await world.job(low)).phase is JobPhase.QUEUED
    assert (await world.job(other)).preemption is None, "nlp is within its guarantee: not a victim"
    assert (await world.job(other)).attempt == 1


async def test_an_urgent_job_waits_for_an_approval_and_runs_once_an_admin_grants_one(world: World) -> None:
    urgent = await submit(
        world,
        a_job("paper", tenant="vision", gpus=4, duration="1m", priority_class="urgent", priority=100_000),
    )
    await world.step()
    assert (await world.job(urgent)).phase is JobPhase.QUEUED
    codes = {r.code for r in await world.store.get_wait_reasons(urgent)}
    assert WaitCode.APPROVAL_REQUIRED in codes

    now = world.clock.now
    await world.store.put_approval(
        ApprovalRecord("a1", TenantId("vision"), "urgent", now + 3600, "CVPR deadline", "admin", now)
    )
    await world.step(5)  # past the inputs' refresh interval
    assert (await world.job(urgent)).phase is JobPhase.RUNNING
