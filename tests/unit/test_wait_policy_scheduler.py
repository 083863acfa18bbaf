"""The scheduler records each attempt's burst-at-once alternative (`JobRecord.burst_offer`, issue 35)
once per attempt, and a tenant's cost policy reaches the placer.

The world: `onprem` (private, 2 nodes of 8 A100 at $1.10) and `cloud` (on demand at $4.00). Two
8-GPU jobs fill onprem; their one-hour limits free it within the 80 minutes an 8-GPU-hour job may
wait at 600 s per GPU-hour.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import replace

from federation.store.records import SchedulingSettings, TenantRecord
from placement.model import CapacityKind, JobId, JobPhase, PolicyConfig, TenantId, WaitCode
from placement.model_policy import CostPolicy
from tests.unit.reconcile_world import World, a_job, build_world, submit

WAITING = PolicyConfig(
    private_wait_s_per_gpu_hour=600.0, private_wait_needs_start=True, private_wait_reserve=True
)


async def full_private(world: World) -> None:
    for name in ("fill1", "fill2"):
        await submit(world, a_job(name, duration="3000s"))
    await world.step()
    assert {(await world.job(JobId(n))).phase for n in ("fill1", "fill2")} == {JobPhase.RUNNING}


def world_of(cost_policy: CostPolicy) -> AbstractAsyncContextManager[World]:
    tenant = TenantRecord(name=TenantId("vision"), cost_policy=cost_policy)
    return build_world(cluster_count=2, tenants=(tenant,), settings=SchedulingSettings(policy=WAITING))


async def test_a_waiting_job_records_what_bursting_at_once_would_cost_once_per_attempt() -> None:
    async with world_of(CostPolicy.BALANCED) as world:
        await full_private(world)
        job_id = await submit(world, a_job("big", queued_at_s=world.clock.now))
        await world.step()
        job = await world.job(job_id)
        assert job.phase is JobPhase.QUEUED
        reasons = await world.store.get_wait_reasons(job_id)
        wait = next(r for r in reasons if r.code is WaitCode.WAITING_FOR_PRIVATE_CAPACITY)
        assert "saves an estimated" in wait.message
        assert "bursting now to cloud (A100, on-demand)" in wait.message
        offer = job.burst_offer
        assert offer is not None
        assert (offer.cluster, offer.kind, offer.usd_per_gpu_hour, offer.attempt) == (
            "cloud",
            CapacityKind.ON_DEMAND,
            4.0,
            1,
        )
        stored = await world.store.get_job(job_id)
        assert stored is not None
        revision = stored.mod_revision
        await world.step(60.0)
        again = await world.store.get_job(job_id)
        assert again is not None
        assert again.value.burst_offer == offer, "kept unchanged in later cycles"
        assert again.mod_revision == revision, "no write per cycle"
        # A new attempt gets its own.
        await world.store.commit([(replace(again.value, attempt=2), again.mod_revision)])
        await world.step(60.0)
        second = await world.job(job_id)
        assert second.burst_offer is not None
        assert second.burst_offer.attempt == 2
        assert second.burst_offer.seen_at_s == world.clock.now


async def test_a_fast_tenant_bursts_at_once_and_its_admission_carries_the_offer() -> None:
    async with world_of(CostPolicy.FAST) as world:
        await full_private(world)
        job_id = await submit(world, a_job("big", queued_at_s=world.clock.now))
        await world.step()
        job = await world.job(job_id)
        assert job.placement is not None
        assert job.placement.cluster == "cloud"
        assert job.burst_offer is not None
        assert job.burst_offer.cluster == "cloud"


async def test_a_job_placed_on_idle_private_gpus_at_once_has_nothing_to_burst_to() -> None:
    async with world_of(CostPolicy.BALANCED) as world:
        job_id = await submit(world, a_job("small"))
        await world.step()
        job = await world.job(job_id)
        assert job.placement is not None
        assert job.placement.cluster == "onprem"
        assert job.burst_offer is None
