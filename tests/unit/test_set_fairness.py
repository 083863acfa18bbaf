"""What the placer does with a big set beside another tenant's one job (issue 34), case by case.

A set's members reach the placer as ordinary gangs of their tenant: a held member is not a job at
all, and a released one counts like any job. So what a 500-trial sweep weighs in fair share is the
GPUs its trials hold (and, with history on, the GPU-hours they used), never how many are queued;
quotas bound what they hold; and a job within its tenant's guarantee goes ahead of every trial that
would borrow, and reclaims what they borrowed.
"""

from __future__ import annotations

from dataclasses import replace

from placement.fairshare import FairShare
from placement.model import GangRequest, GpuType, PolicyConfig, Snapshot, TenantId, TenantQuota
from placement.plan import plan
from placement.set_affinity import set_key
from tests.unit.placement_builders import SnapshotBuilder, a_cluster, a_gang, a_snapshot, a_tenant

A100 = GpuType("A100")
SWEEP = set_key(TenantId("vision"), "wide-sweep")


def trials(count: int, *, first: int = 0) -> list[GangRequest]:
    """`count` one-GPU trials of vision's sweep, queued before anyone else's job."""
    return [
        replace(a_gang(f"trial-{i}").tenant("vision").gang(1, gpus=1).queued_at(i).build(), job_set=SWEEP)
        for i in range(first, first + count)
    ]


def running_trials(builder: SnapshotBuilder, count: int) -> SnapshotBuilder:
    """`count` of the sweep's trials running on onprem, one GPU each, eight to a node."""
    for i in range(count):
        builder.running(f"ran-{i}", tenant="vision", cluster="onprem", gpus=1, nodes=[("a100", i // 8, 1)])
    return builder


def admitted(snapshot: Snapshot) -> list[str]:
    return [a.job_id for a in plan(snapshot, now=1000.0).admissions]


def test_queued_trials_weigh_nothing_in_fair_share_only_held_gpus_do() -> None:
    tenants = {
        TenantId("vision"): TenantQuota(TenantId("vision")),
        TenantId("nlp"): TenantQuota(TenantId("nlp")),
    }
    held = {(TenantId("vision"), A100): 4}
    fair = FairShare(tenants, held, {A100: 16}, PolicyConfig())
    # The same share with 0 or 500 trials queued: the queue is not an argument at all.
    assert fair.share(TenantId("vision")) == 4 / 16
    assert fair.share(TenantId("nlp")) == 0.0
    with_history = FairShare(
        {
            **tenants,
            TenantId("vision"): TenantQuota(TenantId("vision"), usage_history_gpu_hours=((A100, 96.0),)),
        },
        held,
        {A100: 16},
        PolicyConfig(fair_share_history=True, history_horizon_h=24.0),
    )
    # With history on, the GPU-hours the set's trials used count: 96 over 24 h is 4 GPUs more.
    assert with_history.share(TenantId("vision")) == 8 / 16


def test_a_job_within_its_guarantee_goes_before_500_borrowing_trials() -> None:
    snapshot = (
        running_trials(
            a_snapshot()
            .clusters(a_cluster("onprem").pool("A100", free=(0, 8), name="a100", gpus_per_node=8))
            .tenants(a_tenant("vision"), a_tenant("nlp").quota("A100", guaranteed=8)),
            8,
        )
        .queue(*trials(500), a_gang("eval").tenant("nlp").gang(8, gpus=1).queued_at(10_000))
        .build()
    )
    assert admitted(snapshot)[0] == "eval"
    assert len(admitted(snapshot)) == 1


def test_without_guarantees_the_lower_share_goes_first_however_deep_the_other_queue() -> None:
    snapshot = (
        running_trials(
            a_snapshot()
            .clusters(a_cluster("onprem").pool("A100", free=(0, 2), name="a100", gpus_per_node=8))
            .tenants(a_tenant("vision"), a_tenant("nlp")),
            8,
        )
        .queue(*trials(500), a_gang("eval").tenant("nlp").gang(1, gpus=1).queued_at(10_000))
        .build()
    )
    assert admitted(snapshot) == ["eval", "trial-0"]


def test_a_job_within_its_guarantee_reclaims_what_the_trials_borrowed() -> None:
    """The cluster is full of trials: the placer orders eight of them evicted for nlp's job, and no
    queued trial is admitted meanwhile."""
    snapshot = (
        running_trials(
            a_snapshot()
            .clusters(a_cluster("onprem").pool("A100", free=(0, 0), name="a100", gpus_per_node=8))
            .tenants(a_tenant("vision"), a_tenant("nlp").quota("A100", guaranteed=8)),
            16,
        )
        .queue(*trials(500), a_gang("eval").tenant("nlp").gang(8, gpus=1).queued_at(10_000))
        .build()
    )
    result = plan(snapshot, now=1000.0)
    assert result.admissions == ()
    victims = {p.victim for p in result.preemptions}
    assert len(victims) == 8
    assert all(v.startswith("ran-") for v in victims)
    assert {p.for_job for p in result.preemptions} == {"eval"}


def test_a_cap_bounds_what_a_sets_trials_hold_whatever_their_number() -> None:
    snapshot = (
        a_snapshot()
        .clusters(a_cluster("onprem").pool("A100", nodes=2))
        .tenants(a_tenant("vision").cap("A100", 6))
        .queue(*trials(500))
        .build()
    )
    assert len(admitted(snapshot)) == 6
