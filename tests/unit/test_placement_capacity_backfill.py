"""Capacity requests (grow a scalable pool for a whole gang) and backfill around a reserved start."""

from __future__ import annotations

import pytest

from placement.capacity import nodes_needed
from placement.model import CapacityKind, Plan
from placement.plan import plan
from tests.unit.placement_builders import SnapshotBuilder, a_cluster, a_gang, a_snapshot, a_tenant

NOW = 1000.0
POOL = "a100-private-0"


def requests(result: Plan) -> list[tuple[str, str, int, tuple[str, ...]]]:
    return [(r.cluster, r.pool, r.nodes, r.job_ids) for r in result.capacity_requests]


def outcome(result: Plan) -> dict[str, str]:
    out: dict[str, str] = {a.job_id: "admitted" for a in result.admissions}
    out.update({w.job_id: w.reasons[-1].code.value for w in result.waiting})
    return out


@pytest.mark.parametrize(
    ("shape", "gpus_per_node", "expected"),
    [
        pytest.param((8, 8, 8), 8, 3, id="one-node-per-full-replica"),
        pytest.param((4, 4, 4), 8, 2, id="replicas-share-nodes"),
        pytest.param((8, 4, 4), 8, 2, id="mixed-replicas"),
        pytest.param((16,), 8, None, id="replica-larger-than-a-node"),
        pytest.param((), 8, 0, id="no-gpus"),
    ],
)
def test_nodes_needed(shape: tuple[int, ...], gpus_per_node: int, expected: int | None) -> None:
    assert nodes_needed(shape, gpus_per_node) == expected


CAPACITY_CASES = [
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("onprem").pool("A100", nodes=1), a_cluster("cloud").scalable("A100", max_nodes=4))
        .queue(a_gang("big").gang(3)),
        [("cloud", "a100-grow-0", 3, ("big",))],
        id="a-gang-that-fits-nowhere-asks-for-nodes-for-all-of-it",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("cloud").scalable("A100", max_nodes=4, nodes=1, requested=1))
        .queue(a_gang("big").gang(3)),
        [],
        id="growth-limit-counts-nodes-held-and-already-requested",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("cloud").scalable("A100", max_nodes=3))
        .queue(a_gang("first").gang(2), a_gang("second").gang(2).queued_at(1)),
        [("cloud", "a100-grow-0", 2, ("first",))],
        id="one-cycle-does-not-ask-a-pool-for-more-than-it-may-grow",
    ),
    pytest.param(
        a_snapshot()
        .clusters(
            a_cluster("dear").scalable("A100", max_nodes=4, price=4.0),
            a_cluster("cheap").scalable("A100", max_nodes=4, price=3.0),
        )
        .queue(a_gang("j")),
        [("cheap", "a100-grow-0", 1, ("j",))],
        id="cheapest-pool",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("cloud").scalable("A100", max_nodes=4, kind=CapacityKind.SPOT, price=1.0))
        .queue(a_gang("no-spot"), a_gang("spot-ok").allow_spot().queued_at(1)),
        [("cloud", "a100-grow-0", 1, ("spot-ok",))],
        id="spot-pools-only-for-gangs-that-allow-spot",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("cloud").scalable("A100", max_nodes=4))
        .tenants(a_tenant("t1").cap("A100", 8))
        .queue(a_gang("capped").gang(2)),
        [],
        id="a-gang-blocked-by-quota-asks-for-nothing",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("onprem").pool("A100", nodes=2), a_cluster("cloud").scalable("A100", max_nodes=4))
        .queue(a_gang("fits").gang(2)),
        [],
        id="a-gang-that-fits-now-asks-for-nothing",
    ),
]


@pytest.mark.parametrize(("snapshot", "expected"), CAPACITY_CASES)
def test_capacity_requests(
    snapshot: SnapshotBuilder, expected: list[tuple[str, str, int, tuple[str, ...]]]
) -> None:
    result = plan(snapshot.build(), now=NOW)
    assert requests(result) == expected
    for request in result.capacity_requests:
        (waiting,) = [w for w in result.waiting if w.job_id in request.job_ids]
        assert waiting.reasons[-1].code.value == "capacity_requested"


def blocked_big_gang(free: tuple[int, ...], big: int = 3) -> SnapshotBuilder:
    """A 3 x 8 gang (priority 10, as high as the running ones: no preemption) that fits only once r1 (node 1, ends at +100) and r2 (node 2, ends at +200) end."""
    return (
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", free=free))
        .running("r1", nodes=[(POOL, 1, 8)], ends_at=NOW + 100, priority=10)
        .running("r2", nodes=[(POOL, 2, 8)], ends_at=NOW + 200, priority=10)
        .queue(a_gang("big").gang(big).priority(10))
    )


BACKFILL_CASES = [
    pytest.param(
        blocked_big_gang((8, 0, 0)).queue(a_gang("short").runtime(limit_s=150)),
        {"big": "reserved", "short": "admitted"},
        id="a-job-ending-before-the-reserved-start-backfills",
    ),
    pytest.param(
        blocked_big_gang((8, 0, 0)).queue(a_gang("long").runtime(limit_s=3600)),
        {"big": "reserved", "long": "backfill_would_delay"},
        id="a-job-that-would-delay-the-reserved-start-waits",
    ),
    pytest.param(
        blocked_big_gang((8, 0, 0)).queue(a_gang("unbounded")),
        {"big": "reserved", "unbounded": "backfill_would_delay"},
        id="a-job-without-a-run-time-limit-cannot-promise-to-end",
    ),
    pytest.param(
        blocked_big_gang((4, 8, 0), big=2).queue(a_gang("spare").gang(1, gpus=4).runtime(limit_s=3600)),
        {"big": "reserved", "spare": "admitted"},
        id="a-job-in-capacity-the-reservation-does-not-need-backfills",
    ),
    pytest.param(
        blocked_big_gang((8, 0, 0)).policy(backfill=False).queue(a_gang("long").runtime(limit_s=3600)),
        {"big": "insufficient_capacity", "long": "admitted"},
        id="backfill-off-is-plain-greedy",
    ),
]


@pytest.mark.parametrize(("snapshot", "expected"), BACKFILL_CASES)
def test_backfill(snapshot: SnapshotBuilder, expected: dict[str, str]) -> None:
    assert outcome(plan(snapshot.build(), now=NOW)) == expected


def test_the_reservation_says_where_and_when() -> None:
    result = plan(blocked_big_gang((8, 0, 0)).build(), now=NOW)
    (reservation,) = result.reservations
    assert (reservation.job_id, reservation.cluster, reservation.gpu_type) == ("big", "c1", "A100")
    assert reservation.start_at_s == NOW + 200
    assert result.waiting[0].reasons[-1].at_s == NOW + 200


def test_running_gangs_past_their_limit_end_now_and_unknown_ends_never() -> None:
    snapshot = (
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", free=(0, 0)))
        .running("overdue", nodes=[(POOL, 0, 8)], ends_at=NOW - 50)
        .running("forever", nodes=[(POOL, 1, 8)])
        .queue(a_gang("one").gang(1), a_gang("two").gang(2).queued_at(1))
    )
    result = plan(snapshot.build(), now=NOW)
    assert [(r.job_id, r.start_at_s) for r in result.reservations] == [("one", NOW)]
