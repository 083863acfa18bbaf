"""Fair share among tenants of equal priority: weighted dominant-resource fairness, with optional history."""

from __future__ import annotations

import pytest

from placement.plan import plan
from tests.unit.placement_builders import SnapshotBuilder, a_cluster, a_gang, a_snapshot, a_tenant

ONE_NODE_EACH = (
    a_cluster("c1").pool("A100", nodes=5, free=(8, 0, 0, 0, 0)).pool("H100", nodes=4, free=(0,) * 4)
)


def first_admitted(snapshot: SnapshotBuilder) -> str:
    result = plan(snapshot.build(), now=0.0)
    return result.admissions[0].job_id


CASES = [
    pytest.param(
        a_snapshot()
        .clusters(ONE_NODE_EACH)
        .running("r1", tenant="hog", gpus=8)
        .queue(
            a_gang("hog-job").tenant("hog").queued_at(0), a_gang("light-job").tenant("light").queued_at(5)
        ),
        "light-job",
        id="lower-dominant-share-goes-first-even-if-queued-later",
    ),
    pytest.param(
        a_snapshot()
        .clusters(ONE_NODE_EACH)
        .tenants(a_tenant("heavy").weight(2.0), a_tenant("light"))
        # heavy: 16 of 40 A100 at weight 2 = 0.2; light: 10 of 40 at weight 1 = 0.25.
        .running("r1", tenant="heavy", gpus=16)
        .running("r2", tenant="light", gpus=10)
        .queue(
            a_gang("light-job").tenant("light").queued_at(0), a_gang("heavy-job").tenant("heavy").queued_at(5)
        ),
        "heavy-job",
        id="weight-divides-the-share",
    ),
    pytest.param(
        a_snapshot()
        .clusters(ONE_NODE_EACH)
        # a: 8 of 40 A100 (0.2); b: 8 of 32 H100 (0.25) - the dominant resource decides.
        .running("ra", tenant="a", gpus=8)
        .running("rb", tenant="b", gpu="H100", gpus=8)
        .queue(a_gang("b-job").tenant("b").queued_at(0), a_gang("a-job").tenant("a").queued_at(5)),
        "a-job",
        id="dominant-resource-across-gpu-types",
    ),
    pytest.param(
        a_snapshot()
        .clusters(ONE_NODE_EACH)
        .tenants(a_tenant("yesterday").history("A100", 24 * 40), a_tenant("fresh"))
        .policy(fair_share_history=True)
        .queue(a_gang("y").tenant("yesterday").queued_at(0), a_gang("f").tenant("fresh").queued_at(5)),
        "f",
        id="history-counts-when-on-so-yesterdays-hog-waits",
    ),
    pytest.param(
        a_snapshot()
        .clusters(ONE_NODE_EACH)
        .tenants(a_tenant("yesterday").history("A100", 24 * 40), a_tenant("fresh"))
        .queue(a_gang("y").tenant("yesterday").queued_at(0), a_gang("f").tenant("fresh").queued_at(5)),
        "y",
        id="history-ignored-when-off",
    ),
    pytest.param(
        a_snapshot()
        .clusters(ONE_NODE_EACH)
        .running("r1", tenant="hog", gpus=16)
        .queue(a_gang("hog-urgent").tenant("hog").priority(10), a_gang("light-job").tenant("light")),
        "hog-urgent",
        id="priority-comes-before-fair-share",
    ),
    pytest.param(
        a_snapshot()
        .clusters(ONE_NODE_EACH)
        .queue(a_gang("b-early").tenant("b").queued_at(1), a_gang("a-late").tenant("a").queued_at(2)),
        "b-early",
        id="equal-shares-fall-back-to-queue-time",
    ),
    pytest.param(
        a_snapshot()
        .clusters(ONE_NODE_EACH)
        .tenants(a_tenant("owner").quota("A100", guaranteed=8), a_tenant("borrower").quota("A100", borrow=8))
        .queue(
            a_gang("borrower-high").tenant("borrower").priority(10).queued_at(0),
            a_gang("owner-low").tenant("owner").queued_at(5),
        ),
        "owner-low",
        # Else a borrower evicted to honour a guarantee would take the GPUs back at once, forever.
        id="a-gang-within-its-guarantee-goes-before-one-that-borrows-whatever-its-priority",
    ),
    pytest.param(
        a_snapshot()
        .clusters(ONE_NODE_EACH)
        .tenants(a_tenant("t").quota("A100", guaranteed=8))
        .queue(
            a_gang("small-low").tenant("t").gang(1, gpus=4).queued_at(0),
            a_gang("big-high").tenant("t").priority(10).queued_at(5),
        ),
        "big-high",
        id="within-a-tenant-priority-still-comes-first",
    ),
]


@pytest.mark.parametrize(("snapshot", "expected"), CASES)
def test_who_goes_first(snapshot: SnapshotBuilder, expected: str) -> None:
    assert first_admitted(snapshot) == expected


def test_shares_move_with_each_admission_so_tenants_alternate() -> None:
    snapshot = (
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", nodes=8))
        .queue(
            *(a_gang(f"a{i}").tenant("a").gang(1, gpus=4).queued_at(i) for i in range(4)),
            *(a_gang(f"b{i}").tenant("b").gang(1, gpus=4).queued_at(10 + i) for i in range(4)),
        )
    )
    order = [a.job_id for a in plan(snapshot.build(), now=0.0).admissions]
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"]
