"""A move carried out: the scheduler orders a resumable cloud gang back to idle private GPUs, the
reconciler stops it with the grace period and requeues it at its old position without charging a
retry, and the next cycle starts it on the private cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from federation.store.jobs import JobRecord
from federation.store.records import SchedulingSettings, TenantRecord
from placement.model import CapacityKind, GpuQuota, GpuType, JobPhase, PolicyConfig, TenantId
from tests.unit.reconcile_world import World, a_job, build_world, submit

A100 = GpuType("A100")
GRACE_S = 20.0
DAY_S = 86_400

TENANTS = (
    TenantRecord(TenantId("vision"), quotas=(GpuQuota(A100, guaranteed_gpus=16, borrowing_limit_gpus=32),)),
)
SETTINGS = SchedulingSettings(
    policy=PolicyConfig(default_grace_period_s=GRACE_S, repatriate=True, repatriate_min_saving_usd=100.0)
)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    # "onprem" (private, 16 A100 at 1.1 USD/GPU-h) and "cloud" (on demand, 4.0 USD/GPU-h).
    async with build_world(cluster_count=2, tenants=TENANTS, settings=SETTINGS) as w:
        yield w


def _day_long(name: str, *, resumable: bool, queued_at_s: float) -> JobRecord:
    job = a_job(name, gpus=4, duration="10h", queued_at_s=queued_at_s)
    return replace(job, spec=replace(job.spec, resumable=resumable, max_runtime_s=DAY_S))


async def test_a_resumable_cloud_gang_is_stopped_requeued_at_its_place_and_started_on_private(
    world: World,
) -> None:
    blocker = await submit(world, a_job("blocker", gpus=8, duration="60s", queued_at_s=100.0))
    await world.step()
    long = await submit(world, _day_long("long", resumable=True, queued_at_s=900.0))
    await world.step()
    assert (await world.job(long)).placement is not None
    assert (await world.job(long)).placement.cluster == "cloud"  # type: ignore[union-attr]

    # The blocker ends: 16 private GPUs idle, nothing queued. The move is ordered; the gang keeps
    # running through its grace period, to write its checkpoint.
    await world.step(61)
    assert (await world.job(blocker)).phase is JobPhase.SUCCEEDED
    ordered = await world.job(long)
    assert ordered.preemption is not None
    assert (ordered.preemption.for_job, ordered.preemption.move_to) == (long, "onprem")
    assert ordered.preemption.grace_period_s == GRACE_S
    assert ordered.phase is JobPhase.RUNNING
    assert ordered.attempt == 1

    await world.step(GRACE_S + 1)
    moved = await world.job(long)
    assert moved.attempt == 2
    assert moved.retries_used == 0, "a move is not the job's fault"
    assert moved.queued_at_s == 900.0, "requeued at its original position"
    assert moved.preemption is None
    assert moved.placement is not None
    assert (moved.placement.cluster, moved.placement.kind) == ("onprem", CapacityKind.PRIVATE)
    requeue = next(e for e in moved.events if e.phase is JobPhase.QUEUED and e.attempt == 2)
    assert "stopped at a checkpoint to move to cluster onprem" in requeue.reason
    assert "preempted for" not in requeue.reason
    # The cloud copy is gone: only the second attempt runs, on the private cluster.
    running = {(s.job_id, s.attempt) for c in world.clusters.values() for s in c.running_gangs()}
    assert (long, 1) not in running

    # Once on private GPUs it is never moved again.
    await world.step(60)
    again = await world.job(long)
    assert (again.attempt, again.preemption) == (2, None)


async def test_a_cloud_gang_that_does_not_say_it_resumes_stays_in_the_cloud(world: World) -> None:
    await submit(world, a_job("blocker", gpus=8, duration="60s", queued_at_s=100.0))
    await world.step()
    stays = await submit(world, _day_long("stays", resumable=False, queued_at_s=900.0))
    await world.step()
    await world.step(61)
    await world.step(GRACE_S + 1)
    job = await world.job(stays)
    assert (job.attempt, job.preemption, job.phase) == (1, None, JobPhase.RUNNING)
    assert job.placement is not None
    assert job.placement.cluster == "cloud"


async def test_the_room_a_move_is_for_is_held_until_the_moved_job_is_requeued(world: World) -> None:
    # Two resumable 8-GPU gangs in the cloud; once the short blocker ends, the private cluster has
    # room for one of them (the other 8 private GPUs run a long job).
    await submit(world, a_job("blocker", gpus=4, duration="60s", queued_at_s=100.0))
    await submit(world, a_job("resident", gpus=4, duration="10h", queued_at_s=101.0))
    await world.step()
    first = await submit(world, _day_long("first", resumable=True, queued_at_s=900.0))
    second = await submit(world, _day_long("second", resumable=True, queued_at_s=901.0))
    await world.step()
    assert {(await world.job(j)).placement.cluster for j in (first, second)} == {"cloud"}  # type: ignore[union-attr]

    # Cycles run through the grace period while the 8 private GPUs the move is for look idle: one
    # move is ordered, not one per cycle, and no second gang is stopped for the same room.
    await world.step(61)
    for _ in range(4):
        await world.step(GRACE_S / 5)
    jobs = [await world.job(j) for j in (first, second)]
    assert sum(1 for j in jobs if j.preemption is not None or j.attempt > 1) == 1, jobs

    # The moved one is requeued and starts on the private GPUs; the other keeps running in the cloud.
    await world.step(GRACE_S)
    both = [await world.job(j) for j in (first, second)]
    moved, stayed = sorted(both, key=lambda j: -j.attempt)
    assert moved.attempt == 2
    assert moved.placement is not None
    assert moved.placement.cluster == "onprem"
    assert (stayed.attempt, stayed.preemption) == (1, None)
    assert stayed.placement is not None
    assert stayed.placement.cluster == "cloud"
