"""Pool sizes from the placer's requests, capacity plans, limits and idle time (pure decisions)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from iac.decide import CapacityPlan, Limits, PoolState, decide, gpus_for_deadline
from placement.model import CapacityKind, ClusterName, GpuType, JobId
from placement.model_plan import CapacityRequest

H100 = PoolState(
    cluster="aws", pool="h100", provider="aws", gpu_type="H100", gpus_per_node=8, usd_per_gpu_hour=4.0,
    nodes=1, busy_nodes=1, max_nodes=8,
)  # fmt: skip
NOW = 10_000.0


def a_request(nodes: int, *jobs: str, pool: str = "h100") -> CapacityRequest:
    return CapacityRequest(
        ClusterName("aws"),
        pool,
        GpuType("H100"),
        CapacityKind.ON_DEMAND,
        nodes,
        tuple(JobId(j) for j in jobs),
    )


def _one(**kw: object) -> tuple[int, str] | None:
    args: dict[str, object] = {"pools": [H100], "requests": [], "plans": [], "limits": Limits(), "now_s": NOW}
    args.update(kw)
    decision = decide(**args)  # type: ignore[arg-type]
    if not decision.changes:
        return None
    (change,) = decision.changes
    return change.nodes_to, change.reason


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        pytest.param({"requests": [a_request(4, "big")]}, 5, id="a-gang-grows-the-pool"),
        pytest.param({"requests": [a_request(4, "big"), a_request(2, "next")]}, 7, id="requests-add-up"),
        pytest.param({"requests": [a_request(8, "huge")]}, None, id="beyond-max-nodes-refused"),
        pytest.param(
            {"requests": [a_request(4, "big")], "limits": Limits(max_gpus_by_provider={"aws": 32})},
            None,
            id="over-the-clouds-gpu-limit",
        ),
        pytest.param(
            {"requests": [a_request(4, "big")], "limits": Limits(max_usd_per_hour=100.0)},
            None,
            id="over-spend-ceiling",
        ),
        pytest.param(
            {"requests": [a_request(4, "big")], "pending_jobs": frozenset({"big"})},
            None,
            id="already-pending",
        ),
    ],
)
def test_requests_grow_pools_within_limits(kw: dict[str, object], expected: int | None) -> None:
    got = _one(**kw)
    assert (got[0] if got else None) == expected


def test_a_refusal_says_which_limit() -> None:
    decision = decide(
        pools=[H100],
        requests=[a_request(4, "big")],
        plans=[],
        limits=Limits(max_usd_per_hour=100.0),
        now_s=NOW,
    )
    (refusal,) = decision.refused
    assert "spend ceiling of $100.00/h ($32.00/h now, +$128.00/h asked)" in refusal.reason


@pytest.mark.parametrize(
    ("idle_since", "busy", "expected"),
    [
        pytest.param(NOW - 3600, 1, 1, id="idle-past-ttl-released"),
        pytest.param(NOW - 60, 1, None, id="idle-within-ttl-kept"),
        pytest.param(NOW - 3600, 3, None, id="never-below-busy-nodes"),
    ],
)
def test_idle_nodes_go_after_the_ttl_but_never_busy_ones(
    idle_since: float, busy: int, expected: int | None
) -> None:
    pool = replace(H100, nodes=3, busy_nodes=busy, idle_nodes=3 - busy, idle_since_s=idle_since)
    got = _one(pools=[pool], limits=Limits(idle_ttl_s=1800))
    assert (got[0] if got else None) == expected


def test_a_capacity_plan_provisions_ahead_by_the_lead_time_and_releases_after_its_end() -> None:
    plan = CapacityPlan("p1", "aws", "h100", gpus=64, start_s=NOW + 500, end_s=NOW + 5000, reason="deadline")
    limits = Limits(lead_time_s=600, idle_ttl_s=0)
    before = _one(plans=[plan], limits=limits, now_s=NOW - 200)
    assert before is None, "not yet: more than the lead time before its start"
    ahead = _one(plans=[plan], limits=limits)
    assert ahead is not None
    assert ahead[0] == 8
    assert "capacity plan p1" in ahead[1]
    during = replace(H100, nodes=8, busy_nodes=1, idle_nodes=7, idle_since_s=NOW)
    assert _one(pools=[during], plans=[plan], limits=limits, now_s=NOW + 1000) is None, "held while it runs"
    after = _one(pools=[during], plans=[plan], limits=limits, now_s=NOW + 5000)
    assert after is not None
    assert after[0] == 1


def test_gpus_for_a_deadline() -> None:
    # 4 jobs of 8 GPUs x 10 h by a deadline 20 h away: 16 GPUs at once do it.
    assert gpus_for_deadline([(8, 36000.0)] * 4, now_s=0.0, deadline_s=72000.0) == 16
    assert gpus_for_deadline([(32, 60.0)], now_s=0.0, deadline_s=86400.0) == 32, "never fewer than a gang"
    with pytest.raises(ValueError):
        gpus_for_deadline([(8, 1.0)], now_s=10.0, deadline_s=5.0)
