"""Dispatches beside the reconciler's tick (`Reconciler(dispatch_aside=True)`, as the leader runs it).

bench/scale.py found a burst's gang creates holding each tick for tens of seconds: a pod that ended
meanwhile was recorded only by the tick after, its GPUs counted busy all that time, and no
scheduling cycle ran. With dispatches aside, a tick starts them and goes on; these tests hold that
a tick no longer waits for a slow create, that a job is still dispatched once (never twice while its
create is in flight), that the bounds hold, that a create's failure is handled as in a tick, and
that a term's end stops what is in flight (issue 33).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from clusters.api import ClusterUnreachable
from federation.scheduling import reconciler
from federation.scheduling.reconciler import Reconciler
from federation.store.job_store import Fence
from placement.model import JobPhase
from tests.unit.reconcile_world import World, a_job, build_world, submit


class Gate:
    """Holds a cluster's `dispatch` calls until opened: a create that takes as long as we say."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.calls: list[str] = []
        self.in_flight = 0
        self.peak = 0

    def hold(self, cluster: Any) -> None:
        original: Callable[..., Awaitable[Any]] = cluster.dispatch

        async def held(workload: Any) -> Any:
            self.calls.append(workload.job_id)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            try:
                await self.opened.wait()
                return await original(workload)
            finally:
                self.in_flight -= 1

        cluster.dispatch = held


def aside(world: World) -> Reconciler:
    """The world's reconciler as the leader runs it."""
    world.reconciler = Reconciler(
        store=world.store,
        cache=world.cache,
        members=world.members,
        metrics=world.scheduler._metrics,
        clock=world.clock,
        dispatch_aside=True,
    )
    return world.reconciler


async def settle(world: World) -> None:
    """Let the tasks run and the cache catch up with what they wrote."""
    for _ in range(20):
        await asyncio.sleep(0)
    await world._sync()


async def test_a_tick_does_not_wait_for_a_slow_create_and_records_an_end_meanwhile() -> None:
    async with build_world() as world:
        rec = aside(world)
        first = await submit(world, a_job("first", gpus=1, duration="5s"))
        await world.step()
        assert (await world.job(first)).phase in (JobPhase.DISPATCHED, JobPhase.RUNNING)
        gate = Gate()
        gate.hold(world.cluster)
        second = await submit(world, a_job("second", gpus=1))
        await world.scheduler.run_cycle(None)
        await world._sync()
        assert (await world.job(second)).phase is JobPhase.ADMITTED
        world.clock.now += 10.0  # the first job's pods end
        # The tick returns with the second job's create still held, and records the first's end.
        await asyncio.wait_for(rec.tick(None), timeout=5)
        await settle(world)
        assert (await world.job(first)).phase is JobPhase.SUCCEEDED
        assert (await world.job(second)).phase is JobPhase.ADMITTED
        assert rec.dispatches_in_flight == 1
        # Ticks while the create is in flight leave the job to it: one create, not one a tick.
        await rec.tick(None)
        await rec.tick(None)
        assert gate.calls == [second]
        gate.opened.set()
        await settle(world)
        await rec.tick(None)
        await settle(world)
        assert (await world.job(second)).phase in (JobPhase.DISPATCHED, JobPhase.RUNNING)
        assert rec.dispatches_in_flight == 0
        assert gate.calls == [second]


async def test_dispatches_aside_keep_each_clusters_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconciler, "CLUSTER_CONCURRENCY", 3)
    async with build_world() as world:
        rec = aside(world)
        gate = Gate()
        gate.hold(world.cluster)
        jobs = [await submit(world, a_job(f"j{i}", gpus=1)) for i in range(8)]
        await world.scheduler.run_cycle(None)
        await world._sync()
        await rec.tick(None)
        await settle(world)
        assert gate.peak == 3
        gate.opened.set()
        for _ in range(5):
            await settle(world)
            await rec.tick(None)
        await settle(world)
        assert {(await world.job(j)).phase for j in jobs} <= {JobPhase.DISPATCHED, JobPhase.RUNNING}
        assert sorted(gate.calls) == sorted(jobs)


async def test_a_refused_create_aside_requeues_the_job_as_a_tick_would() -> None:
    async with build_world() as world:
        rec = aside(world)

        async def unreachable(workload: Any) -> None:
            raise ClusterUnreachable("no answer")

        world.cluster.dispatch = unreachable  # type: ignore[method-assign,assignment]
        job = await submit(world, a_job("refused", gpus=1))
        await world.scheduler.run_cycle(None)
        await world._sync()
        await rec.tick(None)
        await settle(world)
        # The refusal was committed by the dispatch's task: the next tick counts it.
        assert await rec.tick(None) == 1
        stored = await world.job(job)
        assert stored.phase is JobPhase.QUEUED
        assert [r.cluster for r in stored.refusals] == ["onprem"]


async def test_a_new_term_stops_the_old_terms_dispatches_and_their_commits_are_fenced() -> None:
    async with build_world() as world:
        rec = aside(world)
        gate = Gate()
        gate.hold(world.cluster)
        job = await submit(world, a_job("held", gpus=1))
        await world.scheduler.run_cycle(None)
        await world._sync()
        old_term = Fence(b"/gpufed/leader", 1)
        await rec.tick(old_term)
        await settle(world)
        (old_task,) = rec._dispatching.values()
        # Another term (this server elected again): the old term's create is stopped, and the new
        # term dispatches the job itself, under its own fence.
        await rec.tick(Fence(b"/gpufed/leader", 2))
        await settle(world)
        assert old_task.cancelled()
        assert rec.dispatches_in_flight == 1
        assert gate.calls == [job, job]
        gate.opened.set()
        await settle(world)
        assert rec.dispatches_in_flight == 0
        # Neither fence holds the leader key in this store: nothing was committed.
        assert await rec.tick(Fence(b"/gpufed/leader", 2)) == 0
        assert (await world.job(job)).phase is JobPhase.ADMITTED
        await rec.stop_dispatches()


async def test_stop_dispatches_cancels_what_is_in_flight() -> None:
    async with build_world() as world:
        rec = aside(world)
        gate = Gate()
        gate.hold(world.cluster)
        job = await submit(world, a_job("held", gpus=1))
        await world.scheduler.run_cycle(None)
        await world._sync()
        await rec.tick(None)
        await settle(world)
        assert rec.dispatches_in_flight == 1
        await asyncio.wait_for(rec.stop_dispatches(), timeout=5)
        assert rec.dispatches_in_flight == 0
        gate.opened.set()
        await settle(world)
        assert (await world.job(job)).phase is JobPhase.ADMITTED
