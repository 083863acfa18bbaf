"""`federation.capacity.admit`: a plan checked against each limit alone, at every moment its window
can get tighter, and what the pools' ready nodes hold for plans made in order (issue 30, item 1)."""

from __future__ import annotations

from federation.capacity.admit import admit, held_by_plan
from iac.decide import Limits
from iac.plans import DeadlineJob, DeadlinePlan, FixedPlan, required_capacity
from iac.pool_state import PoolState
from placement.model import CapacityKind, ClusterName, GpuType, JobId, Provider

NOW = 1_000_000.0
HOUR = 3600.0
AWS = ClusterName("aws")


def pool(nodes: int = 2, *, max_nodes: int = 16, usd: float = 6.88, name: str = "h100-od") -> PoolState:
    return PoolState(
        cluster=AWS,
        pool=name,
        provider=Provider.AWS,
        gpu_type=GpuType("H100"),
        kind=CapacityKind.ON_DEMAND,
        gpus_per_node=8,
        usd_per_gpu_hour=usd,
        nodes=nodes,
        busy_nodes=0,
        max_nodes=max_nodes,
        min_nodes=nodes,
    )


def fixed(plan_id: str, gpus: int, start_s: float = NOW, end_s: float = NOW + 4 * HOUR) -> FixedPlan:
    return FixedPlan(plan_id, AWS, GpuType("H100"), gpus, start_s, end_s)


NO_LIMITS = Limits(lead_time_s=60)


def test_a_plan_that_fits_is_admitted_whole() -> None:
    got = admit(fixed("p", 64), [], [pool()], NO_LIMITS, now_s=NOW)
    assert (got.whole, got.granted_gpus, got.shortfall_gpus) == (True, 64, 0)


def test_the_pools_maximum_alone_holds_a_plan_back() -> None:
    got = admit(fixed("p", 4096), [], [pool(max_nodes=16)], NO_LIMITS, now_s=NOW)
    assert (got.granted_gpus, got.shortfall_gpus) == (128, 3968)
    assert len(got.held_back_by) == 1
    assert got.held_back_by[0].startswith("the pools' maximum")


def test_the_cloud_limit_alone_holds_a_plan_back() -> None:
    limits = Limits(max_gpus_by_provider={Provider.AWS: 64}, lead_time_s=60)
    got = admit(fixed("p", 128), [], [pool()], limits, now_s=NOW)
    # 16 GPUs are there already: 48 more fit under the limit of 64, so the plan may hold 64.
    assert got.granted_gpus == 64
    assert got.held_back_by == ("the aws limit of 64 GPUs (16 held or planned without it)",)


def test_the_spend_ceiling_alone_holds_a_plan_back() -> None:
    limits = Limits(max_usd_per_hour=500.0, lead_time_s=60)
    got = admit(fixed("p", 128), [], [pool()], limits, now_s=NOW)
    # $55.04 a node: nine nodes ($495.36/h) fit under $500/h, ten do not.
    assert got.granted_gpus == 72
    assert len(got.held_back_by) == 1
    assert got.held_back_by[0].startswith("the spend ceiling of $500.00/h ($110.08/h without it")


def test_a_plan_is_checked_when_another_starts_within_its_window() -> None:
    """Now the pool has room for it; in two hours another plan starts, and both do not fit."""
    later = fixed("later", 64, start_s=NOW + 2 * HOUR, end_s=NOW + 3 * HOUR)
    got = admit(fixed("now", 64), [later], [pool(max_nodes=10)], NO_LIMITS, now_s=NOW)
    assert (got.granted_gpus, got.shortfall_gpus) == (16, 48)
    # One that ends before the other starts fits whole.
    short = fixed("short", 64, end_s=NOW + HOUR)
    assert admit(short, [later], [pool(max_nodes=10)], NO_LIMITS, now_s=NOW).whole


def test_a_deadline_plan_is_all_or_nothing() -> None:
    jobs = (DeadlineJob(JobId("j"), 256, HOUR),)
    plan = DeadlinePlan("d", AWS, GpuType("H100"), jobs, NOW + 10 * HOUR)
    got = admit(plan, [], [pool(max_nodes=16)], NO_LIMITS, now_s=NOW)
    assert (got.granted_gpus, got.whole) == (0, False)
    assert got.requested_gpus == 256


def test_the_older_plan_holds_the_ready_nodes_first() -> None:
    """Ten nodes asked by two plans, six ready: the older plan has its four, the newer the rest."""
    pools = [pool(nodes=10)]
    needs = required_capacity(
        [fixed("zz-older", 32), fixed("aa-newer", 48)], pools, now_s=NOW, lead_time_s=60
    )
    held = held_by_plan(needs.needs, pools, {pools[0].key: 6})
    assert (held["zz-older"].gpus, held["aa-newer"].gpus) == (32, 16)
    assert held["zz-older"].usd_per_hour == 4 * 8 * 6.88
