"""Work that outlasts its tick (issue 33).

A tick holds the loop at most `TICK_HOLD_S`, looking at its jobs again every `TICK_WAIT_S` while
calls it started are in flight; what is still in flight then goes on by itself and is committed as
it comes. bench/scale.py found that waiting for all of it made a burst's
tick last until its last gang was created: no end was recorded and nothing new was placed for tens
of seconds at 100 clusters. These tests hold a cluster's calls open and check that the rest goes
on: another cluster's dispatches, the same cluster's ends, the scheduling cycle; that nothing is
started twice; and that a leader change while a dispatch is in flight makes no second gang and
writes nothing for the old term.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from clusters.memory import InMemoryCluster
from federation.errors import StoreUnavailable
from federation.metrics import Metrics
from federation.scheduling import reconciler
from federation.scheduling.reconciler import Reconciler
from federation.store.job_store import Fence
from placement.model import JobId, JobPhase
from tests.unit.reconcile_world import World, a_job, build_world, submit
from tests.waits import until


class Held:
    """A cluster's dispatch calls, held open until released; counted as they start."""

    def __init__(self, cluster: InMemoryCluster) -> None:
        self.calls: list[JobId] = []
        self.release = asyncio.Event()
        original: Callable[..., Awaitable[Any]] = cluster.dispatch

        async def held(gang: Any) -> Any:
            self.calls.append(gang.job_id)
            await self.release.wait()
            return await original(gang)

        cluster.dispatch = held  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
def short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    # The ticks here look again every hundredth of a second and return after a twentieth, not
    # every second and after five.
    monkeypatch.setattr(reconciler, "TICK_WAIT_S", 0.01)
    monkeypatch.setattr(reconciler, "TICK_HOLD_S", 0.05)


async def _phases(world: World, ids: list[JobId]) -> set[JobPhase]:
    return {(await world.job(j)).phase for j in ids}


async def _admit(world: World) -> None:
    """One scheduling cycle, and the cache caught up with what it wrote."""
    await world.scheduler.run_cycle(None)
    await world.caught_up()


async def _first_running(world: World) -> JobId:
    """A 4-GPU job of 5 s, running: the node's GPUs held until it ends."""
    first = await submit(world, a_job("first", gpus=4, duration="5s"))
    await world.step()
    await world.step(1.0)
    assert (await world.job(first)).phase is JobPhase.RUNNING
    return first


async def test_a_slow_cluster_holds_neither_the_tick_nor_the_other_clusters_dispatches() -> None:
    async with build_world(cluster_count=2) as world:
        onprem, cloud = world.clusters["onprem"], world.clusters["cloud"]
        held = Held(onprem)
        # Eight two-GPU gangs fill onprem's 16 GPUs (the cheaper); eight more go to the cloud.
        ids = [await submit(world, a_job(f"j{i:02d}", gpus=1)) for i in range(16)]
        await _admit(world)
        placed = {j: (await world.job(j)).placement for j in ids}
        on_prem = [j for j in ids if placed[j] is not None and placed[j].cluster == "onprem"]  # type: ignore[union-attr]
        on_cloud = [j for j in ids if j not in on_prem]
        assert len(on_prem) == len(on_cloud) == 8
        await world.reconciler.tick(None)  # returns, though onprem answers nothing
        await world.caught_up()
        assert await _phases(world, on_cloud) <= {JobPhase.DISPATCHED, JobPhase.RUNNING}
        assert await _phases(world, on_prem) == {JobPhase.ADMITTED}
        # Later ticks leave the jobs in flight alone: no second call for any of them.
        for _ in range(3):
            await world.reconciler.tick(None)
        assert sorted(held.calls) == sorted(on_prem)
        held.release.set()
        # Committed as they come, with no tick to wait for.
        await until(lambda: not world.reconciler._in_flight, "the work in flight done", timeout_s=5)
        await world.caught_up()
        assert await _phases(world, on_prem) == {JobPhase.DISPATCHED}
        assert all(onprem.dispatch_count(j, 1) == 1 for j in on_prem)
        assert all(cloud.dispatch_count(j, 1) == 1 for j in on_cloud)


async def test_an_end_is_recorded_while_its_clusters_dispatches_are_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reconciler, "CLUSTER_CONCURRENCY", 1)
    async with build_world() as world:
        first = await _first_running(world)
        held = Held(world.cluster)
        waiting = [await submit(world, a_job(f"next-{i}", gpus=1)) for i in range(3)]
        await _admit(world)
        world.clock.now += 10.0  # the first job's pods end
        await world.reconciler.tick(None)
        await world.caught_up()
        # The cluster's only dispatch slot is held, and the end is recorded all the same.
        assert held.calls
        assert await _phases(world, waiting) == {JobPhase.ADMITTED}
        assert (await world.job(first)).phase is JobPhase.SUCCEEDED
        # And the scheduling cycle, which runs after the tick, places on the GPUs it freed.
        later = await submit(world, a_job("later", gpus=4))
        await _admit(world)
        assert (await world.job(later)).phase is JobPhase.ADMITTED
        held.release.set()
        await until(lambda: not world.reconciler._in_flight, "the work in flight done", timeout_s=5)


async def test_a_leader_change_while_a_dispatch_is_in_flight_makes_one_gang() -> None:
    async with build_world() as world:
        kv = world.store._kv
        first_fence = Fence(b"/leader", await kv.put(b"/leader", b"first"))
        held = Held(world.cluster)
        job = await submit(world, a_job("j", gpus=4))
        await _admit(world)
        await world.reconciler.tick(first_fence)
        assert held.calls == [job]
        # The first leader's lease expires; a second server leads, with nothing in memory.
        await kv.delete(b"/leader")
        second_fence = Fence(b"/leader", await kv.put(b"/leader", b"second"))
        successor = Reconciler(
            store=world.store, cache=world.cache, members=world.members, metrics=Metrics(), clock=world.clock
        )
        # Its dispatch of the same attempt is held too, until the first call has created the gang.
        successor_tick = asyncio.create_task(successor.tick(second_fence))
        held.release.set()
        await successor_tick
        await until(
            lambda: not world.reconciler._in_flight and not successor._in_flight,
            "both terms' work done",
            timeout_s=5,
        )
        await world.caught_up()
        dispatched = await world.job(job)
        assert (dispatched.phase, dispatched.attempt) == (JobPhase.DISPATCHED, 1)
        assert [e.phase for e in dispatched.events].count(JobPhase.DISPATCHED) == 1
        assert world.cluster.dispatch_count(job, 1) == 1
        assert len(await world.cluster.statuses()) == 1


async def test_a_term_that_ends_stops_its_dispatches_in_flight() -> None:
    async with build_world() as world:
        held = Held(world.cluster)
        job = await submit(world, a_job("j", gpus=4))
        await _admit(world)
        await world.reconciler.tick(None)
        assert held.calls == [job]
        await world.reconciler.stop()
        held.release.set()
        await asyncio.sleep(0)
        assert world.reconciler._in_flight == {}
        assert world.cluster.dispatch_count(job, 1) == 0
        assert (await world.job(job)).phase is JobPhase.ADMITTED
        # The next term dispatches it.
        await world.reconciler.tick(None)
        await until(lambda: not world.reconciler._in_flight, "the work in flight done", timeout_s=5)
        await world.caught_up()
        assert (await world.job(job)).phase is JobPhase.DISPATCHED
        assert world.cluster.dispatch_count(job, 1) == 1


async def test_an_error_of_work_in_flight_is_raised_by_the_next_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    async with build_world() as world:
        held = Held(world.cluster)
        job = await submit(world, a_job("j", gpus=4))
        await _admit(world)
        await world.reconciler.tick(None)
        assert held.calls == [job]

        async def unavailable(*args: Any, **kwargs: Any) -> None:
            raise StoreUnavailable("etcd is away")

        with monkeypatch.context() as away:
            away.setattr(world.store, "commit", unavailable)
            held.release.set()
            await until(lambda: not world.reconciler._in_flight, "the work in flight done", timeout_s=5)
            # The leader's loop backs off from it, as when the tick waited for the commit itself.
            with pytest.raises(StoreUnavailable):
                await world.reconciler.tick(None)
        # Raised once, not for ever: with etcd back, the next tick commits the dispatch.
        await world.reconciler.tick(None)
        await until(lambda: not world.reconciler._in_flight, "the retried dispatch done", timeout_s=5)
        await world.caught_up()
        assert (await world.job(job)).phase is JobPhase.DISPATCHED
        assert world.cluster.dispatch_count(job, 1) == 1


async def test_a_dispatch_that_waited_for_a_slot_acts_on_the_job_as_it_is_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reconciler, "CLUSTER_CONCURRENCY", 1)
    async with build_world() as world:
        held = Held(world.cluster)
        first = await submit(world, a_job("first", gpus=1))
        second = await submit(world, a_job("second", gpus=1))
        await _admit(world)
        await world.reconciler.tick(None)
        # The cluster's one dispatch slot is held by one of them; the other waits for it.
        assert len(held.calls) == 1
        waiting = second if held.calls == [first] else first
        stored = await world.store.get_job(waiting)
        assert stored is not None
        await world.store.commit([(replace(stored.value, cancel_requested=True), stored.mod_revision)])
        await world.caught_up()
        held.release.set()
        await until(lambda: not world.reconciler._in_flight, "the work in flight done", timeout_s=5)
        # No gang for the job cancelled while it waited: the cluster was never asked.
        assert held.calls == [first if waiting == second else second]
        assert world.cluster.dispatch_count(waiting, 1) == 0
        await world.step()
        assert (await world.job(waiting)).phase is JobPhase.CANCELLED


async def test_an_end_during_a_held_tick_is_noticed_before_it_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reconciler, "TICK_HOLD_S", 5.0)
    async with build_world() as world:
        first = await _first_running(world)
        held = Held(world.cluster)
        waiting = await submit(world, a_job("next", gpus=1))
        await _admit(world)
        tick = asyncio.create_task(world.reconciler.tick(None))
        await until(lambda: held.calls == [waiting], "the next job's dispatch is held")
        world.clock.now += 10.0  # the first job's pods end while the tick holds the loop

        def recorded() -> bool:
            cached = world.cache.get(first)
            return cached is not None and cached.value.phase is JobPhase.SUCCEEDED

        await until(recorded, "the end recorded")
        assert not tick.done(), "noticed while the tick still held the loop, not by the next tick"
        held.release.set()
        await tick
        await until(lambda: not world.reconciler._in_flight, "the held dispatch done", timeout_s=5)
        await world.caught_up()
        assert (await world.job(waiting)).phase is JobPhase.DISPATCHED
