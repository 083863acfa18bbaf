"""Issue 30, items 4 and 11: an approved priority makes room under its own tenant's cap by evicting
the tenant's own lower-priority gangs; borrowers are evicted from the tenant furthest above its
weighted fair share first."""

from __future__ import annotations

from dataclasses import replace

import pytest

from placement.model import Plan, PriorityClass, WaitCode
from placement.plan import plan
from tests.unit.placement_builders import (
    GangBuilder,
    SnapshotBuilder,
    a_cluster,
    a_gang,
    a_snapshot,
    a_tenant,
)

NOW = 1000.0
POOL = "a100-private-0"
URGENT = PriorityClass("urgent", 10_000, preemptible=False, needs_approval=True)
HIGH = PriorityClass("high", 5_000)


def capped(cap: int = 16, free: tuple[int, ...] = (8, 8, 0, 0)) -> SnapshotBuilder:
    """Four A100 nodes; vision may hold at most `cap` of them (two are taken by vision's own gangs)."""
    return (
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", free=free))
        .tenants(a_tenant("vision").quota("A100", cap=cap), a_tenant("nlp"))
        .classes(URGENT, HIGH)
    )


def evicted(result: Plan) -> list[tuple[str, str, str]]:
    return [(p.victim, p.for_job, p.reason.value) for p in result.preemptions]


def urgent(approved: bool = True) -> GangBuilder:
    return (
        a_gang("paper")
        .tenant("vision")
        .priority(10_000)
        .priority_class("urgent", approved_until=NOW + 3600 if approved else None)
    )


CASES = [
    pytest.param(
        capped()
        .running("low-a", tenant="vision", nodes=[(POOL, 2, 8)], priority=0, queued_at=1.0)
        .running("low-b", tenant="vision", nodes=[(POOL, 3, 8)], priority=0, queued_at=2.0)
        .queue(urgent()),
        [("low-b", "paper", "tenant_cap")],
        id="approved-urgent-evicts-one-own-low-gang-to-get-under-the-cap",
    ),
    pytest.param(
        capped()
        .running("low-a", tenant="vision", nodes=[(POOL, 2, 8)], priority=0)
        .running("low-b", tenant="vision", nodes=[(POOL, 3, 8)], priority=0)
        .queue(a_gang("paper").tenant("vision").priority(10_000).priority_class("urgent")),
        [],
        id="without-approval-nothing-is-evicted",
    ),
    pytest.param(
        capped()
        .running("low-a", tenant="vision", nodes=[(POOL, 2, 8)], priority=0)
        .running("low-b", tenant="vision", nodes=[(POOL, 3, 8)], priority=0)
        .queue(a_gang("hi").tenant("vision").priority(5_000).priority_class("high")),
        [],
        id="a-higher-class-that-needs-no-approval-does-not-pass-the-cap",
    ),
    pytest.param(
        capped()
        .running("peer-a", tenant="vision", nodes=[(POOL, 2, 8)], priority=10_000)
        .running("peer-b", tenant="vision", nodes=[(POOL, 3, 8)], priority=10_000)
        .queue(urgent()),
        [],
        id="equal-priorities-are-never-evicted",
    ),
    pytest.param(
        capped(cap=8, free=(0, 0, 0, 8))
        .running("other", tenant="nlp", nodes=[(POOL, 0, 8)], priority=0)
        .running("other2", tenant="nlp", nodes=[(POOL, 1, 8)], priority=0)
        .running("low", tenant="vision", nodes=[(POOL, 2, 8)], priority=0)
        .queue(urgent()),
        [("low", "paper", "tenant_cap")],
        id="only-the-tenants-own-gangs-pay-for-its-cap",
    ),
    pytest.param(
        capped(cap=16, free=(0, 0, 0, 0))
        .running("low-a", tenant="vision", nodes=[(POOL, 0, 8)], priority=0, queued_at=1.0)
        .running("low-b", tenant="vision", nodes=[(POOL, 1, 8)], priority=100, queued_at=2.0)
        .running("nlp-a", tenant="nlp", nodes=[(POOL, 2, 8)], priority=0)
        .running("nlp-b", tenant="nlp", nodes=[(POOL, 3, 8)], priority=0)
        .queue(urgent()),
        [("low-a", "paper", "tenant_cap")],
        id="full-cluster-the-lowest-own-gang-frees-both-the-cap-and-the-node",
    ),
    pytest.param(
        capped(cap=16, free=(8, 8, 0, 0))
        .running("low-a", tenant="vision", nodes=[(POOL, 2, 8)], priority=0, preemptible=False)
        .running("low-b", tenant="vision", nodes=[(POOL, 3, 8)], priority=0, preemptible=False)
        .queue(urgent()),
        [],
        id="non-preemptible-own-gangs-are-kept",
    ),
]


@pytest.mark.parametrize(("snapshot", "expected"), CASES)
def test_who_is_evicted_to_make_room_under_the_cap(
    snapshot: SnapshotBuilder, expected: list[tuple[str, str, str]]
) -> None:
    result = plan(snapshot.build(), now=NOW)
    assert evicted(result) == expected
    assert not result.admissions


def test_explain_says_the_approved_class_makes_room_under_the_cap() -> None:
    snapshot = (
        capped()
        .running("low-a", tenant="vision", nodes=[(POOL, 2, 8)], priority=0)
        .running("low-b", tenant="vision", nodes=[(POOL, 3, 8)], priority=0)
        .queue(urgent())
    )
    (waiting,) = plan(snapshot.build(), now=NOW).waiting
    codes = [r.code for r in waiting.reasons]
    assert codes == [WaitCode.TENANT_CAP_REACHED, WaitCode.PREEMPTING]
    message = waiting.reasons[-1].message
    assert "priority class urgent is approved" in message
    assert "evicting 1 of tenant vision's lower-priority gangs (8 A100 GPUs)" in message
    assert "under its limit" in message


def test_while_its_victims_leave_the_approved_job_waits_and_passes_no_cap() -> None:
    """The next cycle: the victim is leaving (ordered out for it) and still counts against the cap."""
    snapshot = (
        capped()
        .running("low-a", tenant="vision", nodes=[(POOL, 2, 8)], priority=0)
        .running("low-b", tenant="vision", nodes=[(POOL, 3, 8)], priority=0, terminating=True)
        .queue(urgent())
        .build()
    )
    running = tuple(
        replace(r, evicted_for=snapshot.queued[0].job_id) if r.job_id == "low-b" else r
        for r in snapshot.running
    )
    result = plan(replace(snapshot, running=running), now=NOW)
    assert result.admissions == ()
    assert result.preemptions == (), "no one more is evicted while the first victim leaves"
    (waiting,) = result.waiting
    assert [r.code for r in waiting.reasons] == [WaitCode.TENANT_CAP_REACHED, WaitCode.PREEMPTING]


def test_once_the_victim_is_gone_the_approved_job_runs_within_the_cap() -> None:
    snapshot = (
        capped(free=(8, 8, 0, 8))
        .running("low-a", tenant="vision", nodes=[(POOL, 2, 8)], priority=0)
        .queue(urgent())
    )
    result = plan(snapshot.build(), now=NOW)
    (admission,) = result.admissions
    assert admission.job_id == "paper"
    assert result.preemptions == ()


BORROWERS = (
    a_snapshot()
    .clusters(a_cluster("c1").pool("A100", free=(0, 0, 0, 0)))
    .running("heavy-1", tenant="light", nodes=[(POOL, 0, 8)], priority=0, queued_at=1.0)
    .running("heavy-2", tenant="light", nodes=[(POOL, 1, 8)], priority=0, queued_at=1.0)
    .running("a-weighted-1", tenant="weighty", nodes=[(POOL, 2, 8)], priority=0, queued_at=5.0)
    .running("a-weighted-2", tenant="weighty", nodes=[(POOL, 3, 8)], priority=0, queued_at=5.0)
    .queue(a_gang("owner").tenant("owner"))
)


@pytest.mark.parametrize(
    ("light_weight", "weighty_weight", "victim"),
    [
        # Equal holdings: the tenant with the smaller weight is further above its weighted share.
        pytest.param(1.0, 3.0, "heavy-1", id="weight-1-goes-before-weight-3"),
        pytest.param(3.0, 1.0, "a-weighted-1", id="and-the-other-way-round"),
    ],
)
def test_borrowers_are_evicted_from_the_tenant_furthest_above_its_weighted_share(
    light_weight: float, weighty_weight: float, victim: str
) -> None:
    snapshot = BORROWERS.tenants(
        a_tenant("owner").quota("A100", guaranteed=8),
        a_tenant("light").weight(light_weight),
        a_tenant("weighty").weight(weighty_weight),
    )
    result = plan(snapshot.build(), now=NOW)
    assert [p.victim for p in result.preemptions] == [victim]
    assert result.preemptions[0].reason.value == "reclaim_guarantee"
