"""Preemption, rule by rule: who is evicted for whom, the smallest set, grace, requeue position, limits."""

from __future__ import annotations

import pytest

from placement.model import Plan, PolicyConfig, PreemptionReason, PriorityClass, WaitCode
from placement.plan import plan
from tests.unit.placement_builders import SnapshotBuilder, a_cluster, a_gang, a_snapshot, a_tenant

NOW = 1000.0
POOL = "a100-private-0"
SENIOR, INTERN = "senior", "intern"


def full_cluster(nodes: int = 2) -> SnapshotBuilder:
    """`nodes` full A100 nodes; quotas: senior guaranteed 16, intern guaranteed nothing (so it borrows)."""
    return (
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", free=(0,) * nodes))
        .tenants(a_tenant(SENIOR).quota("A100", guaranteed=16), a_tenant(INTERN).quota("A100", guaranteed=0))
    )


def evicted(result: Plan) -> list[tuple[str, str, str]]:
    return [(p.victim, p.for_job, p.reason.value) for p in result.preemptions]


CASES = [
    pytest.param(
        full_cluster()
        .running("intern-a", tenant=INTERN, nodes=[(POOL, 0, 8)], priority=0)
        .running("intern-b", tenant=INTERN, nodes=[(POOL, 1, 8)], priority=0, queued_at=5.0)
        .queue(a_gang("urgent").tenant(SENIOR).priority(1000)),
        [("intern-b", "urgent", "reclaim_guarantee")],
        id="urgent-senior-preempts-intern-borrowing",
    ),
    pytest.param(
        full_cluster()
        .running("low", tenant=SENIOR, nodes=[(POOL, 0, 8)], priority=0)
        .running("high", tenant=SENIOR, nodes=[(POOL, 1, 8)], priority=500)
        .queue(a_gang("mid").tenant(SENIOR).priority(100)),
        [("low", "mid", "lower_priority")],
        id="within-a-tenant-lower-priority-yields",
    ),
    pytest.param(
        full_cluster()
        .running("same", tenant=INTERN, nodes=[(POOL, 0, 8)], priority=100)
        .running("same2", tenant=INTERN, nodes=[(POOL, 1, 8)], priority=100)
        .queue(a_gang("peer").tenant(INTERN).priority(100)),
        [],
        id="equal-priority-is-not-preempted",
    ),
    pytest.param(
        full_cluster()
        .tenants(a_tenant(SENIOR).quota("A100", guaranteed=16), a_tenant(INTERN).quota("A100", guaranteed=16))
        .running("i1", tenant=INTERN, nodes=[(POOL, 0, 8)])
        .running("i2", tenant=INTERN, nodes=[(POOL, 1, 8)])
        .queue(a_gang("senior-job").tenant(SENIOR).priority(1000)),
        [],
        id="a-tenant-within-its-own-guarantee-keeps-its-gangs",
    ),
    pytest.param(
        full_cluster()
        .tenants(a_tenant(SENIOR).quota("A100", guaranteed=8), a_tenant(INTERN))
        .running("s1", tenant=SENIOR, nodes=[(POOL, 0, 8)], priority=1000)
        .running("i1", tenant=INTERN, nodes=[(POOL, 1, 8)])
        .queue(a_gang("beyond").tenant(SENIOR).priority(1000)),
        [],
        id="a-preemptor-beyond-its-guarantee-reclaims-nothing",
    ),
    pytest.param(
        full_cluster()
        .running("protected", tenant=INTERN, nodes=[(POOL, 0, 8)], preemptible=False)
        .running("by-class", tenant=INTERN, nodes=[(POOL, 1, 8)], priority_class="system")
        .classes(PriorityClass("system", 0, preemptible=False))
        .queue(a_gang("urgent").tenant(SENIOR).priority(1000)),
        [],
        id="non-preemptible-gangs-and-classes-are-never-evicted",
    ),
    pytest.param(
        full_cluster()
        .running("i1", tenant=INTERN, nodes=[(POOL, 0, 8)])
        .running("i2", tenant=INTERN, nodes=[(POOL, 1, 8)])
        .queue(a_gang("too-big").tenant(SENIOR).gang(3).priority(1000)),
        [],
        id="never-evict-for-a-gang-that-would-still-not-fit",
    ),
    pytest.param(
        full_cluster()
        .running("half-a", tenant=INTERN, nodes=[(POOL, 0, 4)], queued_at=9.0)
        .running("half-b", tenant=INTERN, nodes=[(POOL, 0, 4)], queued_at=8.0)
        .running("whole", tenant=INTERN, nodes=[(POOL, 1, 8)])
        .queue(a_gang("urgent").tenant(SENIOR)),
        [("whole", "urgent", "reclaim_guarantee")],
        id="one-victim-rather-than-two",
    ),
    pytest.param(
        full_cluster(3)
        .tenants(a_tenant(SENIOR).quota("A100", guaranteed=32), a_tenant(INTERN).quota("A100", guaranteed=8))
        .running("i1", tenant=INTERN, nodes=[(POOL, 0, 8)])
        .running("i2", tenant=INTERN, nodes=[(POOL, 1, 8)])
        .running("i3", tenant=INTERN, nodes=[(POOL, 2, 8)])
        .queue(*(a_gang(f"s{i}").tenant(SENIOR).queued_at(i) for i in (1, 2, 3))),
        [("i1", "s1", "reclaim_guarantee"), ("i2", "s2", "reclaim_guarantee")],
        id="a-borrower-is-evicted-only-down-to-its-guarantee",
    ),
    pytest.param(
        full_cluster()
        .running("i1", tenant=INTERN, nodes=[(POOL, 0, 8)], terminating=True)
        .running("i2", tenant=INTERN, nodes=[(POOL, 1, 8)])
        .queue(a_gang("urgent").tenant(SENIOR)),
        [],
        id="gangs-already-leaving-are-waited-for-and-nobody-else-is-evicted",
    ),
    pytest.param(
        full_cluster()
        .running("somewhere", tenant=INTERN)  # no node shares: what it frees is unknown
        .queue(a_gang("urgent").tenant(SENIOR)),
        [],
        id="a-gang-whose-nodes-are-unknown-is-never-evicted",
    ),
]


@pytest.mark.parametrize(("snapshot", "expected"), CASES)
def test_who_is_preempted(snapshot: SnapshotBuilder, expected: list[tuple[str, str, str]]) -> None:
    result = plan(snapshot.build(), now=NOW)
    assert evicted(result) == expected
    assert not result.admissions, "a preemptor starts in a later cycle, once its victims are gone"


def test_a_preemption_carries_grace_cluster_and_the_victims_queue_position() -> None:
    snapshot = (
        full_cluster()
        .running("i1", tenant=INTERN, nodes=[(POOL, 0, 8)], grace_s=120.0, queued_at=42.0)
        .running("i2", tenant=INTERN, nodes=[(POOL, 1, 8)], preemptible=False)
        .queue(a_gang("urgent").tenant(SENIOR))
    )
    result = plan(snapshot.build(), now=NOW)
    (preemption,) = result.preemptions
    assert (preemption.cluster, preemption.gpu_type, preemption.gpu_count) == ("c1", "A100", 8)
    assert (preemption.grace_period_s, preemption.requeue_queued_at_s) == (120.0, 42.0)
    assert preemption.reason is PreemptionReason.RECLAIM_GUARANTEE
    (waiting,) = result.waiting
    assert waiting.reasons[-1].code is WaitCode.PREEMPTING
    assert waiting.reasons[-1].at_s == NOW + 120.0


def test_default_grace_period_applies_when_the_gang_states_none() -> None:
    snapshot = (
        full_cluster()
        .policy(default_grace_period_s=45.0)
        .running("i1", tenant=INTERN, nodes=[(POOL, 0, 8)])
        .running("i2", tenant=INTERN, nodes=[(POOL, 1, 8)], preemptible=False)
        .queue(a_gang("urgent").tenant(SENIOR))
    )
    assert plan(snapshot.build(), now=NOW).preemptions[0].grace_period_s == 45.0


@pytest.mark.parametrize(
    ("limit", "already", "expected_code"),
    [
        pytest.param(None, 0, WaitCode.PREEMPTING, id="no-limit"),
        pytest.param(8, 0, WaitCode.PREEMPTING, id="limit-exactly-enough"),
        pytest.param(8, 4, WaitCode.PREEMPTION_LIMIT_REACHED, id="interval-already-used-part-of-it"),
        pytest.param(16, 16, WaitCode.PREEMPTION_LIMIT_REACHED, id="interval-used-up"),
    ],
)
def test_preemption_limit_per_interval(limit: int | None, already: int, expected_code: WaitCode) -> None:
    snapshot = (
        full_cluster()
        .policy(preemption_limit_gpus=limit, preempted_gpus_this_interval=already)
        .running("i1", tenant=INTERN, nodes=[(POOL, 0, 8)])
        .running("i2", tenant=INTERN, nodes=[(POOL, 1, 8)])
        .queue(a_gang("urgent").tenant(SENIOR))
    )
    result = plan(snapshot.build(), now=NOW)
    assert [r.code for r in result.waiting[0].reasons][-1] is expected_code
    assert len(result.preemptions) == (1 if expected_code is WaitCode.PREEMPTING else 0)


def test_preemption_can_be_turned_off() -> None:
    snapshot = (
        full_cluster()
        .policy(preemption=False)
        .running("i1", tenant=INTERN, nodes=[(POOL, 0, 8)])
        .running("i2", tenant=INTERN, nodes=[(POOL, 1, 8)])
        .queue(a_gang("urgent").tenant(SENIOR))
    )
    assert plan(snapshot.build(), now=NOW).preemptions == ()


def test_capacity_held_for_a_preemptor_is_not_given_to_a_later_gang() -> None:
    """The preemptor needs the free node and the victim's: a later small gang may not take the free one."""
    snapshot = (
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", free=(8, 0)))
        .tenants(a_tenant(SENIOR).quota("A100", guaranteed=16), a_tenant(INTERN))
        .running("i1", tenant=INTERN, nodes=[(POOL, 1, 8)])
        .queue(a_gang("big").tenant(SENIOR).gang(2).priority(10), a_gang("small").tenant(INTERN).gang(1))
    )
    result = plan(snapshot.build(), now=NOW)
    assert evicted(result) == [("i1", "big", "reclaim_guarantee")]
    assert result.admissions == ()
    assert {w.job_id for w in result.waiting} == {"big", "small"}


def test_a_victim_is_claimed_by_one_preemptor_only() -> None:
    snapshot = (
        full_cluster(1)
        .running("i1", tenant=INTERN, nodes=[(POOL, 0, 8)])
        .queue(a_gang("s1").tenant(SENIOR), a_gang("s2").tenant(SENIOR).queued_at(1))
    )
    result = plan(snapshot.policy(preemption_limit_gpus=None).build(), now=NOW)
    assert evicted(result) == [("i1", "s1", "reclaim_guarantee")]


def test_policy_defaults_allow_preemption_without_limit() -> None:
    assert (PolicyConfig().preemption, PolicyConfig().preemption_limit_gpus) == (True, None)


def test_a_gang_counting_on_leaving_gangs_waits_for_them_without_new_evictions() -> None:
    snapshot = (
        full_cluster()
        .running("leaving", tenant=INTERN, nodes=[(POOL, 0, 8)], terminating=True)
        .running("staying", tenant=INTERN, nodes=[(POOL, 1, 8)])
        .queue(a_gang("urgent").tenant(SENIOR), a_gang("next").tenant(SENIOR).queued_at(1))
    )
    result = plan(snapshot.build(), now=NOW)
    first, second = result.waiting
    assert (first.job_id, first.reasons[-1].code, first.reasons[-1].at_s) == (
        "urgent",
        WaitCode.PREEMPTING,
        NOW + 30,
    )
    # The leaving gang's GPUs are promised to the first gang: the second must evict someone else.
    assert second.reasons[-1].code is WaitCode.PREEMPTING
    assert evicted(result) == [("staying", "next", "reclaim_guarantee")]
