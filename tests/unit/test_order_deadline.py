"""Issue 30 item 12: a preemption or move order its member cluster keeps refusing is withdrawn at its
deadline, which frees the room it held; a job in dispatch backoff says why it waits.

Driven over the in-memory store and simulated clusters on a fake clock (`reconcile_world`), with a
member cluster that refuses every eviction, and checked as the user reads it: the job's record
(`get`/`list` show its phase and reason) and the waiting job's reasons (`explain`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from clusters.api import ClusterError
from clusters.memory import InMemoryCluster
from federation.scheduling.dispatch_backoff import BACKOFF_PREFIX, backoff_reason
from federation.scheduling.reconciler import ORDER_DEADLINE_S, ORDER_HOLD_OFF_S
from federation.store.records import SchedulingSettings, TenantRecord
from placement.model import ClusterName, GpuQuota, GpuType, JobId, JobPhase, PolicyConfig, TenantId, WaitCode
from tests.unit.reconcile_world import World, a_job, build_world, submit

A100 = GpuType("A100")
GRACE_S = 20.0
TENANTS = (
    TenantRecord(TenantId("vision"), quotas=(GpuQuota(A100, guaranteed_gpus=8, borrowing_limit_gpus=8),)),
    TenantRecord(TenantId("nlp"), quotas=(GpuQuota(A100, guaranteed_gpus=8, borrowing_limit_gpus=8),)),
)
SETTINGS = SchedulingSettings(policy=PolicyConfig(default_grace_period_s=GRACE_S))


class RefusesEvictions:
    """Wraps the cluster's `evict` so that every eviction is refused, as a cluster whose API keeps
    answering 403 or 500 to the delete would."""

    def __init__(self, cluster: InMemoryCluster) -> None:
        self.refused = 0

        async def evict(job_id: JobId, attempt: int, grace_period_s: float, reason: str) -> None:
            self.refused += 1
            raise ClusterError("admission webhook denied the request: evictions are frozen")

        cluster.evict = evict  # type: ignore[method-assign]


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with build_world(tenants=TENANTS, settings=SETTINGS) as w:
        yield w


async def _reclaim_ordered(world: World) -> tuple[JobId, JobId]:
    borrower = await submit(world, a_job("borrower", tenant="nlp", gpus=8, duration="1h", queued_at_s=900.0))
    await world.step()
    assert (await world.job(borrower)).phase is JobPhase.RUNNING  # all 16 GPUs, 8 of them borrowed
    owner = await submit(world, a_job("owner", tenant="vision", gpus=4, duration="60s"))
    await world.step()
    order = (await world.job(borrower)).preemption
    assert order is not None
    assert order.for_job == owner
    return borrower, owner


async def test_an_eviction_the_cluster_keeps_refusing_is_withdrawn_at_its_deadline(world: World) -> None:
    refuser = RefusesEvictions(world.cluster)
    borrower, owner = await _reclaim_ordered(world)
    reasons = await world.store.get_wait_reasons(owner)
    assert [r.code for r in reasons][-1] is WaitCode.PREEMPTING, "the owner waits, its room held"

    # Within the deadline the order stands, however often the cluster refuses.
    await world.step(GRACE_S + ORDER_DEADLINE_S - 5)
    assert refuser.refused >= 2
    assert (await world.job(borrower)).preemption is not None

    await world.step(10)
    victim = await world.job(borrower)
    assert victim.preemption is None, "the order is withdrawn at its deadline"
    assert victim.phase is JobPhase.RUNNING
    assert victim.attempt == 1
    assert victim.retries_used == 0
    assert victim.reason.startswith("preemption withdrawn: cluster onprem refused to evict the gang"), (
        victim.reason
    )
    assert "evictions are frozen" in victim.reason
    assert owner not in victim.reason, "the job it was for may be another tenant's"

    # The room is no longer held for the owner: it waits on capacity, and no new order names the
    # borrower while the hold-off lasts.
    await world.step()
    reasons = await world.store.get_wait_reasons(owner)
    assert WaitCode.PREEMPTING not in [r.code for r in reasons], reasons
    assert (await world.job(owner)).phase is JobPhase.QUEUED
    await world.step(ORDER_HOLD_OFF_S / 2)
    assert (await world.job(borrower)).preemption is None

    # After the hold-off the placer may order again (the cluster may have recovered).
    await world.step(ORDER_HOLD_OFF_S / 2 + 1)
    assert (await world.job(borrower)).preemption is not None


async def test_an_eviction_the_cluster_takes_is_not_withdrawn(world: World) -> None:
    borrower, owner = await _reclaim_ordered(world)
    await world.step(GRACE_S + 1)
    victim = await world.job(borrower)
    assert victim.attempt == 2
    assert "withdrawn" not in victim.reason
    assert (await world.job(owner)).phase is JobPhase.RUNNING


async def test_a_refused_dispatch_says_why_the_job_waits_during_its_backoff(world: World) -> None:
    world.cluster.refuse_dispatches("the namespace is being deleted")
    job_id = await submit(world, a_job("refused", tenant="vision", gpus=4))
    await world.step()
    job = await world.job(job_id)
    assert job.phase is JobPhase.ADMITTED, "admitted again to the only cluster, backing off"
    assert job.reason.startswith(f"{BACKOFF_PREFIX} cluster onprem refused its gang"), job.reason
    assert "the namespace is being deleted" in job.reason
    assert "next try at" in job.reason

    world.cluster.refuse_dispatches(None)
    await world.step(400)
    job = await world.job(job_id)
    assert job.phase in (JobPhase.DISPATCHED, JobPhase.RUNNING, JobPhase.SUCCEEDED)
    assert job.reason == "", "once dispatched, the backoff's reason is gone"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        pytest.param(
            "x refused the gang: webhook",
            "waiting to dispatch again: cluster c1 refused its gang (x refused the gang: webhook); "
            "next try at 00:01:40 UTC",
            id="its-own-refusal",
        ),
        pytest.param(
            "e" * 400,
            f"waiting to dispatch again: cluster c1 refused its gang ({'e' * 200}); next try at 00:01:40 UTC",
            id="a-long-error-is-cut",
        ),
    ],
)
def test_backoff_reason_words(error: str, expected: str) -> None:
    assert backoff_reason(ClusterName("c1"), 100.0, error, None) == expected


async def test_a_move_the_cloud_keeps_refusing_is_withdrawn_and_its_private_room_freed() -> None:
    settings = SchedulingSettings(
        policy=PolicyConfig(default_grace_period_s=GRACE_S, repatriate=True, repatriate_min_saving_usd=100.0)
    )
    tenants = (
        TenantRecord(
            TenantId("vision"), quotas=(GpuQuota(A100, guaranteed_gpus=16, borrowing_limit_gpus=32),)
        ),
    )
    # "onprem" (private, 16 A100) and "cloud" (on demand, 16 A100), which refuses every eviction.
    async with build_world(cluster_count=2, tenants=tenants, settings=settings) as world:
        RefusesEvictions(world.clusters["cloud"])
        blocker = await submit(world, a_job("blocker", gpus=8, duration="60s", queued_at_s=100.0))
        await world.step()
        job = a_job("long", gpus=4, duration="10h", queued_at_s=900.0)
        long = await submit(world, replace(job, spec=replace(job.spec, resumable=True, max_runtime_s=86_400)))
        await world.step()
        await world.step(61)
        assert (await world.job(blocker)).phase is JobPhase.SUCCEEDED
        order = (await world.job(long)).preemption
        assert order is not None
        assert order.move_to == "onprem"

        # A job that needs all of onprem waits: 8 of its 16 GPUs are held for the move.
        later = await submit(world, a_job("later", gpus=8, duration="10m", queued_at_s=950.0))
        await world.step()
        assert (await world.job(later)).phase is JobPhase.QUEUED
        await world.step(GRACE_S + ORDER_DEADLINE_S - 5)
        assert (await world.job(later)).phase is JobPhase.QUEUED, "the room stays held until the deadline"

        await world.step(10)
        mover = await world.job(long)
        assert mover.preemption is None
        assert (mover.phase, mover.attempt) == (JobPhase.RUNNING, 1)
        assert mover.reason.startswith("move to cluster onprem withdrawn: cluster cloud refused"), (
            mover.reason
        )
        placed = await world.job(later)
        assert placed.placement is not None, "the held room is free again"
        assert placed.placement.cluster == "onprem"
        await world.step(60)
        assert (await world.job(long)).preemption is None, "not moved again during the hold-off"
