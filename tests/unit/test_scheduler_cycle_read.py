"""A job that changes while a cycle awaits its inputs is planned by the next cycle, not skipped.

The cycle copies the live jobs (the event loop applies the cache's watch events during its awaits
and while the worker thread plans), then awaits the inputs and the clusters. The idle gate
(`federation.scheduling.idle`) skips a cycle whose reads equal the last one's. The revision those
reads name is the copy's: read after the awaits, it named a job the copy lacked, and the cycles that
would have planned that job were skipped for up to the gate's replan interval.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from federation.store.jobs import JobRecord
from placement.model import GpuType, JobPhase
from tests.unit.reconcile_world import World, a_job, build_world, submit


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with build_world() as w:
        yield w


def unplaceable(name: str) -> JobRecord:
    job = a_job(name)
    return replace(job, spec=replace(job.spec, gpu_types=(GpuType("H200"),)))


async def test_a_job_submitted_during_a_cycles_awaits_is_planned_next(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    await submit(world, unplaceable("waits"))
    await world.step()
    await world.step()  # settled: the reasons are written, the cycles after it skip

    members = world.scheduler._members
    observe = members.observe
    late: list[Any] = []

    async def observe_and_submit() -> Any:
        # Once, while the cycle awaits the clusters: a job arrives and the cache applies it.
        if not late:
            stored, created = await world.store.create_job(
                a_job("late"), idempotency_key="late", manifest_digest="d"
            )
            assert created
            late.append(stored.value.job_id)
            assert await world.cache.wait_for_revision(stored.mod_revision)
        return await observe()

    monkeypatch.setattr(members, "observe", observe_and_submit)
    # No time passes: only a change of what the cycle reads makes it plan.
    await world.step()
    await world.step()
    assert late
    assert (await world.job(late[0])).phase is not JobPhase.QUEUED
