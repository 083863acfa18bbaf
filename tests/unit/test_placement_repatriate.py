"""Repatriation: a running cloud gang moves to idle private GPUs only when the rule says so.

Every case: a private cluster `onprem` (pool `p` of V100 nodes at $0.60) and a cloud `aws` (V100 at
$3.00). Gang `c` (8 GPUs, V100) runs in the cloud since an hour ago; by its run-time limit it has 10
hours left. A move costs 15 minutes of overhead. So, if it moves: the cloud would still charge
8 x 10 h x $3 = $240, the rest on private GPUs costs 8 x 10.25 h x $0.60 = $49.20, and the move
itself 8 x 0.25 h x $3 = $6: it saves $184.80.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from placement.cost import CostModel
from placement.explain import moved
from placement.inventory import Inventory
from placement.model import (
    CapacityKind,
    ClusterName,
    GpuType,
    JobId,
    Plan,
    PolicyConfig,
    RunningGang,
    Snapshot,
    TenantId,
)
from placement.plan import plan
from placement.quota import QuotaBook
from placement.repatriate import choose_moves
from tests.unit.placement_builders import SnapshotBuilder, a_cluster, a_gang, a_snapshot, a_tenant

HOUR = 3600.0
NOW = 100 * HOUR
OVERHEAD_S = 900.0


def cloud_gang(job_id: str = "c", **fields: Any) -> RunningGang:
    gang = RunningGang(
        job_id=JobId(job_id),
        tenant=TenantId("t1"),
        priority=0,
        cluster=ClusterName("aws"),
        gpu_type=GpuType("V100"),
        gpu_count=8,
        ends_at_s=NOW + 10 * HOUR,
        kind=CapacityKind.ON_DEMAND,
        usd_per_gpu_hour=3.0,
        replica_gpus=(8,),
        gpu_types=(GpuType("V100"),),
        started_at_s=NOW - HOUR,
        movable=True,
    )
    return replace(gang, **fields)


def world(free: tuple[int, ...] = (8,), **policy: object) -> SnapshotBuilder:
    return (
        a_snapshot()
        .clusters(
            a_cluster("onprem").pool("V100", free=free, price=0.6, name="p"),
            a_cluster("aws").provider_cloud().pool("V100", kind=CapacityKind.ON_DEMAND, nodes=4, price=3.0),
        )
        .tenants(a_tenant("t1"))
        .policy(**{"repatriate": True, "move_overhead_s": OVERHEAD_S, **policy})
    )


def with_running(snapshot: Snapshot, *gangs: RunningGang) -> Snapshot:
    return replace(snapshot, running=(*snapshot.running, *gangs))


def decide(builder: SnapshotBuilder, *gangs: RunningGang) -> Plan:
    return plan(with_running(builder.build(), *gangs), now=NOW)


def test_an_idle_private_node_takes_the_cloud_gang_and_says_what_it_saves() -> None:
    (move,) = decide(world(), cloud_gang()).moves
    assert (move.job_id, move.to_cluster, move.to_gpu_type, move.to_kind) == (
        "c",
        "onprem",
        "V100",
        CapacityKind.PRIVATE,
    )
    assert move.remaining_cloud_s == pytest.approx(10 * HOUR)
    assert move.cloud_cost_left_usd == pytest.approx(240.0)
    assert move.private_cost_usd == pytest.approx(49.2)
    assert move.move_cost_usd == pytest.approx(6.0)
    assert move.saving_usd == pytest.approx(184.8)
    # The limit left plus the overhead: what backfill counts on after the move.
    assert move.max_runtime_s == pytest.approx(10 * HOUR + OVERHEAD_S)


def test_off_by_default() -> None:
    builder = world().policy(repatriate=False)
    assert decide(builder, cloud_gang()).moves == ()


def test_a_queued_gang_takes_the_room_first() -> None:
    builder = world().queue(a_gang("j").gang(1, gpus=8, gpu="V100").runtime(limit_s=3600).queued_at(NOW))
    result = decide(builder, cloud_gang())
    assert [(a.job_id, a.cluster) for a in result.admissions] == [("j", "onprem")]
    assert result.moves == ()


def test_a_gang_that_does_not_fit_is_not_moved_and_no_one_is_evicted() -> None:
    # Node 0 has 4 GPUs free; the other 4 run a private gang that could be evicted, but a move never evicts.
    builder = world((4,)).running("r", cluster="onprem", gpu="V100", nodes=[("p", 0, 4)], ends_at=NOW + HOUR)
    result = decide(builder, cloud_gang())
    assert (result.moves, result.preemptions) == ((), ())


@pytest.mark.parametrize(
    ("gang", "policy"),
    [
        pytest.param(cloud_gang(), {"repatriate_min_saving_usd": 185.0}, id="saving-under-the-margin"),
        pytest.param(cloud_gang(ends_at_s=NOW + 600), {}, id="less-left-than-the-overhead"),
        pytest.param(cloud_gang(movable=False), {}, id="cannot-checkpoint"),
        pytest.param(cloud_gang(started_at_s=NOW + 60), {}, id="still-in-the-lead-time"),
        pytest.param(cloud_gang(terminating=True), {}, id="being-evicted"),
        pytest.param(
            cloud_gang(kind=CapacityKind.PRIVATE, cluster=ClusterName("onprem")), {}, id="already-private"
        ),
        pytest.param(cloud_gang(usd_per_gpu_hour=0.5), {}, id="cloud-cheaper-than-the-move"),
    ],
)
def test_no_move(gang: RunningGang, policy: dict[str, object]) -> None:
    assert decide(world().policy(**policy), gang).moves == ()


def test_a_margin_just_under_the_saving_still_moves() -> None:
    assert len(decide(world(repatriate_min_saving_usd=184.0), cloud_gang()).moves) == 1


def test_a_move_may_not_delay_a_reserved_start() -> None:
    """Node 0 is free, node 1 runs `r` for one more hour. `big` (16 GPUs) finds no cloud room and is
    reserved both private nodes from NOW + 1 h. A gang whose rest runs past that may not move in;
    one that ends before it may."""
    snapshot = (
        a_snapshot()
        .clusters(
            a_cluster("onprem").pool("V100", free=(8, 0), price=0.6, name="p"),
            # The cloud's one node is taken (by `c`), so `big` can only wait for the private nodes.
            a_cluster("aws").provider_cloud().pool("V100", kind=CapacityKind.ON_DEMAND, free=(0,), price=3.0),
        )
        .tenants(a_tenant("t1"))
        .policy(repatriate=True, move_overhead_s=OVERHEAD_S)
        .running("r", cluster="onprem", gpu="V100", nodes=[("p", 1, 8)], ends_at=NOW + HOUR)
        .queue(a_gang("big").gang(2, gpus=8, gpu="V100").runtime(limit_s=int(HOUR)).queued_at(NOW))
        .build()
    )
    long_rest = plan(with_running(snapshot, cloud_gang()), now=NOW)
    assert [r.job_id for r in long_rest.reservations] == ["big"]
    assert long_rest.moves == ()
    # 40 minutes left + 15 of overhead end before the reserved start: the move fits in front of it.
    short_rest = plan(with_running(snapshot, cloud_gang(ends_at_s=NOW + 40 * 60)), now=NOW)
    assert [m.job_id for m in short_rest.moves] == ["c"]


def test_another_type_only_within_the_tenants_cap_and_at_its_speed() -> None:
    """`a` runs on cloud A100s (speed 1.6) and accepts V100s too; private has only V100s."""
    a100 = cloud_gang(
        "a", gpu_type=GpuType("A100"), gpu_types=(GpuType("A100"), GpuType("V100")), usd_per_gpu_hour=4.0
    )
    capped = world().speeds(A100=1.6).tenants(a_tenant("t1").cap("V100", 0))
    assert decide(capped, a100).moves == ()
    (move,) = decide(world().speeds(A100=1.6), a100).moves
    # 10 h left on an A100 is 16 h of work on a V100, plus the overhead.
    assert move.private_run_s == pytest.approx(16 * HOUR + OVERHEAD_S)
    assert move.saving_usd == pytest.approx(8 * 10 * 4.0 - 8 * 16.25 * 0.6 - 8 * 0.25 * 4.0)


def test_the_dearest_rest_moves_first_into_the_one_free_node() -> None:
    cheap = cloud_gang("cheap", ends_at_s=NOW + 5 * HOUR)
    dear = cloud_gang("dear", ends_at_s=NOW + 20 * HOUR)
    assert [m.job_id for m in decide(world(), cheap, dear).moves] == ["dear"]
    assert [m.job_id for m in decide(world((8, 8)), cheap, dear).moves] == ["dear", "cheap"]


def test_a_gang_of_an_unknown_tenant_stays() -> None:
    assert decide(world(), cloud_gang(tenant=TenantId("stranger"))).moves == ()


def test_the_expected_runtime_rule_counts_from_the_start() -> None:
    # Known work of 3 h at speed 1, started an hour ago: 2 h left, whatever the limit says.
    (move,) = decide(world(), cloud_gang(expected_runtime_s=3 * HOUR)).moves
    assert move.remaining_cloud_s == pytest.approx(2 * HOUR)


def test_explain_says_when_why_and_what_it_saved() -> None:
    (move,) = decide(world(), cloud_gang()).moves
    text = moved(move, NOW)
    assert text.startswith(f"moved to private at {NOW:g}: from cluster aws (V100, 3 USD/GPU-h)")
    assert "to cluster onprem (V100, 0.6 USD/GPU-h)" in text
    assert "no queued job could use them" in text
    assert text.endswith("it saves 184.80 USD")


def test_choose_moves_is_empty_without_the_knob() -> None:
    snapshot = with_running(world().build(), cloud_gang())
    policy = PolicyConfig()
    inventory = Inventory(snapshot.clusters, policy)
    book = QuotaBook(snapshot.tenants, snapshot.running)
    assert choose_moves(snapshot.running, inventory, book, CostModel({}, (), policy), {}, NOW) == []
