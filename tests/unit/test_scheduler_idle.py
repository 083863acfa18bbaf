"""A leader whose inputs did not change does not re-plan a long queue every half second.

Before, every cycle planned the whole queue again: with 20,000 queued jobs over a second of CPU,
a third of a core in the API's process, for as long as they waited.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import pytest

import federation.scheduling.scheduler as scheduler_module
from federation.scheduling.idle import IDLE_REPLAN_CYCLES, IdleGate
from federation.store.jobs import JobRecord
from placement.model import GpuType, JobPhase, Plan, Snapshot
from placement.plan import plan as placement_plan
from placement.stretch_carry import PlanCarry
from tests.unit.reconcile_world import World, a_job, build_world, submit


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with build_world() as w:
        yield w


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The time of every plan the scheduler makes."""
    made: list[float] = []
    real = placement_plan

    def counting(
        snapshot: Snapshot,
        *,
        now: float,
        between: Callable[[], None] | None = None,
        carry: PlanCarry | None = None,
    ) -> Plan:
        made.append(now)
        return real(snapshot, now=now, between=between, carry=carry)

    monkeypatch.setattr(scheduler_module, "plan", counting)
    return made


def unplaceable(name: str) -> JobRecord:
    job = a_job(name)
    return replace(job, spec=replace(job.spec, gpu_types=(GpuType("H200"),)))


async def test_nothing_changed_nothing_replanned_until_the_time_may_matter(
    world: World, plans: list[float]
) -> None:
    for i in range(50):
        await submit(world, unplaceable(f"waits{i}"))
    await world.step()
    first = len(plans)
    assert first >= 1
    for _ in range(5):
        await world.step()
    assert len(plans) == first, "the same jobs, inputs and clusters: the same plan"

    # Time alone: re-planned once the replan interval has passed. The interval grows with the
    # cycle's length in real time (50 jobs took over the 25 ms that keep it at 0.5 s on a busy
    # machine, and a fixed step of 0.6 s failed under load), so the step is read from the gate.
    await world.step(world.scheduler.idle_gate.replan_interval_s + 0.1)
    assert len(plans) == first + 1

    # A new job is planned at the next cycle (and admitted).
    runs = await submit(world, a_job("runs"))
    await world.step()
    assert len(plans) > first + 1
    assert (await world.job(runs)).phase is not JobPhase.QUEUED


async def test_a_change_on_a_cluster_is_planned_at_once(world: World, plans: list[float]) -> None:
    await submit(world, unplaceable("waits"))
    short = await submit(world, a_job("short", duration="5s"))
    await world.step()
    assert (await world.job(short)).phase is JobPhase.RUNNING
    before = len(plans)
    await world.step(0.1)
    assert len(plans) == before
    # The running gang ends: the cluster's statuses and inventory change, so the cycle plans.
    await world.step(6)
    assert (await world.job(short)).phase is JobPhase.SUCCEEDED
    assert len(plans) > before


def test_the_replan_interval_grows_with_the_cycles_cost() -> None:
    gate = IdleGate()
    read = (1, 2, ("clusters",))
    gate.planned(read, now_s=100.0, seconds=1.5)
    assert gate.may_skip(read, 100.0 + IDLE_REPLAN_CYCLES * 1.5 - 0.1)
    assert not gate.may_skip(read, 100.0 + IDLE_REPLAN_CYCLES * 1.5)
    assert not gate.may_skip((2, 2, ("clusters",)), 100.1)
    gate.forget()
    assert not gate.may_skip(read, 100.1)
