"""Wait reasons carry the figures a user acts on: the largest free block per cluster and GPU type, the
limit and what is held against it, and the time that matters."""

from __future__ import annotations

import pytest

from placement.model import WaitCode, WaitReason
from placement.plan import plan
from tests.unit.placement_builders import SnapshotBuilder, a_cluster, a_gang, a_snapshot, a_tenant

NOW = 1000.0


def reasons_of(snapshot: SnapshotBuilder, job: str = "j1") -> tuple[WaitReason, ...]:
    result = plan(snapshot.build(), now=NOW)
    (waiting,) = [w for w in result.waiting if w.job_id == job]
    return waiting.reasons


FIGURES = [
    pytest.param(
        a_snapshot().clusters(a_cluster("c1").pool("A100", free=(4, 6, 0))).queue(a_gang("j1").gang(2)),
        (
            WaitCode.INSUFFICIENT_CAPACITY,
            "c1",
            "A100",
            {"free_gpus": 10, "largest_free_node_gpus": 6, "needed_gpus": 16},
        ),
        id="largest-free-block-on-one-node",
    ),
    pytest.param(
        a_snapshot().clusters(a_cluster("c1").pool("A100", nodes=2)).queue(a_gang("j1").gang(3)),
        (WaitCode.GANG_LARGER_THAN_CLUSTER, "c1", "A100", {"free_gpus": 16, "largest_free_node_gpus": 8}),
        id="whole-cluster-too-small",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", nodes=4))
        .tenants(a_tenant("t1").quota("A100", cap=8))
        .running("r1", gpus=4)
        .queue(a_gang("j1")),
        (
            WaitCode.TENANT_CAP_REACHED,
            None,
            "A100",
            {"tenant": "t1", "limit_gpus": 8, "held_gpus": 4, "needed_gpus": 8},
        ),
        id="cap-with-held-and-needed",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", nodes=4))
        .tenants(a_tenant("t1"), a_tenant("lender").quota("A100", guaranteed=32, lend=0))
        .queue(a_gang("j1")),
        (WaitCode.QUOTA_EXHAUSTED, None, "A100", {"tenant": "t1", "free_gpus": 32, "limit_gpus": 0}),
        id="borrowing-what-lenders-hold-back",
    ),
]


@pytest.mark.parametrize(("snapshot", "expected"), FIGURES)
def test_reasons_carry_the_figures(
    snapshot: SnapshotBuilder, expected: tuple[WaitCode, str | None, str | None, dict[str, object]]
) -> None:
    code, cluster, gpu_type, fields = expected
    (reason,) = reasons_of(snapshot)
    assert (reason.code, reason.cluster, reason.gpu_type) == (code, cluster, gpu_type)
    assert {name: getattr(reason, name) for name in fields} == fields


def test_reasons_are_listed_most_fundamental_first() -> None:
    snapshot = (
        a_snapshot()
        .clusters(a_cluster("a").pool("A100", free=(0,)), a_cluster("b").pool("H100").unreachable())
        .tenants(a_tenant("t1").quota("H100", borrow=0))
        .queue(a_gang("j1").gpus("H100", "A100", "B200"))
    )
    assert [r.code for r in reasons_of(snapshot)] == [
        WaitCode.NO_CLUSTER_HAS_GPU_TYPE,
        WaitCode.CLUSTER_UNREACHABLE,
        WaitCode.BORROWING_LIMIT,
        WaitCode.INSUFFICIENT_CAPACITY,
    ]


def test_a_gang_that_fits_but_waits_gets_no_capacity_reason_where_it_fits() -> None:
    snapshot = (
        a_snapshot()
        .clusters(a_cluster("slow").pool("A100"), a_cluster("full").pool("A100", free=(0,)))
        .queue(a_gang("j1").runtime(expected_s=7200).deadline(NOW + 3600))
    )
    assert [(r.code, r.cluster) for r in reasons_of(snapshot)] == [
        (WaitCode.INSUFFICIENT_CAPACITY, "full"),
        (WaitCode.DEADLINE_UNMEETABLE, "slow"),
    ]
