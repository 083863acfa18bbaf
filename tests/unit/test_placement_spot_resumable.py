"""Spot for gangs that checkpoint (`resumable: true`): a reclaim costs them the work since their last
checkpoint, not their whole run, so the bound on restarts from scratch does not keep them off spot.

A cloud cluster with A100 spot at $0.30 (0.05 reclaims per node-hour) and on demand at $2.70, the bound
at 30 %: a gang of one node may take spot for runs up to about 10 h if it restarts from scratch. A 48 h
gang that checkpoints takes spot, priced with the work a reclaim loses (0.05 x 0.5 h per hour run);
the same gang without checkpoints is kept on demand. What a tenant gains by saying its jobs resume is
spot at its own risk: no place in the queue, no private GPU, no quota it would not have had.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from placement.explain import admitted
from placement.model import CapacityKind, GangRequest, Plan, WaitCode
from placement.plan import plan
from tests.unit.placement_builders import (
    GangBuilder,
    SnapshotBuilder,
    a_cluster,
    a_gang,
    a_snapshot,
    a_tenant,
)

PRIVATE, ON_DEMAND, SPOT = CapacityKind.PRIVATE, CapacityKind.ON_DEMAND, CapacityKind.SPOT
HOUR = 3600
RISK, SPOT_PRICE, ON_DEMAND_PRICE = 0.05, 0.3, 2.7


def world(*, lost_work_h: float = 0.5, spot_nodes: int = 16, on_demand_nodes: int = 16) -> SnapshotBuilder:
    return (
        a_snapshot()
        .clusters(
            a_cluster("cloud")
            .pool("A100", kind=SPOT, price=SPOT_PRICE, risk=RISK, nodes=spot_nodes)
            .pool("A100", kind=ON_DEMAND, price=ON_DEMAND_PRICE, nodes=on_demand_nodes)
        )
        .policy(spot_max_restart_slowdown=0.3, spot_lost_work_h=lost_work_h)
    )


def resumable(gang: GangBuilder) -> GangRequest:
    return replace(gang.build(), resumable=True)


def two_days(job_id: str) -> GangBuilder:
    return a_gang(job_id).runtime(limit_s=48 * HOUR).allow_spot()


def kinds(result: Plan) -> dict[str, CapacityKind]:
    return {a.job_id: a.kind for a in result.admissions}


def test_a_resumable_gang_takes_spot_where_the_same_gang_without_checkpoints_is_kept_off() -> None:
    # Two gangs equal in all but `resumable`, in one cycle: neither decision is reused for the other.
    result = plan(world().queue(two_days("restarts"), resumable(two_days("resumes"))).build(), now=0.0)
    assert kinds(result) == {"restarts": ON_DEMAND, "resumes": SPOT}
    (spot,) = [a for a in result.admissions if a.job_id == "resumes"]
    assert spot.usd_per_gpu_hour == SPOT_PRICE
    # 8 GPUs for 48 h at the spot price, plus a reclaim's half hour of work lost 0.05 times an hour.
    assert spot.expected_cost_usd == pytest.approx(SPOT_PRICE * (1 + RISK * 0.5) * 8 * 48)


def test_explain_says_a_reclaim_costs_a_resumable_gang_its_work_since_the_last_checkpoint() -> None:
    result = plan(world().queue(resumable(two_days("resumes")), two_days("restarts")).build(), now=0.0)
    words = {str(a.job_id): admitted(a) for a in result.admissions}
    assert "spot: resumable, a reclaim costs about 0.5 h of work" in words["resumes"]
    assert "placed on cluster cloud (A100, spot, $0.30/GPU-hour)" in words["resumes"]
    assert "resumable" not in words["restarts"]
    # The operator's estimate of the work lost is the one stated.
    longer = plan(world(lost_work_h=1.5).queue(resumable(two_days("resumes"))).build(), now=0.0)
    assert "a reclaim costs about 1.5 h of work" in admitted(longer.admissions[0])


def test_a_short_gang_on_spot_without_checkpoints_is_not_called_resumable() -> None:
    result = plan(world().queue(a_gang("short").runtime(limit_s=2 * HOUR).allow_spot()).build(), now=0.0)
    (admission,) = result.admissions
    assert admission.kind is SPOT
    assert "resumable" not in admitted(admission)


def test_with_only_spot_free_the_resumable_gang_runs_and_the_other_is_told_why_it_waits() -> None:
    result = plan(
        world(on_demand_nodes=0).queue(two_days("restarts"), resumable(two_days("resumes"))).build(), now=0.0
    )
    assert kinds(result) == {"resumes": SPOT}
    (waiting,) = result.waiting
    assert waiting.job_id == "restarts"
    assert WaitCode.SPOT_NOT_ALLOWED in {r.code for r in waiting.reasons}


def test_a_gang_that_does_not_allow_spot_stays_off_it_resumable_or_not() -> None:
    gang = resumable(a_gang("on-demand-only").runtime(limit_s=48 * HOUR))
    assert kinds(plan(world().queue(gang).build(), now=0.0)) == {"on-demand-only": ON_DEMAND}


# -- what another tenant could gain by saying its jobs resume


def private_and_spot() -> SnapshotBuilder:
    return (
        a_snapshot()
        .clusters(
            a_cluster("dc").pool("A100", kind=PRIVATE, price=1.0, nodes=1),
            a_cluster("cloud").pool("A100", kind=SPOT, price=SPOT_PRICE, risk=RISK, nodes=4),
        )
        .tenants(a_tenant("alice"), a_tenant("mallory"))
        .policy(spot_max_restart_slowdown=0.3, prefer_private=True)
    )


def test_saying_a_job_resumes_buys_no_place_ahead_of_another_tenants_job() -> None:
    # alice's job came first and does not checkpoint; mallory's, later, says it does. alice's takes the
    # one private node; mallory's gets spot, which alice's could not use.
    result = plan(
        private_and_spot()
        .queue(
            two_days("alice-job").tenant("alice").queued_at(0),
            resumable(two_days("mallory-job").tenant("mallory").queued_at(10)),
        )
        .build(),
        now=20.0,
    )
    placed = {a.job_id: (a.cluster, a.kind) for a in result.admissions}
    assert placed == {"alice-job": ("dc", PRIVATE), "mallory-job": ("cloud", SPOT)}


def test_a_resumable_gang_is_held_to_its_tenants_quota_on_spot() -> None:
    # mallory may hold 8 A100s: a second resumable gang waits, spot or not.
    snapshot = (
        world()
        .tenants(a_tenant("mallory").cap("A100", 8))
        .queue(
            resumable(two_days("first").tenant("mallory")),
            resumable(two_days("second").tenant("mallory").queued_at(1)),
        )
        .build()
    )
    result = plan(snapshot, now=10.0)
    assert kinds(result) == {"first": SPOT}
    assert [w.job_id for w in result.waiting] == ["second"]
