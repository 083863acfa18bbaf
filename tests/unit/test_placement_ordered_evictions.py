"""Preemption orders of earlier cycles count: their victims' GPUs are the beneficiary's until they leave.

The issue's case: a 32 x A100 cluster held by vision (16 borrowed); nlp, guaranteed 16, waits for a
16-GPU gang. A first cycle ordered two 8-GPU gangs evicted for it. Once evicted, a gang's status no
longer says on which nodes its pods still sit through the grace period, so the next cycle (94 ms
later) could not count them as leaving and ordered two more: 32 GPUs evicted for 16.
"""

from __future__ import annotations

from dataclasses import replace

from placement.model import JobId, Plan, Snapshot, WaitCode
from placement.plan import plan
from tests.unit.placement_builders import SnapshotBuilder, a_cluster, a_gang, a_snapshot, a_tenant

NOW = 1000.0
POOL = "a100-private-0"
VISION, NLP = "vision", "nlp"


def held_by_vision(free: tuple[int, ...] = (0, 0, 0, 0)) -> SnapshotBuilder:
    builder = (
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", free=free))
        .tenants(
            a_tenant(VISION).quota("A100", guaranteed=16, borrow=16),
            a_tenant(NLP).quota("A100", guaranteed=16, borrow=16),
        )
    )
    for index, gpus in enumerate(free):
        if gpus == 0:
            builder = builder.running(f"v{index}", tenant=VISION, nodes=[(POOL, index, 8)], queued_at=index)
    return builder


def ordered_for(snapshot: Snapshot, beneficiary: str, *victims: str, located: bool = True) -> Snapshot:
    """The snapshot after an earlier cycle ordered `victims` evicted for `beneficiary`.

    `located=False`: the cluster reports them evicted, pods still terminating, nodes not said.
    """
    running = tuple(
        replace(
            g,
            terminating=True,
            evicted_for=JobId(beneficiary),
            nodes=g.nodes if located else (),
        )
        if g.job_id in victims
        else g
        for g in snapshot.running
    )
    return replace(snapshot, running=running)


def preempting(result: Plan, job_id: str) -> bool:
    (waiting,) = [w for w in result.waiting if w.job_id == job_id]
    return waiting.reasons[-1].code is WaitCode.PREEMPTING


def test_the_first_cycle_orders_exactly_two_victims() -> None:
    snapshot = held_by_vision().queue(a_gang("llm").tenant(NLP).gang(2, gpus=8)).build()
    result = plan(snapshot, now=NOW)
    assert sum(p.gpu_count for p in result.preemptions) == 16
    assert {p.for_job for p in result.preemptions} == {"llm"}


def test_evicted_victims_whose_nodes_are_no_longer_reported_still_count_for_their_beneficiary() -> None:
    first = held_by_vision().queue(a_gang("llm").tenant(NLP).gang(2, gpus=8)).build()
    victims = [p.victim for p in plan(first, now=NOW).preemptions]
    second = ordered_for(first, "llm", *victims, located=False)
    result = plan(second, now=NOW + 0.094)
    assert result.preemptions == (), "no one more is evicted for a gang whose victims are leaving"
    assert preempting(result, "llm")


def test_located_victims_count_too_and_no_one_else_is_ordered() -> None:
    first = held_by_vision().queue(a_gang("llm").tenant(NLP).gang(2, gpus=8)).build()
    victims = [p.victim for p in plan(first, now=NOW).preemptions]
    result = plan(ordered_for(first, "llm", *victims), now=NOW + 0.094)
    assert result.preemptions == ()
    assert preempting(result, "llm")


def test_a_partial_order_holds_the_free_gpus_the_beneficiary_still_needs() -> None:
    # One node free, one gang of vision's ordered out for llm (16 = 8 free + 8 leaving); a vision
    # gang queued later must not take the free node, and no second victim is chosen.
    snapshot = (
        held_by_vision(free=(0, 0, 0, 8))
        .queue(a_gang("llm").tenant(NLP).gang(2, gpus=8), a_gang("more").tenant(VISION).gang(1, gpus=8))
        .build()
    )
    result = plan(ordered_for(snapshot, "llm", "v0", located=False), now=NOW)
    assert result.preemptions == ()
    assert [a.job_id for a in result.admissions] == []
    assert preempting(result, "llm")


def test_gangs_leaving_for_one_gang_are_not_counted_on_by_another() -> None:
    # Two nlp gangs wait; v0 and v1 leave for the first. The second must find its own victims, not
    # count on theirs (which would leave both waiting on the same 16 GPUs).
    snapshot = (
        held_by_vision()
        .tenants(
            a_tenant(VISION).quota("A100", guaranteed=0, borrow=32),
            a_tenant(NLP).quota("A100", guaranteed=32),
        )
        .queue(
            a_gang("first").tenant(NLP).gang(2, gpus=8).queued_at(1),
            a_gang("second").tenant(NLP).gang(2, gpus=8).queued_at(2),
        )
        .build()
    )
    result = plan(ordered_for(snapshot, "first", "v0", "v1"), now=NOW)
    assert {p.victim for p in result.preemptions} == {"v2", "v3"}
    assert {p.for_job for p in result.preemptions} == {"second"}
    assert preempting(result, "first")
    assert preempting(result, "second")


def test_an_order_for_a_gang_no_longer_queued_frees_its_gpus_for_anyone() -> None:
    # The beneficiary was admitted elsewhere or cancelled: the leaving gangs are anyone's to count on.
    snapshot = held_by_vision().queue(a_gang("llm").tenant(NLP).gang(2, gpus=8)).build()
    result = plan(ordered_for(snapshot, "gone", "v2", "v3"), now=NOW)
    assert result.preemptions == ()
    assert preempting(result, "llm")


def test_gpus_freed_by_ordered_victims_go_to_their_beneficiary_not_to_a_gang_decided_first() -> None:
    # v2 and v3 are gone from their nodes (free again) while their records still carry the order
    # for llm. nlp's hotter 8-GPU gang is decided first (higher priority) and must not take them.
    snapshot = (
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", free=(0, 0, 8, 8)))
        .tenants(
            a_tenant(VISION).quota("A100", guaranteed=16, borrow=16),
            a_tenant(NLP).quota("A100", guaranteed=16, borrow=16),
        )
        .running("v0", tenant=VISION, nodes=[(POOL, 0, 8)], preemptible=False)
        .running("v1", tenant=VISION, nodes=[(POOL, 1, 8)], preemptible=False)
        .running("v2", tenant=VISION, gpus=8)
        .running("v3", tenant=VISION, gpus=8)
        .queue(
            a_gang("hot").tenant(NLP).gang(1, gpus=8).priority(5000),
            a_gang("llm").tenant(NLP).gang(2, gpus=8),
        )
        .build()
    )
    result = plan(ordered_for(snapshot, "llm", "v2", "v3", located=False), now=NOW)
    assert [a.job_id for a in result.admissions] == ["llm"]
    assert result.preemptions == ()
