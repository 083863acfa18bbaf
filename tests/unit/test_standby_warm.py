"""A standby builds each queued job's request before it leads (`Scheduler.stand_by`, run by the
server while it waits for the leader key), so that a takeover's first cycle plans without building
them all: at 10,000 queued jobs that was a third of a standby's first cycle (issue 33,
bench/scale_failover.py). It writes nothing, and the plan is the one a cold standby makes."""

from __future__ import annotations

from typing import Any

import pytest

import federation.scheduling.snapshot as snapshot_module
from placement.model import JobId, JobPhase
from tests.unit.reconcile_world import World, a_job, build_world, submit


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[JobId]:
    built: list[JobId] = []
    build = snapshot_module.gang_request

    def counting(job: Any, inputs: Any) -> Any:
        built.append(job.job_id)
        return build(job, inputs)

    monkeypatch.setattr(snapshot_module, "gang_request", counting)
    return built


async def _waiting_world(world: World) -> list[JobId]:
    # 16 GPUs in all: two gangs of 2 x 4 run, the next four wait for capacity.
    jobs = [await submit(world, a_job(f"j{n}", gpus=4, queued_at_s=1000.0 + n)) for n in range(6)]
    await world.step()
    return [j for j in jobs if (await world.job(j)).phase is JobPhase.QUEUED]


async def test_a_warm_standby_builds_no_request_in_its_first_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    async with build_world() as world:
        waiting = await _waiting_world(world)
        assert len(waiting) == 4
        built = _count_builds(monkeypatch)
        standby = world.another_scheduler()

        assert await standby.stand_by() == len(waiting)
        assert sorted(built) == sorted(waiting)
        built.clear()
        await standby.stand_by()  # nothing changed: nothing built again
        assert built == []

        await standby.run_cycle(None)
        assert built == []


async def _ended_world(world: World) -> list[JobId]:
    """Two gangs ran and ended (recorded by the old leader's tick), four wait: room for two."""
    waiting = await _waiting_world(world)
    world.clock.now += 11.0
    await world.reconciler.tick(None)
    await world.caught_up()
    return waiting


async def test_standing_by_writes_nothing_and_the_first_cycle_admits_what_a_cold_standby_would() -> None:
    async with build_world() as warm_world, build_world() as cold_world:
        waiting = await _ended_world(warm_world)
        assert waiting == await _ended_world(cold_world)
        warm, cold = warm_world.another_scheduler(), cold_world.another_scheduler()

        revision = warm_world.cache.revision
        await warm.stand_by()
        assert warm_world.cache.revision == revision  # nothing written

        results = [await warm.run_cycle(None), await cold.run_cycle(None)]
        assert [(r.admitted, r.waiting) for r in results] == [(2, 2), (2, 2)]
        await warm_world.caught_up()
        await cold_world.caught_up()
        phases = [[(await w.job(j)).phase for j in waiting] for w in (warm_world, cold_world)]
        assert phases[0] == phases[1]
