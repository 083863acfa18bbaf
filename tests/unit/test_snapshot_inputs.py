"""What federation hands the placer: usage from job history, approvals, classes, datasets, nodes."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from clusters.api import GangPhase, GangStatus
from federation.ledger.usage import month_start_s, tenant_usage
from federation.scheduling.snapshot import GangRequests, PlacerInputs, build_snapshot, gang_request
from federation.spec.jobspec import DatasetRef
from federation.store.intervals import ClusterSite, LedgerInterval, ledger_update
from federation.store.jobs import JobPlacement, JobRecord, Owner, PreemptionOrder
from federation.store.records import (
    ApprovalRecord,
    DatasetLocation,
    Role,
    SchedulingSettings,
    TenantRecord,
    UserRecord,
)
from placement.model import (
    CapacityKind,
    ClusterName,
    GpuQuota,
    GpuType,
    JobId,
    JobPhase,
    PolicyConfig,
    TenantId,
)
from tests.conftest import build_job

A100 = GpuType("A100")
VISION = TenantId("vision")
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC).timestamp()


def _ledger(*histories: list[JobRecord]) -> list[LedgerInterval]:
    """The ledger the reconciler would have written for each job's successive records."""
    entries: dict[bytes, LedgerInterval] = {}
    for history in histories:
        for before, after in itertools.pairwise(history):
            entry = ledger_update(
                before,
                after,
                site=ClusterSite("private", "dc1"),
                started_at_s=None,
                finished_at_s=after.events[-1].at_s,
                now_s=after.events[-1].at_s,
            )
            if entry is not None:
                entries[entry.key] = entry
    return list(entries.values())


def _ran(
    job: JobRecord, start: float, end: float | None, *, to: JobPhase = JobPhase.SUCCEEDED
) -> list[JobRecord]:
    placed = job.transition(
        JobPhase.ADMITTED,
        by=Owner.SCHEDULER,
        at_s=start - 1,
        placement=JobPlacement(ClusterName("onprem"), A100, CapacityKind.PRIVATE, 1.1),
    )
    dispatched = placed.transition(JobPhase.DISPATCHED, by=Owner.DISPATCHER, at_s=start - 0.5)
    running = dispatched.transition(JobPhase.RUNNING, by=Owner.STATUS, at_s=start)
    if end is None:
        return [job, placed, dispatched, running]
    return [job, placed, dispatched, running, running.transition(to, by=Owner.STATUS, at_s=end)]


def _job(job_id: str, gpus: int = 4) -> JobRecord:
    return build_job(job_id, tenant="vision", gpus=gpus, replicas=1, gpu="A100")


def test_month_usage_counts_only_started_time_this_month_and_running_jobs_up_to_now() -> None:
    month = month_start_s(NOW)
    assert month == datetime(2026, 11, 1, tzinfo=UTC).timestamp()
    ledger = _ledger(
        _ran(_job("done"), NOW - 7200, NOW - 3600),  # 4 GPUs x 1 h
        _ran(_job("running", gpus=8), NOW - 1800, None),  # 8 GPUs x 0.5 h so far
        _ran(_job("across", gpus=2), month - 3600, month + 3600),  # only the hour inside the month
        [_job("never-started")],
    )
    assert len(ledger) == 3
    usage = tenant_usage(ledger, now_s=NOW, half_life_h=24)
    assert usage[VISION].month_gpu_hours == pytest.approx(4 + 4 + 2)


def test_decayed_history_halves_per_half_life() -> None:
    recent = tenant_usage(_ledger(_ran(_job("r"), NOW - 3600, NOW)), now_s=NOW, half_life_h=24)
    old = tenant_usage(_ledger(_ran(_job("o"), NOW - 25 * 3600, NOW - 24 * 3600)), now_s=NOW, half_life_h=24)
    recent_h = dict(recent[VISION].decayed_gpu_hours)[A100]
    old_h = dict(old[VISION].decayed_gpu_hours)[A100]
    assert recent_h == pytest.approx(4.0, rel=0.02)
    assert old_h == pytest.approx(recent_h / 2, rel=1e-6)


def test_a_requeued_attempt_counts_until_its_requeue() -> None:
    history = _ran(_job("p"), NOW - 3600, None)
    requeued = history[-1].transition(
        JobPhase.QUEUED, by=Owner.STATUS, at_s=NOW - 1800, attempt=2, placement=None
    )
    usage = tenant_usage(_ledger([*history, requeued]), now_s=NOW, half_life_h=24)
    assert usage[VISION].month_gpu_hours == pytest.approx(4 * 0.5)


def _inputs(**changes: object) -> PlacerInputs:
    inputs = PlacerInputs(
        settings=SchedulingSettings(
            gpu_speeds=((GpuType("H100"), 2.0),),
            datasets=(DatasetLocation("imagenet@2012", "onprem-s3", 150 * 2**30),),
        ),
        tenants=(
            TenantRecord(
                VISION,
                quotas=(GpuQuota(A100, guaranteed_gpus=16, cap_gpus=32),),
                weight=2.0,
                monthly_budget_gpu_hours=1000.0,
                max_priority_class="high",
            ),
        ),
        users={"alice": UserRecord("alice", VISION, Role.MEMBER, max_priority_class="normal")},
        approvals=(),
    )
    return replace(inputs, **changes)  # type: ignore[arg-type]


def test_a_request_carries_the_users_limit_the_approval_the_dataset_and_the_speeds() -> None:
    job = _job("j")
    job = replace(
        job, spec=replace(job.spec, priority_class="urgent", dataset=DatasetRef("imagenet", "2012"))
    )
    approvals = (
        ApprovalRecord("a1", VISION, "urgent", NOW + 3600, "CVPR", "admin", NOW, user="alice"),
        ApprovalRecord("a2", VISION, "urgent", NOW + 7200, "team-wide", "admin", NOW),
        ApprovalRecord("a3", VISION, "urgent", NOW + 9999, "someone else", "admin", NOW, user="bob"),
        ApprovalRecord("a4", TenantId("nlp"), "urgent", NOW + 9999, "other team", "admin", NOW),
    )
    request = gang_request(job, _inputs(approvals=approvals))
    assert request.priority_class == "urgent"
    assert request.user_max_priority == 1000  # alice: at most "normal"
    assert request.approval_expires_at_s == NOW + 7200  # the latest that covers alice's job
    assert (request.dataset_store, request.dataset_size_bytes) == ("onprem-s3", 150 * 2**30)
    # The config's speed, which covers the family's variants; types it does not name take the registry's.
    speeds = dict(request.gpu_speeds)
    assert (speeds[GpuType("H100")], speeds[GpuType("H100-PCIE")], speeds[GpuType("L4")]) == (2.0, 2.0, 0.35)
    assert gang_request(job, _inputs()).approval_expires_at_s is None


def test_requests_are_rebuilt_when_the_inputs_change_version() -> None:
    job = _job("j")
    cache = GangRequests()
    first = cache.get(job, _inputs())
    assert cache.get(job, _inputs()) is first
    approved = _inputs(
        approvals=(ApprovalRecord("a", VISION, "normal", NOW + 60, "x", "admin", NOW),), version=1
    )
    assert cache.get(job, approved) is not first


def test_the_snapshot_has_quotas_with_usage_classes_policy_and_running_gangs_with_their_nodes() -> None:
    from federation.ledger.usage import TenantUsage
    from placement.model import NodeShare

    running = _ran(_job("r", gpus=8), NOW - 600, None)[-1]
    evicting = replace(
        _ran(_job("e"), NOW - 600, None)[-1],
        preemption=PreemptionOrder(JobId("x"), "lower_priority", 30.0, NOW, 1000.0),
    )
    queued = _job("q")
    status = GangStatus(
        JobId("r"), 1, GangPhase.RUNNING, started_at_s=NOW - 600, nodes=(NodeShare("a100", 0, 8),)
    )
    snapshot = build_snapshot(
        [running, evicting, queued],
        _inputs(settings=replace(_inputs().settings, policy=PolicyConfig(preemption_limit_gpus=64))),
        [],
        statuses={ClusterName("onprem"): {(JobId("r"), 1): status}},
        usage={VISION: TenantUsage(12.5, ((A100, 3.0),))},
        preempted_gpus_this_interval=16,
    )
    assert [q.job_id for q in snapshot.queued] == ["q"]
    gangs = {g.job_id: g for g in snapshot.running}
    assert gangs[JobId("r")].ends_at_s == NOW - 600 + 3600
    assert gangs[JobId("r")].nodes == (NodeShare("a100", 0, 8),)
    assert not gangs[JobId("r")].terminating
    assert gangs[JobId("e")].terminating
    # The order counts for the gang it was given for until the victim is requeued.
    assert gangs[JobId("e")].evicted_for == "x"
    assert gangs[JobId("r")].evicted_for is None
    (tenant,) = snapshot.tenants
    assert tenant.spent_gpu_hours == 12.5
    assert tenant.usage_history_gpu_hours == ((A100, 3.0),)
    assert tenant.max_priority == 10_000
    assert tenant.weight == 2.0
    assert [c.name for c in snapshot.priority_classes] == ["low", "normal", "high", "urgent"]
    assert snapshot.policy.preemption_limit_gpus == 64
    assert snapshot.policy.preempted_gpus_this_interval == 16


def test_a_running_gang_is_movable_only_if_its_manifest_says_it_resumes_and_it_runs() -> None:
    cloud = JobPlacement(ClusterName("aws"), A100, CapacityKind.ON_DEMAND, 4.1)

    def on_cloud(job_id: str, *, resumable: bool, phase: JobPhase = JobPhase.RUNNING) -> JobRecord:
        job = _job(job_id, gpus=8)
        return replace(job, spec=replace(job.spec, resumable=resumable), phase=phase, placement=cloud)

    jobs = [
        on_cloud("says", resumable=True),
        on_cloud("silent", resumable=False),
        on_cloud("starting", resumable=True, phase=JobPhase.DISPATCHED),
    ]
    statuses = {
        (JobId(j.job_id), 1): GangStatus(JobId(j.job_id), 1, GangPhase.RUNNING, started_at_s=NOW - 60)
        for j in jobs
    }
    snapshot = build_snapshot(jobs, _inputs(), [], statuses={ClusterName("aws"): statuses})
    gangs = {g.job_id: g for g in snapshot.running}
    says = gangs[JobId("says")]
    assert says.movable
    # What the move rule reads: where and at what price it runs, its shape and when it started.
    assert (says.kind, says.usd_per_gpu_hour) == (CapacityKind.ON_DEMAND, 4.1)
    # A family accepts a pool of its bare name and each of its variants.
    variants = (A100, GpuType("A100-40GB"), GpuType("A100-80GB"))
    assert (says.replica_gpus, says.gpu_types, says.started_at_s) == ((8,), variants, NOW - 60)
    assert not gangs[JobId("silent")].movable
    assert not gangs[JobId("starting")].movable


def test_an_organisations_month_includes_its_teams_for_its_budget() -> None:
    ledger = _ledger(_ran(_job("team-job"), NOW - 3600, NOW))
    usage = tenant_usage(
        ledger,
        now_s=NOW,
        half_life_h=24,
        parents={VISION: TenantId("research"), TenantId("research"): None},
    )
    assert usage[TenantId("research")].month_gpu_hours == pytest.approx(4.0)
    assert usage[VISION].month_gpu_hours == pytest.approx(4.0)
    # Fair share stays per team: the organisation has no history of its own.
    assert usage[TenantId("research")].decayed_gpu_hours == ()


def _placed(phase: JobPhase, replicas: int = 2) -> JobRecord:
    job = build_job("d", gpus=4, replicas=replicas, gpu="A100", phase=phase)
    placement = JobPlacement(ClusterName("onprem"), A100, CapacityKind.PRIVATE, 1.1)
    return replace(job, placement=placement)


def _seen(phase: GangPhase, bound_gpus: int | None) -> GangStatus:
    return GangStatus(JobId("d"), 1, phase, bound_gpus=bound_gpus)


@pytest.mark.parametrize(
    ("phase", "answered", "status", "held_back"),
    [
        pytest.param(JobPhase.ADMITTED, True, None, (4, 4), id="admitted-not-on-the-cluster-yet"),
        pytest.param(JobPhase.STAGING, True, None, (4, 4), id="staging-not-on-the-cluster-yet"),
        pytest.param(JobPhase.DISPATCHED, True, None, (4, 4), id="dispatched-not-seen-by-the-watch-yet"),
        # The reconciler writes DISPATCHED after the cluster took the gang: a record read as admitted
        # can have its pods bound already, and the inventory counts those.
        pytest.param(
            JobPhase.ADMITTED, True, _seen(GangPhase.PENDING, 4), (4,), id="admitted-record-gang-half-bound"
        ),
        pytest.param(
            JobPhase.ADMITTED, True, _seen(GangPhase.RUNNING, 8), (), id="admitted-record-gang-all-bound"
        ),
        pytest.param(
            JobPhase.STAGING, True, _seen(GangPhase.PENDING, 0), (4, 4), id="staging-record-gang-unbound"
        ),
        pytest.param(
            JobPhase.ADMITTED,
            True,
            _seen(GangPhase.RUNNING, None),
            (),
            id="admitted-record-on-a-backend-that-accounts-gangs-at-once",
        ),
        pytest.param(
            JobPhase.ADMITTED,
            True,
            _seen(GangPhase.CANCELLED, None),
            (4, 4),
            id="admitted-pods-seen-before-their-gang-object",
        ),
        pytest.param(
            JobPhase.ADMITTED, False, None, (4, 4), id="admitted-to-a-silent-cluster-still-promised"
        ),
        pytest.param(
            JobPhase.DISPATCHED, True, _seen(GangPhase.PENDING, 0), (4, 4), id="dispatched-pods-unbound"
        ),
        pytest.param(
            JobPhase.DISPATCHED, True, _seen(GangPhase.PENDING, 4), (4,), id="dispatched-half-bound"
        ),
        pytest.param(JobPhase.DISPATCHED, True, _seen(GangPhase.PENDING, 8), (), id="dispatched-all-bound"),
        pytest.param(
            JobPhase.RUNNING,
            True,
            _seen(GangPhase.RUNNING, 0),
            (4, 4),
            id="running-by-the-gang-object-before-the-pod-watch-shows-its-pods",
        ),
        pytest.param(JobPhase.RUNNING, True, _seen(GangPhase.RUNNING, 8), (), id="running-and-bound"),
        pytest.param(
            JobPhase.DISPATCHED, True, _seen(GangPhase.SUCCEEDED, 0), (), id="dispatched-already-finished"
        ),
        pytest.param(
            JobPhase.DISPATCHED,
            True,
            _seen(GangPhase.RUNNING, None),
            (),
            id="a-backend-that-accounts-gangs-at-once",
        ),
        pytest.param(JobPhase.DISPATCHED, False, None, (), id="cluster-silent-nothing-to-protect"),
        pytest.param(JobPhase.RUNNING, True, None, (), id="running-gang-vanished-is-the-reconcilers"),
    ],
)
def test_gpus_promised_but_not_yet_in_the_inventory_are_held_back(
    phase: JobPhase, answered: bool, status: GangStatus | None, held_back: tuple[int, ...]
) -> None:
    from federation.scheduling.snapshot import unbound_replica_gpus

    assert unbound_replica_gpus(_placed(phase), answered, status) == held_back


def test_a_dispatched_gang_whose_pods_are_not_bound_keeps_its_gpus_out_of_the_next_cycle() -> None:
    from placement.model import ClusterState, NodePool, Provider

    cluster = ClusterState(
        name=ClusterName("onprem"),
        provider=Provider.PRIVATE,
        region="dc1",
        pools=(NodePool("a100", A100, CapacityKind.PRIVATE, 1.1, 8, (8, 8)),),
    )
    dispatched = _placed(JobPhase.DISPATCHED)
    unbound = build_snapshot(
        [dispatched],
        _inputs(),
        [cluster],
        statuses={ClusterName("onprem"): {(JobId("d"), 1): _seen(GangPhase.PENDING, 0)}},
    )
    bound = build_snapshot(
        [dispatched],
        _inputs(),
        [cluster],
        statuses={ClusterName("onprem"): {(JobId("d"), 1): _seen(GangPhase.PENDING, 8)}},
    )
    assert sum(unbound.clusters[0].pools[0].free_gpus_per_node) == 8
    assert bound.clusters[0].pools[0].free_gpus_per_node == (8, 8)
