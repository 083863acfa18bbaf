"""Waiting for private GPUs, with what running gangs' run-time limits say about when room frees up.

Every case: a private cluster `onprem` (one pool `p` of A100 nodes at $1) and an elastic cloud at $3.
Job `j` needs a whole node (8 GPUs) for an hour: 8 GPU-hours, so at 600 s per GPU-hour it may wait
80 minutes for private GPUs (until NOW + 4,800 s) before it bursts.
"""

from __future__ import annotations

import pytest

from placement.model import CapacityKind, ClusterName, GpuType, JobId, Plan, Reservation, WaitCode
from placement.plan import plan
from tests.unit.placement_builders import SnapshotBuilder, a_cluster, a_gang, a_snapshot

HOUR = 3600.0
NOW = 10 * HOUR
MINUTE = 60.0
WAIT_UNTIL = NOW + 80 * MINUTE


def world(free: tuple[int, ...], **policy: object) -> SnapshotBuilder:
    return (
        a_snapshot()
        .clusters(
            a_cluster("onprem").pool("A100", free=free, price=1.0, name="p"),
            a_cluster("cloud").provider_cloud().pool("A100", kind=CapacityKind.ON_DEMAND, nodes=4, price=3.0),
        )
        .policy(private_wait_s_per_gpu_hour=600.0, **policy)
    )


def big_job() -> SnapshotBuilder:
    """`j` queued now; node 0 of `onprem` is fully used by `r`, whose end the cases set."""
    return world((0,)).queue(a_gang("j").gang(1, gpus=8).queued_at(NOW))


def outcome(result: Plan) -> str:
    if result.admissions:
        return f"admitted:{result.admissions[0].cluster}"
    return result.waiting[0].reasons[-1].code.value


NEEDS_START_CASES = [
    pytest.param(True, NOW + 10 * MINUTE, "waiting_for_private_capacity", id="room-frees-within-the-wait"),
    pytest.param(True, WAIT_UNTIL, "waiting_for_private_capacity", id="room-frees-as-the-wait-ends"),
    pytest.param(True, NOW + 2 * HOUR, "admitted:cloud", id="room-frees-only-after-the-wait-bursts-now"),
    pytest.param(True, None, "admitted:cloud", id="no-run-time-limit-known-bursts-now"),
    pytest.param(False, NOW + 2 * HOUR, "waiting_for_private_capacity", id="rule-off-waits-as-before"),
]


@pytest.mark.parametrize(("needs_start", "ends_at", "expected"), NEEDS_START_CASES)
def test_a_wait_needs_room_before_it_ends(needs_start: bool, ends_at: float | None, expected: str) -> None:
    snapshot = big_job().policy(private_wait_needs_start=needs_start)
    snapshot = snapshot.running("r", cluster="onprem", nodes=[("p", 0, 8)], ends_at=ends_at)
    assert outcome(plan(snapshot.build(), now=NOW)) == expected


def test_the_wait_says_when_room_frees_and_until_when_it_waits() -> None:
    snapshot = big_job().policy(private_wait_needs_start=True)
    snapshot = snapshot.running("r", cluster="onprem", nodes=[("p", 0, 8)], ends_at=NOW + 10 * MINUTE)
    (waiting,) = plan(snapshot.build(), now=NOW).waiting
    reason = waiting.reasons[-1]
    assert (reason.code, reason.cluster, reason.at_s) == (
        WaitCode.WAITING_FOR_PRIVATE_CAPACITY,
        "onprem",
        WAIT_UNTIL,
    )
    # Times as a UTC clock: NOW is 10:00 on the epoch's day.
    assert "until 11:20 UTC: saves an estimated $16.00 against bursting now to cloud" in reason.message
    assert "run-time limits free room for it by 10:10 UTC" in reason.message


def small_job_behind(reserve: bool) -> Plan:
    """Node 0 has 4 GPUs free and `r` holds the other 4 for 10 more minutes. `j` (8 GPUs) waits for
    the whole node; `k` (4 GPUs for 3 hours, queued after `j`) fits in the free half now."""
    snapshot = (
        world((4,), private_wait_reserve=reserve)
        .running("r", cluster="onprem", nodes=[("p", 0, 4)], ends_at=NOW + 10 * MINUTE)
        .queue(
            a_gang("j").gang(1, gpus=8).queued_at(NOW),
            a_gang("k").gang(1, gpus=4).runtime(limit_s=int(3 * HOUR)).queued_at(NOW + 1),
        )
    )
    return plan(snapshot.build(), now=NOW + 1)


def test_without_a_reservation_a_later_small_job_takes_the_room_the_big_one_waits_for() -> None:
    result = small_job_behind(reserve=False)
    assert [(a.job_id, a.cluster) for a in result.admissions] == [("k", "onprem")]
    assert result.reservations == ()


def test_the_first_waiting_job_reserves_the_room_its_wait_is_for() -> None:
    result = small_job_behind(reserve=True)
    assert result.admissions == ()
    assert result.reservations == (
        Reservation(JobId("j"), ClusterName("onprem"), GpuType("A100"), NOW + 10 * MINUTE),
    )
    waits = {str(w.job_id): w.reasons[-1] for w in result.waiting}
    assert "reserved on cluster onprem (A100)" in waits["j"].message
    # `k` would delay `j` on onprem, so it waits for private GPUs of its own (12 GPU-hours: 2 h).
    assert waits["k"].code is WaitCode.WAITING_FOR_PRIVATE_CAPACITY
    assert waits["k"].at_s == NOW + 1 + 2 * HOUR


def two_big_jobs_and_a_small_one(reservations: int, *, needs_start: bool = True) -> Plan:
    """Each of two nodes has 4 GPUs free; `r0` holds the rest of node 0 for 10 more minutes, `r1` the
    rest of node 1 for 20. `j1` and `j2` (8 GPUs each) wait for whole nodes; `k` (4 GPUs for 3 hours,
    queued last) fits in either free half now."""
    snapshot = (
        world(
            (4, 4),
            private_wait_reserve=True,
            private_wait_needs_start=needs_start,
            private_wait_reservations=reservations,
        )
        .running("r0", cluster="onprem", nodes=[("p", 0, 4)], ends_at=NOW + 10 * MINUTE)
        .running("r1", cluster="onprem", nodes=[("p", 1, 4)], ends_at=NOW + 20 * MINUTE)
        .queue(
            a_gang("j1").gang(1, gpus=8).queued_at(NOW),
            a_gang("j2").gang(1, gpus=8).queued_at(NOW + 1),
            a_gang("k").gang(1, gpus=4).runtime(limit_s=int(3 * HOUR)).queued_at(NOW + 2),
        )
    )
    return plan(snapshot.build(), now=NOW + 2)


def test_with_one_reservation_a_small_job_takes_the_node_the_second_big_one_waits_for() -> None:
    result = two_big_jobs_and_a_small_one(1)
    assert [(a.job_id, a.cluster) for a in result.admissions] == [("k", "onprem")]
    assert [r.job_id for r in result.reservations] == ["j1"]


def test_each_waiting_job_reserves_its_own_room_after_the_ones_before() -> None:
    result = two_big_jobs_and_a_small_one(2)
    assert result.reservations == (
        Reservation(JobId("j1"), ClusterName("onprem"), GpuType("A100"), NOW + 10 * MINUTE),
        Reservation(JobId("j2"), ClusterName("onprem"), GpuType("A100"), NOW + 20 * MINUTE),
    )
    waits = {str(w.job_id): w.reasons[-1] for w in result.waiting}
    # `k` fits beside `j1` at its start, but not beside both: it may not delay `j2`.
    assert result.admissions == ()
    assert waits["k"].code is WaitCode.WAITING_FOR_PRIVATE_CAPACITY
    # `j2`'s message says when its reserved room comes, after `j1`'s.
    assert waits["j2"].code is WaitCode.WAITING_FOR_PRIVATE_CAPACITY
    assert waits["j2"].at_s == NOW + 1 + 80 * MINUTE
    assert "reserved on cluster onprem (A100) from 10:20 UTC" in waits["j2"].message


def one_node_two_big_jobs(needs_start: bool) -> Plan:
    """One node, fully used by `r` for 10 more minutes; `j1` and `j2` both need all of it."""
    snapshot = (
        world(
            (0,),
            private_wait_reserve=True,
            private_wait_needs_start=needs_start,
            private_wait_reservations=4,
        )
        .running("r", cluster="onprem", nodes=[("p", 0, 8)], ends_at=NOW + 10 * MINUTE)
        .queue(
            a_gang("j1").gang(1, gpus=8).queued_at(NOW),
            a_gang("j2").gang(1, gpus=8).queued_at(NOW + 1),
        )
    )
    return plan(snapshot.build(), now=NOW + 2)


def test_reservations_never_overlap_and_a_job_left_without_room_bursts() -> None:
    result = one_node_two_big_jobs(needs_start=True)
    # By the limits `j1` holds the node for ever after `r`: nothing is left for `j2` before its wait ends.
    assert [r.job_id for r in result.reservations] == ["j1"]
    assert [(a.job_id, a.cluster) for a in result.admissions] == [("j2", "cloud")]


def test_without_the_room_test_a_job_left_without_room_waits_unreserved() -> None:
    result = one_node_two_big_jobs(needs_start=False)
    assert [r.job_id for r in result.reservations] == ["j1"]
    waits = {str(w.job_id): w.reasons[-1] for w in result.waiting}
    assert waits["j2"].code is WaitCode.WAITING_FOR_PRIVATE_CAPACITY
    assert "reserved" not in waits["j2"].message


@pytest.mark.parametrize(
    ("min_gpus", "expected"),
    [
        pytest.param(8, "waiting_for_private_capacity", id="as-large-as-the-minimum-waits"),
        pytest.param(16, "admitted:cloud", id="smaller-than-the-minimum-bursts-now"),
    ],
)
def test_a_job_smaller_than_the_minimum_never_waits(min_gpus: int, expected: str) -> None:
    snapshot = big_job().policy(private_wait_min_gpus=min_gpus)
    snapshot = snapshot.running("r", cluster="onprem", nodes=[("p", 0, 8)], ends_at=NOW + 10 * MINUTE)
    assert outcome(plan(snapshot.build(), now=NOW)) == expected


@pytest.mark.parametrize(
    ("max_gpus", "expected"),
    [
        pytest.param(4, "waiting_for_private_capacity", id="larger-than-the-test-waits-without-promise"),
        pytest.param(8, "admitted:cloud", id="within-the-test-bursts-now"),
    ],
)
def test_the_room_test_applies_only_up_to_its_size(max_gpus: int, expected: str) -> None:
    # The limits free room only after the wait would end.
    snapshot = big_job().policy(private_wait_needs_start=True, private_wait_needs_start_max_gpus=max_gpus)
    snapshot = snapshot.running("r", cluster="onprem", nodes=[("p", 0, 8)], ends_at=NOW + 2 * HOUR)
    assert outcome(plan(snapshot.build(), now=NOW)) == expected
