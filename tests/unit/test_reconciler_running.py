"""A tick walks only the jobs that may need action, not every running one (issue 33).

Most live jobs of a real federation run for hours with nothing to decide; each cost every tick a
task, two slots and the keeper's hook. Now a running job whose gang runs on, on a cluster that
answers, is settled by a few lookups, and `_reconcile` sees only the rest. The outcomes are the
same: a gang that ends, a cancel, a preemption or a silent cluster still reach `_reconcile` on the
tick that sees them, and the gang's start is remembered for the ledger all the same.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from placement.model import JobId, JobPhase
from tests.unit.reconcile_world import World, a_job, build_world, submit


def _spy(world: World) -> list[JobId]:
    """The jobs `_reconcile` is called for, tick after tick."""
    seen: list[JobId] = []
    original = world.reconciler._reconcile

    async def spied(stored: Any, *args: Any) -> bool:
        seen.append(stored.value.job_id)
        return await original(stored, *args)

    world.reconciler._reconcile = spied  # type: ignore[method-assign,assignment]
    return seen


async def test_running_jobs_whose_gangs_run_on_are_not_walked() -> None:
    async with build_world() as world:
        ids = [await submit(world, a_job(f"long-{i}", gpus=1, duration="3600s")) for i in range(4)]
        await world.step()
        await world.step(1.0)
        assert {(await world.job(i)).phase for i in ids} == {JobPhase.RUNNING}
        seen = _spy(world)
        for _ in range(3):
            await world.reconciler.tick(None)
        assert seen == [], "nothing to decide for a running job whose gang runs on"
        # The start each gang reported is kept for the ledger, as `_reconcile` kept it.
        for job_id in ids:
            assert (job_id, 1) in world.reconciler._started_at


async def test_what_changes_a_running_job_still_reaches_it() -> None:
    async with build_world() as world:
        short = await submit(world, a_job("short", gpus=1, duration="5s"))
        cancelled = await submit(world, a_job("cancelled", gpus=1, duration="3600s"))
        steady = await submit(world, a_job("steady", gpus=1, duration="3600s"))
        await world.step()
        await world.step(1.0)
        assert {(await world.job(i)).phase for i in (short, cancelled, steady)} == {JobPhase.RUNNING}
        seen = _spy(world)
        stored = await world.store.get_job(cancelled)
        assert stored is not None
        await world.store.commit([(replace(stored.value, cancel_requested=True), stored.mod_revision)])
        await world.step(10.0)
        assert short in seen
        assert cancelled in seen
        assert steady not in seen
        assert (await world.job(short)).phase is JobPhase.SUCCEEDED
        assert (await world.job(cancelled)).phase is JobPhase.CANCELLED
        assert (await world.job(steady)).phase is JobPhase.RUNNING
