"""A job set's trials kept together where their data is (issue 34, `placement.set_affinity`).

A store where a set-mate reading the same dataset is placed counts as holding a copy of it, for that
set's gangs only: in the same cycle (the plan's own admissions) and across cycles (the snapshot's
placed members). It is a cost, not a rule, and it never crosses sets or tenants.
"""

from __future__ import annotations

import random
from dataclasses import replace

from federation.scheduling.snapshot import PlacerInputs, build_snapshot, gang_request
from federation.spec.jobspec import DatasetRef
from federation.store.jobs import JobPlacement, JobRecord, Owner
from federation.store.records import DatasetLocation, SchedulingSettings, TenantRecord
from placement.model import CapacityKind, ClusterName, GangRequest, GpuType, JobPhase, TenantId
from placement.plan import plan
from placement.set_affinity import SetStores, affinity_key, set_key
from tests.conftest import build_job
from tests.unit.placement_builders import GangBuilder, a_cluster, a_gang, a_snapshot, shuffled

GB = 10**9
HOME = "home-s3"


def trial(job_id: str, *, gpus: int = 1, tenant: str = "vision", job_set: str = "lr-sweep") -> GangBuilder:
    """One trial of a set reading `imagenet`: 100 GB at home, an hour of work per GPU."""
    return a_gang(job_id).tenant(tenant).gang(1, gpus=gpus).dataset(100 * GB, HOME).runtime(expected_s=3600)


def with_set(gang: GangBuilder, tenant: str = "vision", job_set: str = "lr-sweep") -> GangRequest:
    return replace(gang.build(), dataset="imagenet", job_set=set_key(TenantId(tenant), job_set))


def where(result_admissions: tuple[object, ...]) -> dict[str, str]:
    return {a.job_id: a.cluster for a in result_admissions}  # type: ignore[attr-defined]


def test_a_trial_follows_its_set_mate_into_the_store_it_staged_rather_than_a_cheaper_cluster_elsewhere() -> (
    None
):
    """In one cycle: the 2-GPU trial fits only on `near` and stages the dataset into s1; the 1-GPU
    trial would be cheaper on `far` by GPU price (1.5 against 2.0 an hour) but there it moves the
    dataset again ($1 of egress): beside its set-mate it moves nothing."""
    snapshot = (
        a_snapshot()
        .clusters(
            a_cluster("near").store("s1").pool("A100", price=2.0, free=(3,)),
            a_cluster("far").store("s2").pool("A100", price=1.5, free=(1,)),
        )
        .egress(HOME, "s1", 0.01)
        .egress(HOME, "s2", 0.01)
        .queue(with_set(trial("big", gpus=2).queued_at(0)), with_set(trial("small").queued_at(1)))
        .build()
    )
    assert where(plan(snapshot, now=10).admissions) == {"big": "near", "small": "near"}
    # Not of one set (the second in another set, or in none), the small one goes where it is cheapest.
    for other in (
        with_set(trial("small").queued_at(1), job_set="other"),
        trial("small").queued_at(1).build(),
    ):
        alone = replace(snapshot, queued=(snapshot.queued[0], other))
        assert where(plan(alone, now=10).admissions) == {"big": "near", "small": "far"}


def test_the_same_set_name_in_another_tenant_is_another_set() -> None:
    snapshot = (
        a_snapshot()
        .clusters(
            a_cluster("near").store("s1").pool("A100", price=2.0, free=(3,)),
            a_cluster("far").store("s2").pool("A100", price=1.5, free=(1,)),
        )
        .egress(HOME, "s1", 0.01)
        .egress(HOME, "s2", 0.01)
        .queue(
            with_set(trial("big", gpus=2).queued_at(0)),
            with_set(trial("theirs", tenant="nlp").queued_at(1), tenant="nlp"),
        )
        .build()
    )
    assert where(plan(snapshot, now=10).admissions) == {"big": "near", "theirs": "far"}


def test_a_cheaper_place_by_more_than_the_move_still_wins() -> None:
    """Counting the set-mate's store as a copy is a cost: a cluster cheaper by more than the egress
    and wait of another copy takes the trial."""
    snapshot = (
        a_snapshot()
        .clusters(
            a_cluster("near").store("s1").pool("A100", price=4.0, free=(3,)),
            a_cluster("far").store("s2").pool("A100", price=1.0, free=(1,)),
        )
        .egress(HOME, "s1", 0.01)
        .egress(HOME, "s2", 0.01)
        .queue(with_set(trial("big", gpus=2).queued_at(0)), with_set(trial("small").queued_at(1)))
        .build()
    )
    assert where(plan(snapshot, now=10).admissions) == {"big": "near", "small": "far"}


def test_the_plan_is_the_same_whatever_the_order_of_the_snapshot() -> None:
    gangs = [with_set(trial(f"t{i}", gpus=1 + i % 3).queued_at(i)) for i in range(12)]
    gangs += [with_set(trial(f"o{i}", gpus=1).queued_at(i), job_set="other") for i in range(6)]
    snapshot = (
        a_snapshot()
        .clusters(
            a_cluster("a").store("s1").pool("A100", price=2.0, free=(3, 5)),
            a_cluster("b").store("s2").pool("A100", price=1.8, free=(4, 2)),
            a_cluster("c").store("s3").pool("A100", price=1.9, free=(8,)),
        )
        .egress(HOME, "s1", 0.01)
        .egress(HOME, "s2", 0.02)
        .queue(*gangs)
        .build()
    )
    first = plan(snapshot, now=10)
    rng = random.Random(34)
    for _ in range(5):
        assert plan(shuffled(snapshot, rng), now=10) == first


def test_set_stores_widen_only_their_own_sets_gangs() -> None:
    mine = with_set(trial("t1"))
    stores = SetStores([(("vision/lr-sweep", "imagenet"), "s1"), (("nlp/lr-sweep", "imagenet"), "s9")])
    assert stores.widened(mine).dataset_cached_in == ("s1",)
    assert affinity_key(mine) == ("vision/lr-sweep", "imagenet")
    # No set, another dataset, or nothing placed: the very same request.
    for gang in (trial("t2").build(), replace(mine, dataset="coco"), replace(mine, job_set="vision/other")):
        assert stores.widened(gang) is gang
    assert SetStores().widened(mine) is mine
    # The home store or a recorded copy adds nothing.
    assert SetStores([(("vision/lr-sweep", "imagenet"), HOME)]).widened(mine) is mine


# ---- across cycles: the snapshot counts where the set's members are placed now.

A100 = GpuType("A100")


def _inputs() -> PlacerInputs:
    return PlacerInputs(
        settings=SchedulingSettings(datasets=(DatasetLocation("vision/imagenet", HOME, 100 * GB),)),
        tenants=(TenantRecord(TenantId("vision")), TenantRecord(TenantId("nlp"))),
        users={},
        approvals=(),
    )


def _member(job_id: str, *, tenant: str = "vision", job_set: str = "lr-sweep") -> JobRecord:
    job = build_job(job_id, tenant=tenant, gpus=1, gpu="A100")
    return replace(job, job_set=job_set, spec=replace(job.spec, dataset=DatasetRef("imagenet")))


def _placed(job: JobRecord, cluster: str, phase: JobPhase = JobPhase.ADMITTED) -> JobRecord:
    admitted = job.transition(
        JobPhase.ADMITTED,
        by=Owner.SCHEDULER,
        at_s=1.0,
        placement=JobPlacement(ClusterName(cluster), A100, CapacityKind.PRIVATE, 2.0),
    )
    if phase is JobPhase.ADMITTED:
        return admitted
    return admitted.transition(phase, by=Owner.DISPATCHER, at_s=2.0)


CLUSTERS = (
    a_cluster("near").store("s1").pool("A100", price=2.0, free=(6,)).build(),
    a_cluster("far").store("s2").pool("A100", price=2.0, free=(1,)).build(),
)


def test_a_queued_trial_counts_the_store_its_set_mate_is_staging_into_as_holding_the_dataset() -> None:
    """The staging set-mate's copy is not recorded yet, so both stores are equally far by the
    registry; `far` packs tighter and took the trial before. Now it goes beside its set-mate."""
    staging = _placed(_member("t1"), "near", JobPhase.STAGING)
    queued = _member("t2")
    snapshot = build_snapshot([staging, queued], _inputs(), CLUSTERS)
    (request,) = snapshot.queued
    assert request.job_set == "vision/lr-sweep"
    assert request.dataset_cached_in == ("s1",)
    assert where(plan(snapshot, now=10).admissions) == {"t2": "near"}
    # Without the set-mate the tighter cluster takes it.
    alone = build_snapshot([queued], _inputs(), CLUSTERS)
    assert alone.queued == (gang_request(queued, _inputs()),)
    assert where(plan(alone, now=10).admissions) == {"t2": "far"}


def test_another_tenants_set_of_the_same_name_teaches_nothing_about_where_data_is() -> None:
    """nlp's "lr-sweep" runs on `near`: vision's queued trial of its own "lr-sweep" is placed as if
    nothing ran (and so learns nothing from where it lands), and so is a member that has ended."""
    theirs = _placed(_member("n1", tenant="nlp"), "near", JobPhase.STAGING)
    ended = _placed(_member("t0"), "near").transition(JobPhase.CANCELLED, by=Owner.DISPATCHER, at_s=3.0)
    queued = _member("t2")
    snapshot = build_snapshot([theirs, ended, queued], _inputs(), CLUSTERS)
    (request,) = snapshot.queued
    assert request.dataset_cached_in == ()
    assert where(plan(snapshot, now=10).admissions) == {"t2": "far"}
