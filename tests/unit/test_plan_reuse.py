"""A wait decided for one gang is reused for an equal gang decided on the same working state
(`placement.plan._Cycle.decide`): the plan must be exactly the plan of deciding every gang afresh.

Queues here repeat each gang a few times (other ids, later queue times), as deep queues do, under
policies that reach every path a reuse could go wrong on: preemption and its per-interval limit,
backfill reservations, the private wait (which reads the queue time), spot and tenant caps.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.placer_scenario import NOW, build
from placement.model import (
    CapacityKind,
    ClusterName,
    ClusterState,
    GangRequest,
    GpuType,
    JobId,
    NodePool,
    NodeShare,
    PolicyConfig,
    Provider,
    Snapshot,
    TenantId,
    WaitCode,
)
from placement.model_policy import TenantQuota
from placement.plan import _plan
from tests.properties import examples
from tests.unit.test_plan_properties import snapshots

POLICIES = st.sampled_from(
    [
        PolicyConfig(),
        PolicyConfig(preemption=False, backfill=False),
        PolicyConfig(preemption_limit_gpus=8),
        PolicyConfig(private_wait_s_per_gpu_hour=600.0, wait_value_usd_per_hour=5.0),
        PolicyConfig(
            private_wait_s_per_gpu_hour=600.0,
            private_wait_needs_start=True,
            private_wait_reserve=True,
            private_wait_reservations=2,
        ),
        PolicyConfig(spot_max_restart_slowdown=0.2),
    ]
)


@st.composite
def deep_queues(draw: st.DrawFn) -> Snapshot:
    base = draw(snapshots())
    copies = draw(st.integers(2, 4))
    queued = tuple(
        replace(g, job_id=JobId(f"{g.job_id}-{k}"), queued_at_s=g.queued_at_s + 0.25 * k)
        for g in base.queued
        for k in range(copies)
    )
    # Running gangs on known nodes with known ends, so that preemption and backfill have victims
    # and reservations to make; some already leaving for a queued gang (an earlier cycle's order).
    pool = base.clusters[0].pools[0]
    running = tuple(
        replace(
            r,
            cluster=base.clusters[0].name,
            gpu_type=pool.gpu_type,
            nodes=(NodeShare(pool.name, 0, r.gpu_count),),
            ends_at_s=100.0 * (i + 1),
            terminating=leaving,
            evicted_for=queued[i % len(queued)].job_id if leaving and queued else None,
        )
        for i, (r, leaving) in enumerate(
            zip(base.running, draw(st.lists(st.booleans(), min_size=3, max_size=3)), strict=False)
        )
        if pool.free_gpus_per_node
    )
    return replace(base, queued=queued, running=running, policy=draw(POLICIES))


def _same(snapshot: Snapshot, now: float) -> None:
    reused, fresh = _plan(snapshot, now, reuse=True), _plan(snapshot, now, reuse=False)
    assert reused.admissions == fresh.admissions
    assert reused.preemptions == fresh.preemptions
    assert reused.capacity_requests == fresh.capacity_requests
    assert reused.reservations == fresh.reservations
    assert reused.moves == fresh.moves
    assert [(w.job_id, w.reasons) for w in reused.waiting] == [(w.job_id, w.reasons) for w in fresh.waiting]
    # The scheduler skips writing reasons whose key did not change: reuse must keep the keys alike too.
    assert [w.key for w in reused.waiting] == [w.key for w in fresh.waiting]


@settings(max_examples=examples(150), deadline=None)
@given(deep_queues(), st.sampled_from([0.0, 50.0, 1e4]))
def test_reusing_a_wait_gives_the_plan_of_deciding_every_gang_afresh(snapshot: Snapshot, now: float) -> None:
    _same(snapshot, now)


def test_a_deep_queue_of_equal_gangs_is_mostly_reused() -> None:
    """20,000 equal gangs that wait for room: one decision, the rest reused; the plan is the same."""
    a100 = GpuType("A100")
    cluster = ClusterState(
        ClusterName("onprem"),
        Provider.PRIVATE,
        "dc1",
        (NodePool("a100", a100, CapacityKind.PRIVATE, 1.1, 8, (0, 0, 0, 4)),),
    )
    queued = tuple(
        GangRequest(JobId(f"bob-{i:05d}"), TenantId("nlp"), 0, 1000.0 + i, (8,), (a100,))
        for i in range(2_000)
    )
    snapshot = Snapshot(queued, (), (TenantQuota(TenantId("nlp")),), (cluster,))
    _same(snapshot, 5000.0)


def _copies(snapshot: Snapshot, copies: int) -> Snapshot:
    queued = tuple(
        replace(g, job_id=JobId(f"{g.job_id}-{k}"), queued_at_s=g.queued_at_s + 0.25 * k)
        for g in snapshot.queued
        for k in range(copies)
    )
    return replace(snapshot, queued=queued)


@pytest.mark.parametrize(
    "policy",
    [
        "as built",
        "burst at once",
        "a low preemption limit",
        "a reserved private wait",
    ],
)
def test_the_busy_federation_with_each_gang_three_times_plans_alike(policy: str) -> None:
    """bench/placer's federation (quotas, budgets, priority classes, datasets, deadlines, spot,
    growable pools, running gangs on known nodes), each queued gang three times."""
    snapshot = _copies(build(gangs=700), 3)
    built = snapshot.policy
    snapshot = replace(
        snapshot,
        policy={
            "as built": built,
            "burst at once": replace(built, private_wait_s_per_gpu_hour=0.0),
            "a low preemption limit": replace(
                built, private_wait_s_per_gpu_hour=0.0, preemption_limit_gpus=24
            ),
            "a reserved private wait": replace(
                built, private_wait_needs_start=True, private_wait_reserve=True, private_wait_reservations=3
            ),
        }[policy],
    )
    _same(snapshot, NOW)


def test_a_gang_after_its_tenant_took_room_is_decided_again() -> None:
    """bob-1 waits for room (8 GPUs, 4 free) within his cap of 8; bob-2 (2 GPUs) is admitted; bob-3,
    equal to bob-1, now also passes the cap: his reasons must say so, not repeat bob-1's."""
    a100 = GpuType("A100")
    cluster = ClusterState(
        ClusterName("onprem"),
        Provider.PRIVATE,
        "dc1",
        (NodePool("a100", a100, CapacityKind.PRIVATE, 1.1, 8, (4,)),),
    )
    nlp = TenantId("nlp")
    queued = (
        GangRequest(JobId("bob-1"), nlp, 0, 1.0, (8,), (a100,)),
        GangRequest(JobId("bob-2"), nlp, 0, 2.0, (2,), (a100,)),
        GangRequest(JobId("bob-3"), nlp, 0, 3.0, (8,), (a100,)),
    )
    snapshot = Snapshot(queued, (), (TenantQuota(nlp, gpu_caps=((a100, 8),)),), (cluster,))
    _same(snapshot, 10.0)
    reasons = {w.job_id: {r.code for r in w.reasons} for w in _plan(snapshot, 10.0, reuse=True).waiting}
    assert WaitCode.TENANT_CAP_REACHED not in reasons[JobId("bob-1")]
    assert WaitCode.TENANT_CAP_REACHED in reasons[JobId("bob-3")]
