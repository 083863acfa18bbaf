"""Tenant tree quotas, GPU-hour budgets and priority gates, rule by rule: who is admitted, who waits and why."""

from __future__ import annotations

import pytest

from placement.model import Plan, PriorityClass, WaitCode
from placement.plan import plan
from tests.unit.placement_builders import SnapshotBuilder, a_cluster, a_gang, a_snapshot, a_tenant

NOW = 1000.0
FOUR_A100_NODES = a_cluster("c1").pool("A100", nodes=4)
URGENT = PriorityClass("urgent", 1000, preemptible=False, needs_approval=True)


def outcome(result: Plan) -> dict[str, str]:
    """Each job: 'admitted' or its first wait code."""
    out: dict[str, str] = {a.job_id: "admitted" for a in result.admissions}
    out.update({w.job_id: w.reasons[0].code.value for w in result.waiting})
    return out


CASES = [
    pytest.param(
        a_snapshot()
        .clusters(FOUR_A100_NODES)
        .tenants(
            a_tenant("org").quota("A100", cap=16), a_tenant("t1").parent("org"), a_tenant("t2").parent("org")
        )
        .running("r1", tenant="t2", gpus=8)
        .queue(a_gang("fits").tenant("t1"), a_gang("over-org-cap").tenant("t1").queued_at(1)),
        {"fits": "admitted", "over-org-cap": "tenant_cap_reached"},
        id="organisation-cap-counts-every-team",
    ),
    pytest.param(
        a_snapshot()
        .clusters(FOUR_A100_NODES)
        .tenants(a_tenant("t1").quota("A100", guaranteed=8, borrow=8))
        .queue(a_gang("within-guarantee"), a_gang("borrows").queued_at(1), a_gang("past-limit").queued_at(2)),
        {"within-guarantee": "admitted", "borrows": "admitted", "past-limit": "borrowing_limit"},
        id="borrowing-limit-stops-a-borrower",
    ),
    pytest.param(
        a_snapshot()
        .clusters(FOUR_A100_NODES)
        .tenants(
            a_tenant("t1").quota("A100", guaranteed=0),
            a_tenant("lender").quota("A100", guaranteed=24, lend=0),
        )
        .queue(a_gang("borrower").gang(2)),
        {"borrower": "quota_exhausted"},
        id="lender-holds-back-its-unused-guarantee",
    ),
    pytest.param(
        a_snapshot()
        .clusters(FOUR_A100_NODES)
        .tenants(
            a_tenant("t1").quota("A100", guaranteed=0),
            a_tenant("lender").quota("A100", guaranteed=24, lend=8),
        )
        # 8 GPUs nobody is guaranteed, plus the 8 the lender lends: two gangs of 8, not three.
        .queue(a_gang("b1").gang(1), a_gang("b2").gang(1).queued_at(1), a_gang("b3").gang(1).queued_at(2)),
        {"b1": "admitted", "b2": "admitted", "b3": "quota_exhausted"},
        id="lending-limit-lends-only-that-much",
    ),
    pytest.param(
        a_snapshot()
        .clusters(FOUR_A100_NODES)
        .tenants(a_tenant("t1").quota("A100", guaranteed=0), a_tenant("lender").quota("A100", guaranteed=24))
        .queue(a_gang("borrower").gang(2)),
        {"borrower": "admitted"},
        id="no-lending-limit-lends-everything-idle",
    ),
    pytest.param(
        a_snapshot()
        .clusters(FOUR_A100_NODES)
        .tenants(
            a_tenant("t1").quota("A100", guaranteed=16),
            a_tenant("lender").quota("A100", guaranteed=24, lend=0),
        )
        .queue(a_gang("guaranteed").gang(2)),
        {"guaranteed": "admitted"},
        id="a-tenant-within-its-guarantee-ignores-lenders",
    ),
    pytest.param(
        a_snapshot()
        .clusters(FOUR_A100_NODES)
        .tenants(a_tenant("t1").budget(100, spent=100), a_tenant("t2").budget(100, spent=99.5))
        .running("r1", tenant="t1", gpus=8)
        .queue(a_gang("spent").tenant("t1"), a_gang("not-yet").tenant("t2")),
        {"spent": "budget_spent", "not-yet": "admitted"},
        id="spent-budget-stops-new-admissions-only",
    ),
    pytest.param(
        a_snapshot()
        .clusters(FOUR_A100_NODES)
        .tenants(a_tenant("org").budget(1000, spent=1200), a_tenant("t1").parent("org"))
        .queue(a_gang("team-job")),
        {"team-job": "budget_spent"},
        id="organisation-budget-stops-its-teams",
    ),
    pytest.param(
        a_snapshot()
        .clusters(FOUR_A100_NODES)
        .tenants(a_tenant("t1").max_priority(100))
        .queue(a_gang("too-high").priority(500), a_gang("allowed").priority(100)),
        {"too-high": "priority_not_allowed", "allowed": "admitted"},
        id="tenant-maximum-priority",
    ),
    pytest.param(
        a_snapshot().clusters(FOUR_A100_NODES).queue(a_gang("intern").priority(500).user_max_priority(100)),
        {"intern": "priority_not_allowed"},
        id="user-maximum-priority",
    ),
    pytest.param(
        a_snapshot()
        .clusters(FOUR_A100_NODES)
        .classes(URGENT)
        .queue(
            a_gang("unapproved").priority(1000).priority_class("urgent"),
            a_gang("expired").priority(1000).priority_class("urgent", approved_until=NOW),
            a_gang("approved").priority(1000).priority_class("urgent", approved_until=NOW + 1),
        ),
        {"unapproved": "approval_required", "expired": "approval_expired", "approved": "admitted"},
        id="urgent-class-needs-an-unexpired-approval",
    ),
]


@pytest.mark.parametrize(("snapshot", "expected"), CASES)
def test_gates_and_quotas(snapshot: SnapshotBuilder, expected: dict[str, str]) -> None:
    assert outcome(plan(snapshot.build(), now=NOW)) == expected


def test_quota_reasons_name_the_tenant_and_the_figures() -> None:
    snapshot = (
        a_snapshot()
        .clusters(FOUR_A100_NODES)
        .tenants(a_tenant("org").quota("A100", guaranteed=8, borrow=4), a_tenant("t1").parent("org"))
        .running("r1", gpus=8)
        .queue(a_gang("j1"))
    )
    (waiting,) = plan(snapshot.build(), now=NOW).waiting
    (reason,) = waiting.reasons
    assert reason.code is WaitCode.BORROWING_LIMIT
    assert (reason.tenant, reason.limit_gpus, reason.held_gpus, reason.needed_gpus) == ("org", 12, 8, 8)
    assert (
        reason.message == "tenant org may borrow 4 GPUs of A100 beyond its 8 guaranteed, holds 8, job needs 8"
    )


def test_budget_reason_says_what_was_spent() -> None:
    snapshot = (
        a_snapshot()
        .clusters(FOUR_A100_NODES)
        .tenants(a_tenant("t1").budget(500, spent=512.5))
        .queue(a_gang("j1"))
    )
    (waiting,) = plan(snapshot.build(), now=NOW).waiting
    assert waiting.reasons[0].message.startswith(
        "tenant t1 has spent 512.5 of its 500 GPU-hour budget this month"
    )


def test_every_gate_that_fails_is_listed() -> None:
    snapshot = (
        a_snapshot()
        .clusters(FOUR_A100_NODES)
        .classes(URGENT)
        .tenants(a_tenant("t1").max_priority(100).budget(1, spent=2))
        .queue(a_gang("j1").priority(1000).priority_class("urgent").user_max_priority(500))
    )
    (waiting,) = plan(snapshot.build(), now=NOW).waiting
    assert [r.code for r in waiting.reasons] == [
        WaitCode.PRIORITY_NOT_ALLOWED,
        WaitCode.PRIORITY_NOT_ALLOWED,
        WaitCode.APPROVAL_REQUIRED,
        WaitCode.BUDGET_SPENT,
    ]


def test_a_blocked_type_falls_back_to_the_next_ordered_type() -> None:
    snapshot = (
        a_snapshot()
        .clusters(a_cluster("c1").pool("H100", nodes=2, price=4.0).pool("A100", nodes=2, price=1.0))
        .tenants(a_tenant("t1").quota("H100", guaranteed=0, borrow=0))
        .queue(a_gang("j1").gpus("H100", "A100"))
    )
    (admission,) = plan(snapshot.build(), now=NOW).admissions
    assert admission.gpu_type == "A100"
