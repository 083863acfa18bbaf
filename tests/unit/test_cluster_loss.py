"""A cluster that stops answering: its jobs move on after the grace period, and the copy it kept is
removed when it comes back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from clusters.api import GangPhase
from federation.spec.jobspec import RestartAction, RestartPolicy
from placement.model import JobPhase
from tests.unit.reconcile_world import World, a_job, build_world, submit

GRACE_S = 60.0


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with build_world(cluster_count=2, unreachable_grace_s=GRACE_S) as w:
        yield w


async def test_a_lost_clusters_job_runs_elsewhere_and_the_stale_copy_goes(world: World) -> None:
    onprem, cloud = world.clusters["onprem"], world.clusters["cloud"]
    # No retries allowed: losing a cluster is not the job's fault and must not use one up.
    policy = RestartPolicy(on_eviction=RestartAction.RESTART_JOB, max_retries=0)
    job_id = await submit(world, a_job("moves", duration="10m", policy=policy))
    await world.step()
    job = await world.job(job_id)
    assert job.phase is JobPhase.RUNNING
    assert job.placement is not None
    assert job.placement.cluster == "onprem"

    onprem.set_reachable(False)
    await world.step(GRACE_S / 2)
    assert (await world.job(job_id)).phase is JobPhase.RUNNING, "requeued within the grace period"

    await world.step(GRACE_S)
    job = await world.job(job_id)
    assert job.attempt == 2
    assert job.retries_used == 0
    assert job.phase is JobPhase.RUNNING
    assert job.placement is not None
    assert job.placement.cluster == "cloud"
    assert "has not answered" in " ".join(e.reason for e in job.events)
    assert cloud.dispatch_count(job_id, 2) == 1

    # The old copy is still on the silent cluster; once it answers, it is removed.
    onprem.set_reachable(True)
    assert {(s.job_id, s.attempt) for s in await onprem.statuses()} == {(job_id, 1)}
    await world.step()
    left = {(s.job_id, s.attempt): s.phase for s in await onprem.statuses()}
    assert left.get((job_id, 1)) in (None, GangPhase.CANCELLED)
    assert onprem.running_gangs() == []

    await world.step(600.0)
    job = await world.job(job_id)
    assert job.phase is JobPhase.SUCCEEDED
    assert cloud.dispatch_count(job_id, 2) == 1


async def test_a_cluster_that_answers_within_the_grace_period_keeps_its_jobs(world: World) -> None:
    onprem = world.clusters["onprem"]
    job_id = await submit(world, a_job("stays", duration="10m"))
    await world.step()
    onprem.set_reachable(False)
    await world.step(GRACE_S - 1)
    onprem.set_reachable(True)
    await world.step(1.0)
    # The silence ended before the grace period: the clock starts again at the next silence.
    onprem.set_reachable(False)
    await world.step(GRACE_S - 1)
    job = await world.job(job_id)
    assert job.phase is JobPhase.RUNNING
    assert job.attempt == 1
    assert onprem.dispatch_count(job_id, 1) == 1
