"""How many calls the reconciler's tick has in flight to each member cluster (issue 33).

bench/scale.py found a burst's finished gangs removed one cancel call after another, a tick a
hundred calls long that every job waiting to be dispatched or recorded as ended waited for. Now
the collector's removals go at once, and every call to a cluster (dispatches too) holds one of its
CLUSTER_CONCURRENCY slots: a burst neither waits on one call at a time nor floods one cluster, and
a busy cluster does not hold up the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from clusters.memory import InMemoryCluster
from federation.scheduling import reconciler
from federation.scheduling.collector import FINISHED_GANG_RETENTION_S
from placement.model import JobPhase
from tests.unit.reconcile_world import World, a_job, build_world, submit


@dataclass
class InFlight:
    """Calls in flight, by cluster, and the most seen at once (each and all together)."""

    now: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    peak_all: int = 0
    calls: int = 0

    def wrap(self, cluster: InMemoryCluster, name: str, method: str) -> None:
        original: Callable[..., Awaitable[Any]] = getattr(cluster, method)

        async def counted(*args: Any) -> Any:
            self.calls += 1
            self.now[name] = self.now.get(name, 0) + 1
            self.peak[name] = max(self.peak.get(name, 0), self.now[name])
            self.peak_all = max(self.peak_all, sum(self.now.values()))
            try:
                # A call takes a while, as over the network: the others of the tick start meanwhile.
                for _ in range(5):
                    await asyncio.sleep(0)
                return await original(*args)
            finally:
                self.now[name] -= 1

        setattr(cluster, method, counted)


async def _forty_finished(world: World) -> None:
    """Forty finished gangs, eight at a time (the cluster's 16 GPUs), kept for their logs."""
    jobs = []
    for round_ in range(5):
        batch = [await submit(world, a_job(f"j{round_}-{i}", gpus=1)) for i in range(8)]
        await world.step()
        await world.step(10.0)
        jobs += batch
    assert {(await world.job(j)).phase for j in jobs} == {JobPhase.SUCCEEDED}


async def test_finished_gangs_are_removed_at_once_a_clusters_slots_at_a_time() -> None:
    async with build_world() as world:
        await _forty_finished(world)
        assert len(await world.cluster.statuses()) == 40
        seen = InFlight()
        seen.wrap(world.cluster, "onprem", "cancel")
        await world.step(FINISHED_GANG_RETENTION_S + 1.0)
        assert await world.cluster.statuses() == ()
        # One at a time before; all forty at once would flood the cluster's API server.
        assert seen.peak["onprem"] == reconciler.CLUSTER_CONCURRENCY
        assert seen.calls == 40


async def test_dispatches_are_bounded_per_cluster_and_clusters_go_on_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reconciler, "CLUSTER_CONCURRENCY", 3)
    async with build_world(cluster_count=2) as world:
        seen = InFlight()
        for name, cluster in world.clusters.items():
            seen.wrap(cluster, name, "dispatch")
        # Eight two-GPU gangs fill each cluster's 16 GPUs: the cheaper first, then the other.
        jobs = [await submit(world, a_job(f"j{i}", gpus=1)) for i in range(16)]
        await world.step()
        assert {(await world.job(j)).phase for j in jobs} <= {JobPhase.DISPATCHED, JobPhase.RUNNING}
        assert seen.peak == {"onprem": 3, "cloud": 3}
        # Neither waited for the other: both clusters had their three calls in flight at once.
        assert seen.peak_all == 6


async def test_a_stale_gang_the_cluster_is_deleting_is_not_asked_to_go_again() -> None:
    """A deleted gang shows (deleting) until its pods are gone: the collector asked its cluster to
    remove it again at every look meanwhile, a quarter more calls than gangs at 100 clusters
    (bench/scale.py). Now once, and again only after the cancel grace period."""
    async with build_world() as world:
        jobs = [await submit(world, a_job(f"j{i}", gpus=1)) for i in range(4)]
        await world.step()
        await world.step(10.0)
        assert {(await world.job(j)).phase for j in jobs} == {JobPhase.SUCCEEDED}
        asked: list[tuple[str, int]] = []
        deleting = True
        cancel = world.cluster.cancel

        async def slow_cancel(job_id: Any, attempt: int, grace_period_s: float) -> None:
            asked.append((job_id, attempt))
            if not deleting:  # the deletion is over: the gang goes
                await cancel(job_id, attempt, grace_period_s)

        world.cluster.cancel = slow_cancel  # type: ignore[method-assign]
        await world.step(FINISHED_GANG_RETENTION_S + 1.0)
        await world.step(1.0)
        await world.step(1.0)
        # Nine ticks looked at the four deleting gangs; each was asked to go once.
        assert sorted(job_id for job_id, _ in asked) == sorted(jobs)
        assert len(await world.cluster.statuses()) == 4
        # Still shown after the grace period: asked again, as a lost delete would need.
        deleting = False
        await world.step(reconciler.CANCEL_GRACE_PERIOD_S)
        assert len(asked) == 8
        assert await world.cluster.statuses() == ()
        await world.step(1.0)
        assert len(asked) == 8


async def test_the_record_lane_is_bounded_apart_from_the_dispatch_lane(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ends, records and removals have RECORD_CONCURRENCY slots in all, dispatches
    RECONCILE_CONCURRENCY: an ended attempt holds its slot while its logs are read, and with the
    dispatch lane's 64, ends at 100 clusters waited 1 to 3 s for a slot (bench/scale.py)."""
    monkeypatch.setattr(reconciler, "RECONCILE_CONCURRENCY", 1)
    monkeypatch.setattr(reconciler, "RECORD_CONCURRENCY", 5)
    async with build_world() as world:
        dispatches = InFlight()
        dispatches.wrap(world.cluster, "onprem", "dispatch")
        await _forty_finished(world)
        assert dispatches.peak_all == 1
        removals = InFlight()
        removals.wrap(world.cluster, "onprem", "cancel")
        await world.step(FINISHED_GANG_RETENTION_S + 1.0)
        assert await world.cluster.statuses() == ()
        # Below the cluster's own CLUSTER_CONCURRENCY (16), above the dispatch lane's one.
        assert removals.peak_all == 5
        assert removals.calls == 40
