"""From federation's records to the placer's `Snapshot`: jobs, tenants, settings, approvals, clusters.

Pure: the scheduler reads everything (job cache, etcd records, cluster inventories and statuses),
and this module turns it into the placer's values. A queued job's `GangRequest` depends on the job
record and on the inputs (settings, users, approvals), so it is rebuilt only when one of them
changes; with thousands queued, rebuilding every request each cycle cost as much as planning them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from clusters.api import GangStatus
from federation.datasets.outputs import awaited_inputs
from federation.ledger.usage import TenantUsage
from federation.spec.jobspec import TrainingJobSpec
from federation.store.jobs import JobRecord
from federation.store.records import ApprovalRecord, SchedulingSettings, TenantRecord, UserRecord
from placement.model import (
    CapacityKind,
    ClusterName,
    ClusterState,
    GangRequest,
    GpuType,
    GpuTypePolicy,
    JobId,
    JobPhase,
    NodeShare,
    RunningGang,
    Snapshot,
    TenantId,
)
from placement.reserve import PendingGang, reserve_pending
from placement.set_affinity import SetStores, set_key

_PENDING_PHASES = frozenset({JobPhase.ADMITTED, JobPhase.STAGING})

GangKey = tuple[JobId, int]


@dataclass(frozen=True, slots=True)
class PlacerInputs:
    """What a cycle needs besides jobs and clusters. `version` changes whenever any part does."""

    settings: SchedulingSettings
    tenants: tuple[TenantRecord, ...]
    users: Mapping[str, UserRecord]
    approvals: tuple[ApprovalRecord, ...]
    version: int = 0


def approval_expiry(job: JobRecord, approvals: Sequence[ApprovalRecord]) -> float | None:
    """When the latest approval that covers the job's class expires (None: no approval)."""
    ends = [a.expires_at_s for a in approvals if a.covers(job.tenant, job.user, job.spec.priority_class)]
    return max(ends) if ends else None


def accepted_types(spec: TrainingJobSpec, settings: SchedulingSettings) -> tuple[GpuType, ...]:
    """The GPU types the placer may give the job: each family it names stands for its bare name (a
    pool configured as the family) and its variants, every type with the memory it asks for."""
    return settings.gpu_registry().expand(spec.gpu_types, spec.min_gpu_memory_gib)


def uniform(spec: TrainingJobSpec) -> bool:
    """Whether every replica runs the same pod, as an Indexed Job needs (`manifests.uniform_replica`)."""
    first = spec.tasks[0]
    key = (first.gpus_per_replica, first.image, first.command, first.env, first.template, first.shm_size)
    return all(
        (t.gpus_per_replica, t.image, t.command, t.env, t.template, t.shm_size) == key for t in spec.tasks
    )


_speeds_for: dict[tuple[object, ...], tuple[tuple[GpuType, float], ...]] = {}


def gpu_speeds(settings: SchedulingSettings) -> tuple[tuple[GpuType, float], ...]:
    """Speeds by type: the config's `gpuSpeeds` first, a family's covering its variants, then the
    registry's for every type the config does not name."""
    key = (settings.gpu_speeds, settings.gpu_types)
    found = _speeds_for.get(key)
    if found is None:
        registry = settings.gpu_registry()
        speeds = dict(settings.gpu_speeds)
        for name in registry.names():
            if name not in speeds:
                family = speeds.get(registry.family_of(name))
                speeds[name] = family if family is not None else registry.speed(name) or 1.0
        found = tuple(sorted(speeds.items()))
        if len(_speeds_for) > 8:
            _speeds_for.clear()
        _speeds_for[key] = found
    return found


def gang_request(job: JobRecord, inputs: PlacerInputs) -> GangRequest:
    settings = inputs.settings
    values = settings.class_values()
    user = inputs.users.get(job.user)
    user_max = None
    if user is not None and user.max_priority_class is not None:
        user_max = values.get(user.max_priority_class)
    # The registry's locations name `tenant/name`: a bare name is the job's tenant's dataset. Only a
    # reference the registry does not know falls back to the config's `datasets:` entry as written.
    ref = job.spec.dataset
    dataset = None
    if ref is not None:
        owned = ref.name if "/" in ref.name else f"{job.tenant}/{ref.name}"
        tail = "" if ref.version is None else f"@{ref.version}"
        dataset = settings.dataset(owned + tail) or settings.dataset(str(ref))
    return replace(
        job.gang_request(),
        priority_class=job.spec.priority_class,
        user_max_priority=user_max,
        approval_expires_at_s=approval_expiry(job, inputs.approvals),
        deadline_at_s=job.spec.deadline_s,
        max_wait_s=None if job.spec.max_wait_s is None else float(job.spec.max_wait_s),
        dataset_size_bytes=0 if dataset is None else dataset.size_bytes,
        dataset_store=None if dataset is None else dataset.store,
        dataset_cached_in=() if dataset is None else dataset.cached_in,
        gpu_speeds=gpu_speeds(settings),
        gpu_types=accepted_types(job.spec, settings),
        # A job that names no type takes any with the memory it asks for, the cheapest work first.
        gpu_type_policy=job.spec.gpu_type_policy if job.spec.gpu_types else GpuTypePolicy.ANY,
        pinning=job.spec.pinning,
        uniform=uniform(job.spec),
        job_set=set_key(job.tenant, job.job_set),
        resumable=job.spec.resumable,
    )


def running_gang(
    job: JobRecord, inputs: PlacerInputs, status: GangStatus | None, held_off: bool = False
) -> RunningGang | None:
    """`held_off`: its cluster refused the last order to evict or move it until the order's deadline
    (`Reconciler`): no new one is ordered for a while, so its room is not held for nothing again."""
    base = job.running_gang()
    if base is None:
        return None
    placement = job.placement
    assert placement is not None  # a job without one has no running gang
    klass = inputs.settings.priority_class(job.spec.priority_class)
    started = status.started_at_s if status is not None else None
    nodes: tuple[NodeShare, ...] = status.nodes if status is not None else ()
    return replace(
        base,
        priority_class=job.spec.priority_class,
        preemptible=(klass is None or klass.preemptible) and not held_off,
        queued_at_s=job.queued_at_s,
        ends_at_s=None if started is None or not job.spec.max_runtime_s else started + job.spec.max_runtime_s,
        nodes=nodes,
        terminating=job.preemption is not None or job.cancel_requested,
        # An order counts until its victim is gone (requeued) or the order is withdrawn: the victim's
        # GPUs are the beneficiary's, so the next cycle neither evicts more for it nor gives them away.
        evicted_for=None if job.preemption is None else job.preemption.for_job,
        # What a move back to private GPUs reads (`placement.repatriate`). Only a job whose manifest
        # says it resumes from a checkpoint may be moved; the run-time limit stands for its work.
        kind=placement.kind,
        usd_per_gpu_hour=placement.usd_per_gpu_hour,
        replica_gpus=job.spec.replica_gpus,
        gpu_types=accepted_types(job.spec, inputs.settings),
        started_at_s=started,
        # A move is not checked against placement rules or Volcano support: jobs with either stay put.
        movable=job.spec.resumable
        and job.phase is JobPhase.RUNNING
        and not held_off
        and not job.spec.pinning
        and uniform(job.spec),
    )


def unbound_replica_gpus(
    job: JobRecord, cluster_answered: bool, status: GangStatus | None
) -> tuple[int, ...]:
    """The GPUs per replica that `job` is promised on its cluster but the inventory does not yet show.

    Admitted and staging gangs are not on the cluster yet. A dispatched gang is on it, but until
    its pods are bound to nodes the inventory counts none of its GPUs: without holding them back, the
    next cycle admitted a second gang into the same GPUs, and that gang sat pending behind work that
    could run for hours. The same holds for a gang already reported running, whose pods the pod
    watch (from which the inventory is computed) has not caught up with yet. Once the cluster
    reports pods on nodes, only the rest is held back.

    A record still admitted or staging may already have its gang on the cluster: the reconciler
    writes DISPATCHED after the cluster took the gang, and its pods can be bound by the time the
    cycle looks. `status` (read with the inventory, `ClusterBackend.observe`) is then this very
    attempt's, and only what it does not show bound is held back; holding all of it counted the
    bound pods twice, and burst-now sent the next gang to a cloud while private GPUs stood free.
    """
    if job.phase in _PENDING_PHASES:
        if status is None or not cluster_answered or status.phase.is_final:
            # Not on the cluster yet (or pods seen before their gang object, reported orphaned).
            return job.spec.replica_gpus
    elif job.phase not in (JobPhase.DISPATCHED, JobPhase.RUNNING) or not cluster_answered:
        # A silent cluster's inventory offers nothing to protect.
        return ()
    elif status is None:
        # Created but not yet seen by the cluster's watch; a running gang that vanished is the
        # reconciler's to handle.
        return job.spec.replica_gpus if job.phase is JobPhase.DISPATCHED else ()
    elif status.phase.is_final:
        return ()
    if status.bound_gpus is None:
        return ()
    bound = status.bound_gpus
    remaining: list[int] = []
    # Which replicas are bound is not reported, only how many GPUs: count the smallest as bound
    # first, so the larger replicas are held back and the estimate errs towards less free capacity.
    for gpus in sorted(job.spec.replica_gpus):
        if gpus <= bound:
            bound -= gpus
        else:
            remaining.append(gpus)
    return tuple(remaining)


class GangRequests:
    """Each queued job's GangRequest, built once per (record version, inputs version).

    Requests with equal decision keys share one key object (`GangRequest.decision_key`, interned
    here): the placer numbers the kinds of gangs each cycle (`placement.plan._Cycle`), and with one
    object per kind it hashes each distinct key once rather than a 22-field tuple per queued job
    (0.75 µs a job, most of the cycle's setup at 100,000 queued, bench/scale_depth.py).
    """

    def __init__(self) -> None:
        self._built: dict[JobId, tuple[JobRecord, int, GangRequest]] = {}
        self._kinds: dict[tuple[object, ...], tuple[object, ...]] = {}

    def get(self, job: JobRecord, inputs: PlacerInputs) -> GangRequest:
        hit = self._built.get(job.job_id)
        if hit is not None and hit[0] is job and hit[1] == inputs.version:
            return hit[2]
        return self._build(job, inputs)

    def _build(self, job: JobRecord, inputs: PlacerInputs) -> GangRequest:
        request = gang_request(job, inputs)
        key = self._kinds.setdefault(request.decision_key, request.decision_key)
        if key is not request.decision_key:
            # The same value: the request is unchanged but for which equal tuple it holds.
            object.__setattr__(request, "decision_key", key)
        self._built[job.job_id] = (job, inputs.version, request)
        return request

    def split(
        self,
        jobs: Sequence[JobRecord],
        inputs: PlacerInputs,
        held: Collection[str],
        between: Callable[[], None] | None = None,
    ) -> tuple[list[GangRequest], list[JobRecord]]:
        """The requests of the queued jobs (`get` for each, without a call per kept request: a deep
        queue's cycle asks for a million, nearly all kept), but those cancelled or `held`, and the
        jobs that are not queued, in order; `between` every few hundred jobs. One walk of the jobs
        for both: a pass over a deep queue's records costs more in reading them from memory (100 to
        200 ns a record) than in what it does with each."""
        built, version = self._built.get, inputs.version
        out: list[GangRequest] = []
        placed: list[JobRecord] = []
        queued = JobPhase.QUEUED
        for index, job in enumerate(jobs):
            if between is not None and index & 255 == 0:
                between()
            if job.phase is not queued:
                placed.append(job)
                continue
            job_id = job.job_id
            if job.cancel_requested or job_id in held:
                continue
            hit = built(job_id)
            if hit is not None and hit[0] is job and hit[1] == version:
                out.append(hit[2])
            else:
                out.append(self._build(job, inputs))
        return out, placed

    def keep_only_queued(self, queued: Sequence[GangRequest]) -> None:
        """`keep_only` the jobs of `queued` (their requests, or requests made from them), which holds
        every job asked for since the last call, each once; without a set of them when nothing else
        is kept (every cycle of a queue that only grew or stayed)."""
        if len(self._built) != len(queued):
            self.keep_only({q.job_id for q in queued})

    def keep_only(self, job_ids: set[JobId]) -> None:
        """Forget the jobs not in `job_ids`, which holds every job asked for since the last call."""
        if len(self._built) == len(job_ids):
            return  # all asked for this cycle, so nothing else is kept: no walk of the whole queue
        for job_id in [j for j in self._built if j not in job_ids]:
            del self._built[job_id]
        if len(self._kinds) > 2 * len(self._built) + 1024:
            # Kinds no kept request has: forgotten, so that a queue of ever new kinds stays bounded.
            self._kinds = {}
            for _, _, request in self._built.values():
                self._kinds.setdefault(request.decision_key, request.decision_key)


def move_hold(job: JobRecord) -> PendingGang | None:
    """The private room an ordered move is for, held until the moved job is requeued (None: the
    job has no move under way).

    Between the order and the requeue the gang writes its checkpoint (the grace period) and its pods
    leave, while the private GPUs it goes to look idle. Without the hold, the next cycle would move
    a second gang into the same room, or admit a later job there, and the moved job would find it
    taken: stopped for nothing. The requeued job then comes first for the room by its old position.
    """
    order = job.preemption
    if order is None or order.move_to is None or order.move_gpu_type is None:
        return None
    if not job.phase.holds_capacity:
        return None
    return PendingGang(
        cluster=order.move_to,
        gpu_type=order.move_gpu_type,
        kind=CapacityKind.PRIVATE,
        replica_gpus=job.spec.replica_gpus,
    )


def set_mates_stores(placed: Sequence[JobRecord], inventories: Sequence[ClusterState]) -> SetStores:
    """Where each job set's members that read a dataset are placed now (admitted to running), by the
    object store their cluster reads from: their queued set-mates count those stores as holding the
    dataset (`placement.set_affinity`). Empty, and no request is touched, when no set member is placed."""
    stores = {c.name: c.object_store for c in inventories}
    out = SetStores()
    for job in placed:
        if not job.job_set or job.spec.dataset is None or job.placement is None:
            continue
        if not job.phase.holds_capacity:
            continue
        # The key its queued set-mates' requests have (`gang_request`, `affinity_key`).
        out.add((set_key(job.tenant, job.job_set), str(job.spec.dataset)), stores.get(job.placement.cluster))
    return out


def build_snapshot(
    jobs: Sequence[JobRecord],
    inputs: PlacerInputs,
    inventories: Sequence[ClusterState],
    *,
    statuses: Mapping[ClusterName, Mapping[GangKey, GangStatus] | None] | None = None,
    usage: Mapping[TenantId, TenantUsage] | None = None,
    preempted_gpus_this_interval: int = 0,
    requests: GangRequests | Callable[[JobRecord, PlacerInputs], GangRequest] = gang_request,
    held_off: Collection[JobId] = frozenset(),
    between: Callable[[], None] | None = None,
) -> Snapshot:
    """`between`: called every few hundred jobs, as `placement.plan`'s."""
    statuses = statuses or {}
    usage = usage or {}
    # One pass splits the queue from the rest and looks up the queued jobs' kept requests: a queued
    # job holds no capacity and has nothing pending on a cluster, so the loops below need only the
    # others (a deep queue is most of the jobs).
    # Jobs whose input version another live job will make wait out of the queue (issue 34).
    awaiting = awaited_inputs(jobs, inputs.settings.dataset)
    if isinstance(requests, GangRequests):
        queued_requests, placed = requests.split(jobs, inputs, awaiting, between)
    else:
        queued_jobs: list[JobRecord] = []
        placed = []
        for job in jobs:
            if job.phase is JobPhase.QUEUED:
                if not job.cancel_requested and job.job_id not in awaiting:
                    queued_jobs.append(job)
            else:
                placed.append(job)
        queued_requests = []
        for index, job in enumerate(queued_jobs):
            if between is not None and index % 256 == 0:
                between()
            queued_requests.append(requests(job, inputs))
    mates = set_mates_stores(placed, inventories)
    # Most cycles place no set member: then no request is widened, and none is asked (a call per job).
    queued = tuple(map(mates.widened, queued_requests)) if mates.placed_any() else tuple(queued_requests)
    running = []
    for job in placed:
        cluster = job.placement.cluster if job.placement is not None else None
        on_cluster = statuses.get(cluster) if cluster is not None else None
        status = on_cluster.get((job.job_id, job.attempt)) if on_cluster is not None else None
        gang = running_gang(job, inputs, status, job.job_id in held_off)
        if gang is not None:
            running.append(gang)
    pending = []
    for job in placed:
        if job.placement is None:
            continue
        on_cluster = statuses.get(job.placement.cluster)
        unbound = unbound_replica_gpus(
            job,
            on_cluster is not None,
            None if on_cluster is None else on_cluster.get((job.job_id, job.attempt)),
        )
        if unbound:
            pending.append(
                PendingGang(
                    cluster=job.placement.cluster,
                    gpu_type=job.placement.gpu_type,
                    kind=job.placement.kind,
                    replica_gpus=unbound,
                )
            )
        held = move_hold(job)
        if held is not None:
            pending.append(held)
    clusters = tuple(reserve_pending(c, pending) if pending else c for c in inventories)
    settings = inputs.settings
    values = settings.class_values()
    tenants = []
    for t in inputs.tenants:
        used = usage.get(t.name)
        tenants.append(
            t.quota(
                priority_classes=values,
                spent_gpu_hours=0.0 if used is None else used.month_gpu_hours,
                usage_history_gpu_hours=() if used is None else used.decayed_gpu_hours,
            )
        )
    return Snapshot(
        queued=queued,
        running=tuple(running),
        tenants=tuple(tenants),
        clusters=clusters,
        priority_classes=settings.priority_classes,
        gpu_speeds=gpu_speeds(settings),
        gpu_families=tuple(
            (m.name, m.family) for m in settings.gpu_registry().models.values() if m.name != m.family
        ),
        egress_rates=settings.egress_rates,
        policy=replace(settings.policy, preempted_gpus_this_interval=preempted_gpus_this_interval),
    )
