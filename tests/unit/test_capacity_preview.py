"""A plan's preview (pool changes and cost) and state, as pure functions of the pools and plans."""

from __future__ import annotations

from dataclasses import replace

import pytest

from federation.capacity.pools import PoolKey, ScalablePoolEntry, scalable_pools
from federation.capacity.preview import plan_state, pool_states, preview
from federation.capacity.records import CapacitySettings, PlanKind, PlanRecord, ProvisionerKind
from federation.store.records import ClusterRecord, PoolConfig
from iac.plans import FixedPlan
from placement.model import CapacityKind, ClusterName, GpuType, Provider

NOW = 1_000_000.0
LEAD = 600.0
CLUSTER = ClusterName("aws-1")
H100 = GpuType("H100")


def _pools() -> dict[PoolKey, ScalablePoolEntry]:
    record = ClusterRecord(
        CLUSTER,
        Provider.AWS,
        "us-east-1",
        (
            PoolConfig("h100-od", H100, CapacityKind.ON_DEMAND, 6.88, 8, 2),
            PoolConfig("h100-spot", H100, CapacityKind.SPOT, 1.28, 8, 2),
        ),
        scalable=True,
    )
    return scalable_pools(
        [record], CapacitySettings(provisioner=ProvisionerKind.SIMULATED, max_nodes_per_pool=8)
    )


def fixed(plan_id: str, gpus: int, start: float, end: float) -> tuple[FixedPlan, PlanRecord]:
    record = PlanRecord(
        plan_id, PlanKind.FIXED, CLUSTER, H100, "infra", NOW, gpus=gpus, start_s=start, end_s=end
    )
    return FixedPlan(plan_id, CLUSTER, H100, gpus, start, end), record


def test_a_future_plan_grows_on_demand_first_and_costs_its_window() -> None:
    states = pool_states(_pools(), {}, {})
    value, record = fixed("p", 64, NOW + 3600, NOW + 7200)
    got = preview(value, record, [], states, now_s=NOW, lead_time_s=LEAD)
    assert [(c.key, c.nodes_from, c.nodes_to) for c in got.changes] == [((CLUSTER, "h100-od"), 2, 8)]
    assert got.usd_per_hour == pytest.approx(64 * 6.88)
    assert got.total_usd == pytest.approx(64 * 6.88 * (3600 + LEAD) / 3600)
    assert got.provision_at_s == NOW + 3600 - LEAD
    assert (got.shortfall_gpus, got.meetable) == (0, True)


def test_what_other_plans_hold_then_is_not_counted_twice() -> None:
    states = pool_states(_pools(), {}, {})
    other, _ = fixed("a", 32, NOW + 3000, NOW + 9000)
    value, record = fixed("b", 32, NOW + 3600, NOW + 7200)
    got = preview(value, record, [other], states, now_s=NOW, lead_time_s=LEAD)
    assert [(c.nodes_from, c.nodes_to) for c in got.changes] == [(4, 8)]


def test_more_than_the_pools_hold_is_a_shortfall() -> None:
    states = pool_states(_pools(), {}, {})
    value, record = fixed("p", 100, NOW, NOW + 60)
    got = preview(value, record, [], states, now_s=NOW, lead_time_s=LEAD)
    # On demand first (8 nodes), then spot (the rest): 100 GPUs fit in 128, no shortfall.
    assert [(c.key[1], c.nodes_to) for c in got.changes] == [("h100-od", 8), ("h100-spot", 5)]
    value, record = fixed("q", 200, NOW, NOW + 60)
    assert preview(value, record, [], states, now_s=NOW, lead_time_s=LEAD).shortfall_gpus == 72


@pytest.mark.parametrize(
    ("now", "cancelled", "state"),
    [
        pytest.param(NOW, False, "scheduled", id="scheduled"),
        pytest.param(NOW + 3600 - LEAD, False, "provisioning", id="within-the-lead-time"),
        pytest.param(NOW + 3600, False, "active", id="active"),
        pytest.param(NOW + 7200, False, "ended", id="ended"),
        pytest.param(NOW, True, "cancelled", id="cancelled"),
    ],
)
def test_a_plans_state(now: float, cancelled: bool, state: str) -> None:
    _, record = fixed("p", 8, NOW + 3600, NOW + 7200)
    if cancelled:
        record = replace(record, cancelled_at_s=NOW)
    assert plan_state(record, now, LEAD) == state
