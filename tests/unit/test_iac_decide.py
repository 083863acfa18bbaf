"""Pool sizes from the placer's requests, capacity plans, limits and idle time (pure decisions)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from iac.decide import Decision, Limits, RefusalCode, decide
from iac.plans import DeadlineJob, DeadlinePlan, FixedPlan, gpus_for_deadline, makespan_s, required_capacity
from iac.pool_state import PoolState
from placement.model import CapacityKind, CapacityRequest, ClusterName, GpuType, JobId, Provider

AWS = ClusterName("aws")
H100 = PoolState(
    cluster=AWS, pool="h100", provider=Provider.AWS, gpu_type=GpuType("H100"), kind=CapacityKind.ON_DEMAND,
    gpus_per_node=8, usd_per_gpu_hour=4.0, nodes=1, busy_nodes=1, max_nodes=8,
)  # fmt: skip
H100_SPOT = replace(
    H100, pool="h100-spot", kind=CapacityKind.SPOT, usd_per_gpu_hour=2.0, nodes=0, busy_nodes=0
)
NOW = 10_000.0
HOUR = 3600.0


def a_request(nodes: int, *jobs: str, pool: str = "h100") -> CapacityRequest:
    return CapacityRequest(
        AWS, pool, GpuType("H100"), CapacityKind.ON_DEMAND, nodes, tuple(JobId(j) for j in jobs)
    )


def _decide(**kw: Any) -> Decision:
    args: dict[str, Any] = {"pools": [H100], "requests": [], "plans": [], "limits": Limits(), "now_s": NOW}
    args.update(kw)
    return decide(**args)


def _sizes(decision: Decision) -> dict[str, int]:
    return {c.pool: c.nodes_to for c in decision.changes}


@pytest.mark.parametrize(
    ("kw", "sizes", "refused"),
    [
        pytest.param({"requests": [a_request(4, "big")]}, {"h100": 5}, [], id="a-gang-grows-the-pool"),
        pytest.param(
            {"requests": [a_request(4, "big"), a_request(2, "next")]}, {"h100": 7}, [], id="requests-add-up"
        ),
        pytest.param(
            {"requests": [a_request(6, "a"), a_request(2, "b"), a_request(1, "c")]},
            {"h100": 8},
            [RefusalCode.POOL_MAX_NODES],
            id="whole-gangs-until-the-max",
        ),
        pytest.param(
            {"requests": [a_request(8, "huge")]}, {}, [RefusalCode.POOL_MAX_NODES], id="beyond-max-nodes"
        ),
        pytest.param(
            {"requests": [a_request(4, "big")], "limits": Limits(max_gpus_by_provider={Provider.AWS: 32})},
            {},
            [RefusalCode.PROVIDER_GPU_LIMIT],
            id="over-the-clouds-gpu-limit",
        ),
        pytest.param(
            {"requests": [a_request(3, "big")], "limits": Limits(max_gpus_by_provider={Provider.GCP: 8})},
            {"h100": 4},
            [],
            id="another-clouds-limit-does-not-apply",
        ),
        pytest.param(
            {"requests": [a_request(4, "big")], "limits": Limits(max_usd_per_hour=100.0)},
            {},
            [RefusalCode.SPEND_CEILING],
            id="over-spend-ceiling",
        ),
        pytest.param(
            {
                "requests": [a_request(2, "big"), a_request(2, "next")],
                "limits": Limits(max_usd_per_hour=100.0),
            },
            {"h100": 3},
            [RefusalCode.SPEND_CEILING],
            id="ceiling-admits-the-first-only",
        ),
        pytest.param(
            {"requests": [a_request(4, "big")], "provisioning_for": frozenset({JobId("big")})},
            {},
            [],
            id="already-being-provisioned",
        ),
        pytest.param(
            {"requests": [a_request(4, "big")], "starts_at_s": {JobId("big"): NOW + 300}},
            {},
            [RefusalCode.STARTS_SOONER_ELSEWHERE],
            id="starts-before-nodes-would-be-ready",
        ),
        pytest.param(
            {"requests": [a_request(4, "big")], "starts_at_s": {JobId("big"): NOW + 2 * HOUR}},
            {"h100": 5},
            [],
            id="starts-later-than-new-nodes",
        ),
        pytest.param(
            {"requests": [a_request(1, "x", pool="a100")]}, {}, [RefusalCode.UNKNOWN_POOL], id="unknown-pool"
        ),
    ],
)
def test_requests_grow_pools_within_limits(
    kw: dict[str, Any], sizes: dict[str, int], refused: list[RefusalCode]
) -> None:
    decision = _decide(**kw)
    assert _sizes(decision) == sizes
    assert [r.code for r in decision.refused] == refused


def test_a_change_carries_its_jobs_costs_and_reasons() -> None:
    decision = _decide(requests=[a_request(2, "big")], limits=Limits(max_usd_per_hour=1000.0))
    (change,) = decision.changes
    assert (change.nodes_from, change.nodes_to, change.job_ids) == (1, 3, (JobId("big"),))
    assert (change.usd_per_hour_before, change.usd_per_hour_after) == (32.0, 96.0)
    assert change.reason == "2 node(s) for big"
    assert (decision.usd_per_hour_before, decision.usd_per_hour_after) == (32.0, 96.0)


def test_a_refusal_says_which_limit_and_the_figures() -> None:
    decision = _decide(requests=[a_request(4, "big")], limits=Limits(max_usd_per_hour=100.0))
    (refusal,) = decision.refused
    assert refusal.reason == "spend ceiling of $100.00/h ($32.00/h now, +$128.00/h asked)"


@pytest.mark.parametrize(
    ("nodes", "busy", "idle_since", "min_nodes", "expected"),
    [
        pytest.param(3, 1, (NOW - HOUR, NOW - HOUR), 0, 1, id="idle-past-ttl-released"),
        pytest.param(3, 1, (NOW - HOUR, NOW - 60), 0, 2, id="only-the-nodes-idle-long-enough"),
        pytest.param(3, 1, (NOW - 60, NOW - 60), 0, 3, id="idle-within-ttl-kept"),
        pytest.param(3, 3, (), 0, 3, id="busy-nodes-never-go"),
        pytest.param(3, 0, (NOW - HOUR,) * 3, 2, 2, id="never-below-the-minimum"),
        pytest.param(3, 0, (NOW - HOUR,) * 3, 0, 0, id="an-idle-pool-empties"),
        # An inconsistent report (more idle than not-busy) still never goes below the busy count.
        pytest.param(3, 2, (NOW - HOUR,) * 3, 0, 2, id="busy-wins-over-a-stale-idle-list"),
    ],
)
def test_idle_nodes_go_after_the_ttl_but_never_busy_ones(
    nodes: int, busy: int, idle_since: tuple[float, ...], min_nodes: int, expected: int
) -> None:
    pool = replace(H100, nodes=nodes, busy_nodes=busy, idle_since_s=idle_since, min_nodes=min_nodes)
    decision = _decide(pools=[pool], limits=Limits(idle_ttl_s=1800))
    assert _sizes(decision).get("h100", nodes) == expected


def test_a_pool_that_grows_for_a_request_does_not_also_shrink() -> None:
    pool = replace(H100, nodes=3, busy_nodes=1, idle_since_s=(NOW - HOUR, NOW - HOUR))
    decision = _decide(pools=[pool], requests=[a_request(2, "big")], limits=Limits(idle_ttl_s=1800))
    assert _sizes(decision) == {"h100": 5}


PLAN = FixedPlan("p1", AWS, GpuType("H100"), gpus=64, start_s=NOW + 500, end_s=NOW + 5000, reason="launch")


@pytest.mark.parametrize(
    ("now", "pool", "expected"),
    [
        pytest.param(NOW - 200, H100, None, id="more-than-the-lead-time-before-start"),
        pytest.param(NOW, H100, 8, id="provisioned-ahead-by-the-lead-time"),
        pytest.param(
            NOW + 1000,
            replace(H100, nodes=8, idle_since_s=(NOW,) * 7),
            None,
            id="held-while-it-runs-though-idle",
        ),
        pytest.param(
            NOW + 5000, replace(H100, nodes=8, idle_since_s=(NOW,) * 7), 1, id="released-after-its-end"
        ),
    ],
)
def test_a_fixed_plan_is_provisioned_ahead_and_released_after(
    now: float, pool: PoolState, expected: int | None
) -> None:
    decision = _decide(pools=[pool], plans=[PLAN], limits=Limits(lead_time_s=600, idle_ttl_s=0), now_s=now)
    assert _sizes(decision).get("h100") == expected
    if expected == 8:
        (change,) = decision.changes
        assert change.plan_ids == ("p1",)
        assert "capacity plan(s) p1" in change.reason


def test_plans_fill_on_demand_before_spot_and_report_what_does_not_fit() -> None:
    plan = replace(PLAN, gpus=80)
    required = required_capacity([plan], [H100_SPOT, H100], now_s=NOW, lead_time_s=600)
    assert required.floors == {(AWS, "h100"): 8, (AWS, "h100-spot"): 2}
    big = replace(PLAN, gpus=200)
    (need,) = required_capacity([big], [H100_SPOT, H100], now_s=NOW, lead_time_s=600).needs
    assert (need.shortfall_gpus, need.reason) == (72, "72 GPU(s) beyond the pools' maximum")


def test_a_plan_is_held_back_by_the_clouds_gpu_limit() -> None:
    decision = _decide(plans=[PLAN], limits=Limits(lead_time_s=600, max_gpus_by_provider={Provider.AWS: 40}))
    assert _sizes(decision) == {"h100": 5}
    assert "aws limit of 40 GPUs" in decision.changes[0].reason


def test_a_plans_cost_counts_against_the_spend_ceiling_for_requests() -> None:
    pools = [replace(H100, nodes=0, busy_nodes=0)]
    decision = _decide(
        pools=pools, plans=[replace(PLAN, gpus=16)], requests=[a_request(1, "big")],
        limits=Limits(lead_time_s=600, max_usd_per_hour=70.0),
    )  # fmt: skip
    assert _sizes(decision) == {"h100": 2}, "the plan is approved with its cost shown; the request is not"
    assert [r.code for r in decision.refused] == [RefusalCode.SPEND_CEILING]


@pytest.mark.parametrize(
    ("jobs", "available_s", "step", "expected"),
    [
        pytest.param([(8, 10 * HOUR)] * 4, 20 * HOUR, 1, 16, id="two-rounds-of-two"),
        pytest.param([(8, 10 * HOUR)] * 4, 10 * HOUR, 1, 32, id="all-at-once"),
        pytest.param([(32, 60.0)], 24 * HOUR, 1, 32, id="never-fewer-than-a-gang"),
        pytest.param([(8, 10 * HOUR)] * 3, 20 * HOUR, 1, 16, id="gangs-do-not-split"),
        pytest.param([(4, HOUR)] * 3, 2 * HOUR, 8, 8, id="whole-nodes"),
        pytest.param([(8, 30 * HOUR)], 20 * HOUR, 1, None, id="a-job-alone-runs-too-long"),
        pytest.param([], HOUR, 1, 0, id="no-work"),
    ],
)
def test_gpus_for_a_deadline(
    jobs: list[tuple[int, float]], available_s: float, step: int, expected: int | None
) -> None:
    got = gpus_for_deadline(jobs, available_s=available_s, step_gpus=step)
    assert got == expected
    if got:
        assert makespan_s(jobs, got) <= available_s


def test_a_deadline_plan_counts_from_when_new_nodes_would_be_ready_and_ends_at_the_deadline() -> None:
    jobs = tuple(DeadlineJob(JobId(f"j{i}"), 8, 10 * HOUR) for i in range(4))
    plan = DeadlinePlan("d1", AWS, GpuType("H100"), jobs, deadline_s=NOW + 20 * HOUR + 600)
    pools = [replace(H100, nodes=0, busy_nodes=0)]
    (need,) = required_capacity([plan], pools, now_s=NOW, lead_time_s=600).needs
    assert (need.gpus, need.nodes_by_pool, need.meetable) == (16, (((AWS, "h100"), 2),), True)
    (late,) = required_capacity([plan], pools, now_s=NOW + 2 * HOUR, lead_time_s=600).needs
    assert (late.gpus, late.meetable) == (32, True), "less time left: more GPUs at once"
    (hopeless,) = required_capacity([plan], pools, now_s=NOW + 15 * HOUR, lead_time_s=600).needs
    assert (hopeless.gpus, hopeless.meetable) == (32, False)
    (done,) = required_capacity([plan], pools, now_s=plan.deadline_s, lead_time_s=600).needs
    assert (done.gpus, done.active) == (0, False)
