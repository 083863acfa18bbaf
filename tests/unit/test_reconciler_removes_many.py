"""A member cluster's ended gangs removed together, where its backend can (issue 33).

A backend with `cancel_many` (the Kubernetes backend: one `deletecollection` a namespace) gets a
cluster's stale gangs in one call: the ended ones (holding no GPUs) at most once every
COLLECT_HOLD_S, or as soon as COLLECT_BATCH wait; a stale gang that still holds GPUs at once, with
the ended ones waiting beside it. A backend without it gets one `cancel` a gang, as before
(tests/unit/test_reconciler_concurrency.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from clusters.memory import InMemoryCluster
from federation.scheduling import reconciler
from federation.scheduling.collector import FINISHED_GANG_RETENTION_S
from federation.scheduling.members import GangKey
from placement.model import JobId, JobPhase
from tests.unit.reconcile_world import World, a_job, build_world, submit


class RemovingMany(InMemoryCluster):
    """The in-memory cluster with `cancel_many`, each batch recorded (and each gang cancelled)."""

    batches: list[list[GangKey]]

    async def cancel_many(self, keys: Sequence[GangKey], grace_period_s: float) -> None:
        self.batches.append(list(keys))
        for job_id, attempt in keys:
            await self.cancel(job_id, attempt, grace_period_s)


def removing_many(world: World) -> RemovingMany:
    cluster = world.cluster
    cluster.__class__ = RemovingMany
    assert isinstance(cluster, RemovingMany)
    cluster.batches = []
    return cluster


async def finished(world: World, prefix: str, count: int) -> list[JobId]:
    jobs = [await submit(world, a_job(f"{prefix}{i}", gpus=1)) for i in range(count)]
    await world.step()
    await world.step(10.0)
    assert {(await world.job(j)).phase for j in jobs} == {JobPhase.SUCCEEDED}
    return jobs


async def test_a_clusters_ended_gangs_go_in_one_call_then_wait_for_the_next_batch() -> None:
    async with build_world() as world:
        cluster = removing_many(world)
        first = await finished(world, "a", 6)
        await world.step(FINISHED_GANG_RETENTION_S + 1.0)
        assert await cluster.statuses() == ()
        assert [sorted(j for j, _ in b) for b in cluster.batches] == [sorted(first)]
        # Ended gangs seen stale within COLLECT_HOLD_S of that batch wait for the next one.
        second = await finished(world, "b", 3)
        await world.step(FINISHED_GANG_RETENTION_S + 1.0)
        if len(cluster.batches) == 1:
            assert len(await cluster.statuses()) == 3
            await world.step(reconciler.COLLECT_HOLD_S)
        assert [sorted(j for j, _ in b) for b in cluster.batches[1:]] == [sorted(second)]
        assert await cluster.statuses() == ()


async def test_a_full_batch_goes_without_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconciler, "COLLECT_BATCH", 4)
    monkeypatch.setattr(reconciler, "COLLECT_HOLD_S", 1e9)
    async with build_world() as world:
        cluster = removing_many(world)
        await finished(world, "a", 2)
        await world.step(FINISHED_GANG_RETENTION_S + 1.0)
        assert len(cluster.batches) == 1  # the cluster's first batch is not held
        await finished(world, "b", 3)
        await world.step(FINISHED_GANG_RETENTION_S + 1.0)
        assert len(cluster.batches) == 1, "three ended gangs wait for the hold"
        assert len(await cluster.statuses()) == 3
        await finished(world, "c", 1)
        await world.step(FINISHED_GANG_RETENTION_S + 1.0)
        assert [len(b) for b in cluster.batches] == [2, 4]
        assert await cluster.statuses() == ()


async def test_a_gang_that_cannot_wait_goes_at_once_and_takes_the_waiting_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only ended gangs wait (COLLECT_CAN_WAIT): here none may, as a gang still holding GPUs may not."""
    monkeypatch.setattr(reconciler, "COLLECT_HOLD_S", 1e9)
    async with build_world() as world:
        cluster = removing_many(world)
        await finished(world, "a", 1)
        await world.step(FINISHED_GANG_RETENTION_S + 1.0)
        assert len(cluster.batches) == 1
        waiting = await finished(world, "b", 2)
        await world.step(FINISHED_GANG_RETENTION_S + 1.0)
        assert len(cluster.batches) == 1
        urgent = await finished(world, "c", 1)
        monkeypatch.setattr(reconciler, "COLLECT_CAN_WAIT", frozenset())
        await world.step(FINISHED_GANG_RETENTION_S + 1.0)
        assert [sorted(j for j, _ in b) for b in cluster.batches[1:]] == [sorted(waiting + urgent)]
        assert await cluster.statuses() == ()


async def test_a_backend_without_it_gets_one_cancel_a_gang() -> None:
    async with build_world() as world:
        jobs = await finished(world, "a", 5)
        cancelled: list[str] = []
        cancel = world.cluster.cancel

        async def counted(job_id: str, attempt: int, grace_period_s: float) -> None:
            cancelled.append(job_id)
            await cancel(job_id, attempt, grace_period_s)  # type: ignore[arg-type]

        world.cluster.cancel = counted  # type: ignore[method-assign]
        await world.step(FINISHED_GANG_RETENTION_S + 1.0)
        assert sorted(cancelled) == sorted(jobs)
        assert await world.cluster.statuses() == ()
