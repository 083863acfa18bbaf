"""A new leader starts from the wait reasons already stored (federation.scheduling.scheduler): it
writes again only those that changed, and deletes those of jobs no longer waiting. Rewriting all
of them was most of a restart's first pass (issue 19: 8,000 queued jobs, 8,000 fenced writes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from federation.store.job_store import waits_from_json
from placement.model import JobId, JobPhase, WaitCode, WaitReason
from tests.unit.reconcile_world import World, a_job, build_world, submit


def _count_writes(world: World, monkeypatch: pytest.MonkeyPatch) -> list[tuple[JobId, int]]:
    """Every job whose reasons are written from now on: (job, number of reasons; 0 deletes)."""
    writes: list[tuple[JobId, int]] = []
    put_one = world.store.put_wait_reasons
    put_many = world.store.put_encoded_wait_reasons

    async def counting(job_id: JobId, reasons: Sequence[WaitReason], **kwargs: Any) -> None:
        writes.append((job_id, len(reasons)))
        await put_one(job_id, reasons, **kwargs)

    async def counting_many(values: Sequence[tuple[JobId, bytes | None]], **kwargs: Any) -> None:
        writes.extend(
            (job_id, 0 if value is None else len(waits_from_json(value))) for job_id, value in values
        )
        await put_many(values, **kwargs)

    monkeypatch.setattr(world.store, "put_wait_reasons", counting)
    monkeypatch.setattr(world.store, "put_encoded_wait_reasons", counting_many)
    return writes


async def test_a_new_leader_leaves_unchanged_reasons_fixes_changed_ones_and_clears_stale_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with build_world() as world:
        # 16 GPUs in all: two gangs of 2 x 4 run, the next two wait for capacity.
        jobs = [await submit(world, a_job(f"j{n}", gpus=4, queued_at_s=1000.0 + n)) for n in range(4)]
        await world.step()
        waiting = [j for j in jobs if (await world.job(j)).phase is JobPhase.QUEUED]
        running = [j for j in jobs if (await world.job(j)).phase is not JobPhase.QUEUED]
        assert len(waiting) == 2
        assert len(running) == 2
        stored = {j: await world.store.get_wait_reasons(j) for j in waiting}
        assert all(stored.values())

        # What another leader may have left: a changed reason, and one of a job now running.
        wrong = (WaitReason(WaitCode.UNKNOWN_TENANT, "stale wording"),)
        await world.store.put_wait_reasons(waiting[1], wrong)
        await world.store.put_wait_reasons(running[0], wrong)

        writes = _count_writes(world, monkeypatch)
        await world.another_scheduler().run_cycle(None)
        assert sorted(writes) == sorted([(waiting[1], len(stored[waiting[1]])), (running[0], 0)])
        assert {j: await world.store.get_wait_reasons(j) for j in waiting} == stored
        assert await world.store.get_wait_reasons(running[0]) == ()
