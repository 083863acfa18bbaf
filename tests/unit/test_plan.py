"""The first placement policy, case by case: who is admitted where, and why the others wait."""

from __future__ import annotations

import random

import pytest

from placement.model import CapacityKind, GpuTypePolicy, Plan, WaitCode
from placement.plan import plan
from tests.unit.placement_builders import SnapshotBuilder, a_cluster, a_gang, a_snapshot, a_tenant, shuffled

PRIVATE, ON_DEMAND, SPOT = CapacityKind.PRIVATE, CapacityKind.ON_DEMAND, CapacityKind.SPOT
POLICIES = (GpuTypePolicy.ORDERED, GpuTypePolicy.ANY)


def admitted(result: Plan) -> list[tuple[str, str, str, str]]:
    """Admissions in decision order as (job, cluster, GPU type, kind)."""
    return [(a.job_id, a.cluster, a.gpu_type, a.kind.value) for a in result.admissions]


def waiting(result: Plan) -> dict[str, list[tuple[WaitCode, str | None, str | None]]]:
    """Waiting jobs with their reasons as (code, cluster, GPU type)."""
    return {w.job_id: [(r.code, r.cluster, r.gpu_type) for r in w.reasons] for w in result.waiting}


ONE_A100_NODE = a_cluster("c1").pool("A100", nodes=1)

ADMISSION_CASES = [
    pytest.param(
        a_snapshot()
        .clusters(ONE_A100_NODE)
        .queue(a_gang("low").priority(0).queued_at(0), a_gang("high").priority(10).queued_at(5)),
        [("high", "c1", "A100", "private")],
        id="higher-priority-first-even-if-queued-later",
    ),
    pytest.param(
        a_snapshot().clusters(ONE_A100_NODE).queue(a_gang("late").queued_at(5), a_gang("early").queued_at(1)),
        [("early", "c1", "A100", "private")],
        id="fifo-within-a-priority",
    ),
    pytest.param(
        a_snapshot().clusters(ONE_A100_NODE).queue(a_gang("j2"), a_gang("j1")),
        [("j1", "c1", "A100", "private")],
        id="job-id-breaks-exact-ties",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", free=(8, 8, 0), gpus_per_node=8))
        .queue(a_gang("big").gang(3, gpus=8)),
        [],
        id="gang-is-all-or-nothing",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", free=(4, 4)))
        .queue(a_gang("whole").gang(1, gpus=8), a_gang("halves").gang(2, gpus=4).queued_at(1)),
        [("halves", "c1", "A100", "private")],
        id="a-replica-must-fit-on-one-node",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("dear").pool("A100", price=3.0), a_cluster("cheap").pool("A100", price=1.0))
        .queue(a_gang("j1")),
        [("j1", "cheap", "A100", "private")],
        id="cheapest-cluster",
    ),
    pytest.param(
        a_snapshot()
        .clusters(
            a_cluster("a-cloud").pool("A100", kind=ON_DEMAND, price=2.0),
            a_cluster("b-onprem").pool("A100", kind=PRIVATE, price=2.0),
        )
        .queue(a_gang("j1")),
        [("j1", "b-onprem", "A100", "private")],
        id="private-preferred-at-equal-price",
    ),
    pytest.param(
        a_snapshot()
        .clusters(
            a_cluster("a-spot").pool("A100", kind=SPOT, price=2.0),
            a_cluster("b-od").pool("A100", kind=ON_DEMAND, price=2.0),
        )
        .queue(a_gang("j1").allow_spot()),
        [("j1", "b-od", "A100", "on_demand")],
        id="on-demand-preferred-to-spot-at-equal-price",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", kind=SPOT, price=0.5).pool("A100", kind=PRIVATE, price=1.0))
        .queue(a_gang("spot-ok").allow_spot(), a_gang("no-spot").queued_at(1)),
        [("spot-ok", "c1", "A100", "spot"), ("no-spot", "c1", "A100", "private")],
        id="cheaper-spot-only-for-gangs-that-allow-it",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("H100", price=4.0).pool("A100", price=1.0))
        .queue(a_gang("j1").gpus("H100", "A100")),
        [("j1", "c1", "H100", "private")],
        id="ordered-types-take-the-first-type-that-fits",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("H100", free=(4,), price=4.0).pool("A100", price=1.0))
        .queue(a_gang("j1").gpus("H100", "A100")),
        [("j1", "c1", "A100", "private")],
        id="ordered-types-fall-back-when-the-first-does-not-fit",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("H100", price=4.0), a_cluster("c2").pool("A100", price=1.0))
        .queue(a_gang("j1").any_of("H100", "A100")),
        [("j1", "c2", "A100", "private")],
        id="any-type-takes-the-cheapest",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", nodes=4))
        .tenants(a_tenant("t1").cap("A100", 16))
        .running("r1", gpus=8)
        .queue(a_gang("fits-cap").gang(1), a_gang("over-cap").gang(1).queued_at(1)),
        [("fits-cap", "c1", "A100", "private")],
        id="tenant-cap-counts-running-and-admitted-gangs",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", nodes=2, price=1.0).pool("H100", nodes=2, price=4.0))
        .tenants(a_tenant("t1").cap("A100", 8))
        .running("r1", gpus=8)
        .queue(a_gang("j1").gpus("A100", "H100")),
        [("j1", "c1", "H100", "private")],
        id="ordered-types-skip-a-capped-type",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("t2-only").pool("A100"))
        .tenants(a_tenant("t1").cap("A100", 0), a_tenant("t2"))
        .queue(a_gang("t1-job").tenant("t1"), a_gang("t2-job").tenant("t2").queued_at(1)),
        [("t2-job", "t2-only", "A100", "private")],
        id="caps-are-per-tenant",
    ),
    pytest.param(
        a_snapshot()
        .clusters(
            a_cluster("cheap").pool("A100", price=1.0).unreachable(),
            a_cluster("dear").pool("A100", price=3.0),
        )
        .queue(a_gang("j1")),
        [("j1", "dear", "A100", "private")],
        id="unreachable-cluster-skipped",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", nodes=2))
        .queue(
            a_gang("too-big").gang(3).priority(9),
            a_gang("small").gang(1),
            a_gang("next").gang(1).queued_at(1),
        ),
        [("small", "c1", "A100", "private"), ("next", "c1", "A100", "private")],
        id="greedy-a-gang-that-does-not-fit-does-not-block-later-ones",
    ),
    pytest.param(
        a_snapshot()
        .clusters(
            a_cluster("a-whole").pool("A100", free=(8,)), a_cluster("b-partly").pool("A100", free=(4, 8))
        )
        .queue(a_gang("j1").gang(1, gpus=4)),
        [("j1", "b-partly", "A100", "private")],
        id="at-equal-price-pack-onto-a-partly-used-node",
    ),
    pytest.param(
        a_snapshot()
        .clusters(
            a_cluster("cheap").pool("A100", free=(8,), price=1.0),
            a_cluster("dear").pool("A100", free=(4,), price=2.0),
        )
        .queue(a_gang("j1").gang(1, gpus=4)),
        [("j1", "cheap", "A100", "private")],
        id="price-beats-packing",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("a-frag").pool("A100", free=(4, 4)), a_cluster("b-whole").pool("A100", free=(8,)))
        .queue(a_gang("j1").gang(2, gpus=4)),
        [("j1", "b-whole", "A100", "private")],
        id="at-equal-packing-touch-fewer-nodes",
    ),
    pytest.param(
        a_snapshot().clusters(a_cluster("b").pool("A100"), a_cluster("a").pool("A100")).queue(a_gang("j1")),
        [("j1", "a", "A100", "private")],
        id="cluster-name-breaks-the-last-tie",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", nodes=1, name="p1").pool("A100", nodes=1, name="p2"))
        .queue(a_gang("j1").gang(2)),
        [("j1", "c1", "A100", "private")],
        id="pools-of-the-same-type-kind-and-price-combine",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", free=(8, 1)))
        .queue(a_gang("j1").replicas(1, 8), a_gang("j2").gang(1, gpus=1).queued_at(1)),
        [("j1", "c1", "A100", "private")],
        id="mixed-replica-sizes",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", free=(0,)))
        .queue(a_gang("cpu-only").replicas(0, 0)),
        [("cpu-only", "c1", "A100", "private")],
        id="zero-gpu-replicas-always-fit",
    ),
]


@pytest.mark.parametrize(("snapshot", "expected"), ADMISSION_CASES)
def test_admissions(snapshot: SnapshotBuilder, expected: list[tuple[str, str, str, str]]) -> None:
    built = snapshot.build()
    result = plan(built, now=100.0)
    assert admitted(result) == expected
    assert {w.job_id for w in result.waiting} == {g.job_id for g in built.queued} - {e[0] for e in expected}
    assert all(w.reasons for w in result.waiting)


WAIT_CASES = [
    pytest.param(
        a_snapshot().clusters(ONE_A100_NODE).tenants(a_tenant("known")).queue(a_gang("j1").tenant("ghost")),
        [(WaitCode.UNKNOWN_TENANT, None, None)],
        "tenant ghost is not known to the federation",
        id="unknown-tenant",
    ),
    pytest.param(
        a_snapshot().clusters(ONE_A100_NODE).queue(a_gang("j1").gpus("B200")),
        [(WaitCode.NO_CLUSTER_HAS_GPU_TYPE, None, "B200")],
        "no cluster has GPUs of type B200",
        id="no-cluster-has-the-type",
    ),
    pytest.param(
        a_snapshot().clusters(ONE_A100_NODE).queue(a_gang("j1").any_of("B200", "GB200")),
        [(WaitCode.NO_CLUSTER_HAS_GPU_TYPE, None, None)],
        "no cluster has GPUs of type B200, GB200",
        id="no-cluster-has-any-of-the-types",
    ),
    pytest.param(
        a_snapshot().clusters(a_cluster("c1").pool("A100", kind=SPOT)).queue(a_gang("j1")),
        [(WaitCode.SPOT_NOT_ALLOWED, "c1", "A100")],
        "cluster c1 has GPUs of A100 only as spot capacity; the job does not allow spot",
        id="spot-not-allowed",
    ),
    pytest.param(
        a_snapshot().clusters(a_cluster("c1").pool("A100").unreachable()).queue(a_gang("j1")),
        [(WaitCode.CLUSTER_UNREACHABLE, "c1", "A100")],
        "cluster c1 has GPUs of A100 but is unreachable",
        id="cluster-unreachable",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", nodes=4))
        .tenants(a_tenant("t1").cap("A100", 16))
        .running("r1", gpus=8)
        .queue(a_gang("j1").gang(2)),
        [(WaitCode.TENANT_CAP_REACHED, None, "A100")],
        "tenant t1 may hold 16 GPUs of A100, holds 8, job needs 16",
        id="tenant-cap-reached",
    ),
    pytest.param(
        a_snapshot().clusters(a_cluster("c1").pool("A100", nodes=4)).queue(a_gang("j1").gang(1, gpus=16)),
        [(WaitCode.GANG_LARGER_THAN_CLUSTER, "c1", "A100")],
        "needs 1 x 16 GPUs of A100; cluster c1 has only 32 GPUs of A100 on 4 nodes, at most 8 on one node",
        id="replica-larger-than-a-node",
    ),
    pytest.param(
        a_snapshot().clusters(a_cluster("c1").pool("A100", nodes=2)).queue(a_gang("j1").gang(3)),
        [(WaitCode.GANG_LARGER_THAN_CLUSTER, "c1", "A100")],
        "needs 3 x 8 GPUs of A100; cluster c1 has only 16 GPUs of A100 on 2 nodes, at most 8 on one node",
        id="gang-larger-than-all-nodes",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", nodes=1, price=1.0).pool("A100", nodes=1, price=2.0))
        .queue(a_gang("j1").gang(2)),
        [(WaitCode.GANG_LARGER_THAN_CLUSTER, "c1", "A100")],
        "needs 2 x 8 GPUs of A100; cluster c1 has only 8 GPUs of A100 on 1 nodes, at most 8 on one node"
        " (pools of different kind or price cannot be combined; largest shown)",
        id="pools-of-different-price-do-not-combine",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("onprem").pool("A100", free=(4, 4, 4, 0, 0)))
        .queue(a_gang("j1").gang(4)),
        [(WaitCode.INSUFFICIENT_CAPACITY, "onprem", "A100")],
        "needs 4 x 8 GPUs of A100; cluster onprem has 12 free, at most 4 on one node",
        id="insufficient-capacity",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", free=(4, 4)))
        .queue(a_gang("j1").replicas(8, 2, 2, 0)),
        [(WaitCode.INSUFFICIENT_CAPACITY, "c1", "A100")],
        "needs 1 x 8 + 2 x 2 GPUs of A100; cluster c1 has 8 free, at most 4 on one node",
        id="insufficient-capacity-for-mixed-replicas",
    ),
]


@pytest.mark.parametrize(("snapshot", "reasons", "first_message"), WAIT_CASES)
def test_wait_reasons(
    snapshot: SnapshotBuilder, reasons: list[tuple[WaitCode, str | None, str | None]], first_message: str
) -> None:
    result = plan(snapshot.build(), now=0.0)
    assert result.admissions == ()
    assert waiting(result) == {"j1": reasons}
    assert result.waiting[0].reasons[0].message == first_message


def test_every_blocker_is_listed_in_code_then_type_then_cluster_order() -> None:
    snapshot = (
        a_snapshot()
        .clusters(
            a_cluster("z-full").pool("A100", free=(0, 0)).pool("H100", nodes=1),
            a_cluster("y-down").pool("A100").pool("H100").unreachable(),
            a_cluster("x-spot").pool("A100", kind=SPOT),
            a_cluster("w-small").pool("A100", nodes=1),
        )
        .tenants(a_tenant("t1").cap("H100", 8))
        .queue(a_gang("j1").gang(2).gpus("H100", "A100", "B200"))
        .build()
    )
    assert waiting(plan(snapshot, now=0.0)) == {
        "j1": [
            (WaitCode.NO_CLUSTER_HAS_GPU_TYPE, None, "B200"),
            (WaitCode.SPOT_NOT_ALLOWED, "x-spot", "A100"),
            (WaitCode.CLUSTER_UNREACHABLE, "y-down", "H100"),
            (WaitCode.CLUSTER_UNREACHABLE, "y-down", "A100"),
            (WaitCode.TENANT_CAP_REACHED, None, "H100"),
            (WaitCode.GANG_LARGER_THAN_CLUSTER, "w-small", "A100"),
            (WaitCode.INSUFFICIENT_CAPACITY, "z-full", "A100"),
        ]
    }


def test_capacity_taken_by_an_earlier_gang_shows_in_a_later_gangs_reason() -> None:
    snapshot = (
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", nodes=2))
        .queue(a_gang("first").gang(1, gpus=6), a_gang("second").gang(2).queued_at(1))
        .build()
    )
    result = plan(snapshot, now=0.0)
    assert admitted(result) == [("first", "c1", "A100", "private")]
    (reason,) = result.waiting[0].reasons
    assert reason.message == "needs 2 x 8 GPUs of A100; cluster c1 has 10 free, at most 8 on one node"


def test_waiting_is_in_queue_order_and_admissions_in_decision_order() -> None:
    snapshot = (
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", nodes=2))
        .queue(
            a_gang("w-late").gang(4).queued_at(9),
            a_gang("a-second").queued_at(2),
            a_gang("w-early").gang(4).queued_at(1),
            a_gang("a-first").priority(1).queued_at(5),
        )
        .build()
    )
    result = plan(snapshot, now=0.0)
    assert [a.job_id for a in result.admissions] == ["a-first", "a-second"]
    assert [w.job_id for w in result.waiting] == ["w-early", "w-late"]


def test_admission_carries_the_price() -> None:
    snapshot = (
        a_snapshot().clusters(a_cluster("c1").pool("A100", kind=ON_DEMAND, price=2.5)).queue(a_gang("j1"))
    )
    (admission,) = plan(snapshot.build(), now=0.0).admissions
    assert (admission.kind, admission.usd_per_gpu_hour) == (ON_DEMAND, 2.5)


def test_duplicate_caps_take_the_lowest_whatever_their_order() -> None:
    quotas = (a_tenant("t1").cap("A100", 16).cap("A100", 8).build(), a_tenant("t1").cap("A100", 24).build())
    builder = a_snapshot().clusters(a_cluster("c1").pool("A100", nodes=4)).queue(a_gang("j1").gang(2))
    for order in (quotas, quotas[::-1]):
        result = plan(builder.tenants(*order).build(), now=0.0)
        assert waiting(result) == {"j1": [(WaitCode.TENANT_CAP_REACHED, None, "A100")]}


@pytest.mark.parametrize("seed", range(5))
def test_same_plan_whatever_the_order_of_the_snapshot_tuples(seed: int) -> None:
    clusters = [
        a_cluster(f"c{i}")
        .pool("A100", free=(8, 4, 2, 0, 8), price=1.0 + i % 2)
        .pool("H100", free=(8, 8, 6), price=3.0, kind=ON_DEMAND)
        .pool("A100", free=(8, 8), price=1.0 + i % 2, kind=SPOT)
        for i in range(4)
    ]
    gangs = [
        a_gang(f"j{i:02}")
        .tenant(f"t{i % 3}")
        .replicas(*[(i * 7 + k) % 9 for k in range(1 + i % 3)])
        .gpus(*(["A100", "H100"] if i % 2 else ["H100", "A100"]), policy=POLICIES[i % 2])
        .priority(i % 3)
        .queued_at(float(i % 5))
        .allow_spot(i % 3 == 0)
        for i in range(40)
    ]
    snapshot = (
        a_snapshot()
        .clusters(*clusters)
        .queue(*gangs)
        .tenants(
            a_tenant("t0").cap("A100", 40).cap("H100", 16), a_tenant("t1").cap("H100", 24), a_tenant("t2")
        )
        .running("r1", tenant="t0", gpus=8)
        .running("r2", tenant="t1", gpu="H100", gpus=8)
        .build()
    )
    expected = plan(snapshot, now=0.0)
    assert expected.admissions
    assert expected.waiting
    assert plan(shuffled(snapshot, random.Random(seed)), now=0.0) == expected


def test_reasons_of_gangs_of_one_shape_follow_admissions_between_them() -> None:
    snapshot = (
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", free=(8, 4)))
        .queue(
            a_gang("w1").gang(2).priority(3), a_gang("a").gang(1, gpus=4).priority(2), a_gang("w2").gang(2)
        )
        .build()
    )
    result = plan(snapshot, now=0.0)
    assert admitted(result) == [("a", "c1", "A100", "private")]
    assert [w.reasons[0].message for w in result.waiting] == [
        "needs 2 x 8 GPUs of A100; cluster c1 has 12 free, at most 8 on one node",
        "needs 2 x 8 GPUs of A100; cluster c1 has 8 free, at most 8 on one node",
    ]
