"""Which gangs may take spot capacity, and idle private GPUs before spot.

A spot reclaim restarts a job that does not checkpoint from scratch: with x reclaims expected over
its run, it takes (e^x - 1) / x times as long in expectation (the time to the first gap of length T
in a Poisson process of rate r is (e^(rT) - 1) / r). `spot_max_restart_slowdown` bounds that, so
that short, small jobs use spot and multi-day gangs do not; `prefer_private` takes idle private GPUs
first, since their internal rate is paid whether they run or not.
"""

from __future__ import annotations

import math
import random

import pytest

from placement.cost import restart_exposure_for, restart_slowdown
from placement.model import CapacityKind, Plan, WaitCode
from placement.plan import plan
from tests.unit.placement_builders import SnapshotBuilder, a_cluster, a_gang, a_snapshot

PRIVATE, ON_DEMAND, SPOT = CapacityKind.PRIVATE, CapacityKind.ON_DEMAND, CapacityKind.SPOT
HOUR = 3600


def placed(result: Plan) -> dict[str, tuple[str, str]]:
    return {a.job_id: (a.cluster, a.kind.value) for a in result.admissions}


def simulated_slowdown(exposure: float, runs: int = 20_000) -> float:
    """Monte Carlo of a run of length 1 restarted from scratch at reclaims of rate `exposure`."""
    rng = random.Random(7)
    total = 0.0
    for _ in range(runs):
        elapsed = 0.0
        while True:
            gap = rng.expovariate(exposure)
            if gap >= 1.0:
                elapsed += 1.0
                break
            elapsed += gap
        total += elapsed
    return total / runs - 1.0


@pytest.mark.parametrize("exposure", [0.1, 0.5, 1.0, 2.0])
def test_the_slowdown_formula_matches_restarting_from_scratch(exposure: float) -> None:
    # An independent check of the closed form: simulate the restarts.
    assert restart_slowdown(exposure) == pytest.approx(simulated_slowdown(exposure), rel=0.05)


@pytest.mark.parametrize("bound", [0.01, 0.1, 0.3, 1.0, 5.0])
def test_the_exposure_for_a_bound_inverts_the_slowdown(bound: float) -> None:
    exposure = restart_exposure_for(bound)
    assert restart_slowdown(exposure) == pytest.approx(bound, rel=1e-6)
    assert restart_slowdown(exposure * 1.01) > bound
    assert restart_exposure_for(0.0) == 0.0
    assert math.isclose(restart_slowdown(0.0), 0.0)


def spot_world(bound: float | None, risk: float = 0.05) -> SnapshotBuilder:
    return (
        a_snapshot()
        .clusters(
            a_cluster("cloud")
            .pool("A100", kind=SPOT, price=0.3, risk=risk, nodes=16)
            .pool("A100", kind=ON_DEMAND, price=2.7, nodes=16)
        )
        .policy(spot_max_restart_slowdown=bound)
    )


def test_short_small_gangs_take_spot_and_long_wide_ones_on_demand() -> None:
    # The 30 % bound allows about 0.52 reclaims expected over the run: at 0.05 per node-hour, one
    # node for 10 h (0.5) but not for 11 h (0.55), and two nodes for 5 h but not 6.
    result = plan(
        spot_world(0.3)
        .queue(
            a_gang("one-node-10h").runtime(limit_s=10 * HOUR).allow_spot(),
            a_gang("one-node-11h").runtime(limit_s=11 * HOUR).allow_spot(),
            a_gang("two-nodes-5h").gang(2).runtime(limit_s=5 * HOUR).allow_spot(),
            a_gang("two-nodes-6h").gang(2).runtime(limit_s=6 * HOUR).allow_spot(),
            a_gang("no-spot-1h").runtime(limit_s=HOUR),
        )
        .build(),
        now=0.0,
    )
    kinds = {job: kind for job, (_, kind) in placed(result).items()}
    assert kinds == {
        "one-node-10h": "spot",
        "one-node-11h": "on_demand",
        "two-nodes-5h": "spot",
        "two-nodes-6h": "on_demand",
        "no-spot-1h": "on_demand",
    }


def test_without_a_bound_every_gang_that_allows_spot_takes_it() -> None:
    result = plan(
        spot_world(None).queue(a_gang("week-long").gang(4).runtime(limit_s=168 * HOUR).allow_spot()).build(),
        now=0.0,
    )
    assert placed(result) == {"week-long": ("cloud", "spot")}


def test_the_bound_reads_the_pools_reclaim_rate() -> None:
    # The same 10 h gang: within the bound at 0.05 reclaims per node-hour, not at 0.1.
    gang = a_gang("ten-hours").runtime(limit_s=10 * HOUR).allow_spot()
    assert placed(plan(spot_world(0.3, risk=0.05).queue(gang).build(), now=0.0))["ten-hours"][1] == "spot"
    assert placed(plan(spot_world(0.3, risk=0.1).queue(gang).build(), now=0.0))["ten-hours"][1] == "on_demand"


def test_a_gang_kept_off_spot_is_told_why_when_nothing_else_fits() -> None:
    snapshot = (
        a_snapshot()
        .clusters(a_cluster("cloud").pool("A100", kind=SPOT, price=0.3, risk=0.05, nodes=4))
        .policy(spot_max_restart_slowdown=0.3)
        .queue(
            a_gang("long").runtime(limit_s=48 * HOUR).allow_spot(), a_gang("short").queued_at(1).allow_spot()
        )
        .build()
    )
    result = plan(snapshot, now=0.0)
    # A gang without a stated run time is priced at the default of an hour: within the bound.
    assert placed(result) == {"short": ("cloud", "spot")}
    (why,) = [w for w in result.waiting if w.job_id == "long"]
    notes = [r for r in why.reasons if r.code is WaitCode.SPOT_NOT_ALLOWED]
    assert len(notes) == 1, why.reasons
    assert notes[0].cluster == "cloud"
    assert "restarting it from scratch" in notes[0].message
    # 48 h at 0.05: 2.4 reclaims expected, (e^2.4 - 1) / 2.4 - 1 = 318 %.
    assert "318%" in notes[0].message
    assert "allows 30%" in notes[0].message


def test_idle_private_gpus_are_taken_before_cheaper_spot_when_preferred() -> None:
    world = (
        a_snapshot()
        .clusters(
            a_cluster("cloud").pool("A100", kind=SPOT, price=0.3, risk=0.05, nodes=4),
            a_cluster("onprem").pool("A100", kind=PRIVATE, price=1.0, nodes=1),
        )
        .queue(a_gang("first").allow_spot(), a_gang("second").queued_at(1).allow_spot())
    )
    by_price = plan(world.build(), now=0.0)
    assert placed(by_price) == {"first": ("cloud", "spot"), "second": ("cloud", "spot")}
    preferred = plan(world.policy(prefer_private=True).build(), now=0.0)
    # One private node: the first gang takes it, the second (no private room left) takes spot.
    assert placed(preferred) == {"first": ("onprem", "private"), "second": ("cloud", "spot")}


def test_prefer_private_does_not_change_the_order_among_cloud_offers() -> None:
    world = (
        a_snapshot()
        .clusters(
            a_cluster("dear").pool("A100", kind=ON_DEMAND, price=3.0),
            a_cluster("cheap").pool("A100", kind=ON_DEMAND, price=2.0),
        )
        .policy(prefer_private=True)
        .queue(a_gang("j1"))
    )
    assert placed(plan(world.build(), now=0.0)) == {"j1": ("cheap", "on_demand")}


def test_spot_pools_grow_only_for_gangs_the_bound_lets_onto_spot() -> None:
    result = plan(
        a_snapshot()
        .clusters(
            a_cluster("cloud")
            .scalable("A100", max_nodes=4, kind=SPOT, price=0.3, risk=0.05, name="a100-spot")
            .scalable("A100", max_nodes=4, kind=ON_DEMAND, price=2.7, name="a100-od")
        )
        .policy(spot_max_restart_slowdown=0.3)
        .queue(
            a_gang("short").runtime(limit_s=2 * HOUR).allow_spot(),
            a_gang("long").runtime(limit_s=48 * HOUR).allow_spot().queued_at(1),
        )
        .build(),
        now=0.0,
    )
    asked = {r.job_ids: r.pool for r in result.capacity_requests}
    assert asked == {("short",): "a100-spot", ("long",): "a100-od"}
