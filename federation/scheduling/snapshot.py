"""From federation's records to the placer's `Snapshot`: jobs, tenants, settings, approvals, clusters.

Pure: the scheduler reads everything (job cache, etcd records, cluster inventories and statuses),
and this module turns it into the placer's values. A queued job's `GangRequest` depends on the job
record and on the inputs (settings, users, approvals), so it is rebuilt only when one of them
changes; with thousands queued, rebuilding every request each cycle cost as much as planning them.
The queue itself is carried from cycle to cycle and updated from the jobs that changed
(`GangRequests.carry`): reading every queued record to find them cost 0.5 µs a job.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, KeysView, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import itemgetter

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
from placement.queue_chunks import ChunkedQueue, QueueChunks
from placement.reserve import PendingGang, reserve_pending
from placement.set_affinity import SetStores, set_key
from placement.stretch_carry import PlanCarry

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
    """Each queued job's GangRequest, built once per (record version, inputs version), and the
    placer's queue carried from cycle to cycle (`carry`).

    Requests with equal decision keys share one key object (`GangRequest.decision_key`, interned
    here): the placer numbers the kinds of gangs each cycle (`placement.plan._Cycle`), and with one
    object per kind it hashes each distinct key once rather than a 22-field tuple per queued job
    (0.75 µs a job, most of the cycle's setup at 100,000 queued, bench/scale_depth.py).
    """

    def __init__(self) -> None:
        self._built: dict[JobId, tuple[JobRecord, int, GangRequest]] = {}
        self._kinds: dict[tuple[object, ...], tuple[object, ...]] = {}
        # The carried queue (`carry`): while `_carried`, `_built` holds exactly the requests of the
        # placer's queue as the last carry left it (queued, not cancelled, not awaiting an input),
        # built with the inputs of `_version`, and the maps below are those jobs' others.
        self._carried = False
        self._version = -1
        # Live jobs not queued, by id: the snapshot's running and pending gangs come from these.
        self._placed: dict[JobId, JobRecord] = {}
        # What `awaited_inputs` reads: live jobs that make outputs, and queued ones that read a
        # version of a dataset (any other job neither makes nor waits for one).
        self._makers: dict[JobId, JobRecord] = {}
        self._wanting: dict[JobId, JobRecord] = {}
        self._held: frozenset[str] = frozenset()
        # Jobs in the queue by tenant, for the queue-depth gauge.
        self._depth: dict[str, int] = {}
        # The queue handed to the placer, in chunks edited by the carry's changes (`queue_chunks`):
        # made afresh with `_carry_all`, edited by `_carry_changes`.
        self._chunks = QueueChunks()
        # What the placer's last plan over this queue kept for the next (`placement.plan`'s `carry`:
        # the plan is the same without it).
        self.plan_carry = PlanCarry()

    @property
    def queue_copied(self) -> int:
        """Requests copied into the queue's chunks so far (`queue_chunks.QueueChunks.copied`): a steady
        cycle copies the chunks its changes touch (for tests and benchmarks)."""
        return self._chunks.copied

    def get(self, job: JobRecord, inputs: PlacerInputs) -> GangRequest:
        hit = self._built.get(job.job_id)
        if hit is not None and hit[0] is job and hit[1] == inputs.version:
            return hit[2]
        self._carried = False  # `_built` may now hold a job outside the queue
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
        self._carried = False
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

    def keep_only(self, job_ids: set[JobId]) -> None:
        """Forget the jobs not in `job_ids`, which holds every job asked for since the last call."""
        self._carried = False
        if len(self._built) == len(job_ids):
            return  # all asked for this cycle, so nothing else is kept: no walk of the whole queue
        for job_id in [j for j in self._built if j not in job_ids]:
            del self._built[job_id]
        self._forget_kinds()

    def _forget_kinds(self) -> None:
        if len(self._kinds) > 2 * len(self._built) + 1024:
            # Kinds no kept request has: forgotten, so that a queue of ever new kinds stays bounded.
            self._kinds = {}
            for _, _, request in self._built.values():
                self._kinds.setdefault(request.decision_key, request.decision_key)

    # ---- the carried queue

    def carry(
        self,
        changed: Mapping[JobId, JobRecord | None] | None,
        every: Callable[[], Iterable[JobRecord]],
        inputs: PlacerInputs,
        between: Callable[[], None] | None = None,
    ) -> CarriedQueue:
        """The placer's queue, brought up to date from the jobs `changed` since the last carry (each
        as it is now, None when no longer live), or from `every` live job when `changed` is None, when
        nothing is carried yet or the inputs changed (every request depends on them).

        A deep queue's cycle read every record and built a list of every queued job's request, about
        1 µs a job (half a second of CPU at a million queued); carried, a cycle costs the jobs that
        changed and the jobs in flight. The queue handed on is in chunks (`placement.queue_chunks`):
        a change copies its chunk, and the placer reads the edits rather than the queue (its tuple,
        made each cycle, was 24 ms at a million). Whatever feeds a request or
        the queue's membership besides the record is in `inputs` (settings, users, approvals: all
        rebuilt when its version changes), or is read here from the jobs (the inputs awaited from a
        live job, held out of the queue); a cancel request is on the record. An exception half-way
        leaves nothing carried."""
        carried, self._carried = self._carried, False
        if changed is None or not carried or inputs.version != self._version:
            departed: set[JobId] | None = None
            self._carry_all(every(), inputs, between)
            self._chunks.reset(map(_REQUEST, self._built.values()))
        else:
            departed = self._carry_changes(changed, inputs)
        self._forget_kinds()
        self._version = inputs.version
        requests = self._chunks.queue()
        self._carried = True
        return CarriedQueue(
            requests=requests,
            placed=list(self._placed.values()),
            depth=dict(self._depth),
            departed=departed,
            ids=self._built.keys(),
        )

    def _carry_all(
        self, jobs: Iterable[JobRecord], inputs: PlacerInputs, between: Callable[[], None] | None
    ) -> None:
        placed: dict[JobId, JobRecord] = {}
        makers: dict[JobId, JobRecord] = {}
        wanting: dict[JobId, JobRecord] = {}
        candidates: list[JobRecord] = []
        queued = JobPhase.QUEUED
        for index, job in enumerate(jobs):
            if between is not None and index & 255 == 0:
                between()
            spec = job.spec
            if spec.outputs:
                makers[job.job_id] = job
            if job.phase is not queued:
                placed[job.job_id] = job
                continue
            ref = spec.dataset
            if ref is not None and ref.version is not None:
                wanting[job.job_id] = job
            if not job.cancel_requested:
                candidates.append(job)
        held = awaited_inputs([*makers.values(), *wanting.values()], inputs.settings.dataset)
        built, version = self._built.get, inputs.version
        kept: dict[JobId, None] = {}
        for index, job in enumerate(candidates):
            if between is not None and index & 255 == 0:
                between()
            job_id = job.job_id
            if job_id in held:
                continue
            kept[job_id] = None
            hit = built(job_id)
            if hit is None or hit[0] is not job or hit[1] != version:
                self._build(job, inputs)
        if len(kept) != len(self._built):
            for job_id in [j for j in self._built if j not in kept]:
                del self._built[job_id]
        self._placed, self._makers, self._wanting, self._held = placed, makers, wanting, held
        self._depth = dict(Counter(hit[0].tenant for hit in self._built.values()))

    def _carry_changes(self, changed: Mapping[JobId, JobRecord | None], inputs: PlacerInputs) -> set[JobId]:
        """The jobs that left the queue."""
        placed, makers, wanting = self._placed, self._makers, self._wanting
        departed: set[JobId] = set()
        recheck: dict[JobId, JobRecord] = {}
        queued = JobPhase.QUEUED
        for job_id, job in changed.items():
            placed.pop(job_id, None)
            makers.pop(job_id, None)
            wanting.pop(job_id, None)
            if job is None:
                self._leave(job_id, departed)
                continue
            spec = job.spec
            if spec.outputs:
                makers[job_id] = job
            if job.phase is not queued:
                placed[job_id] = job
                self._leave(job_id, departed)
                continue
            ref = spec.dataset
            if ref is not None and ref.version is not None:
                wanting[job_id] = job
            recheck[job_id] = job
        # Who awaits an input changes with the makers and readers above, and with the registry's
        # locations (in the settings: a change rebuilds everything).
        held = awaited_inputs([*makers.values(), *wanting.values()], inputs.settings.dataset)
        if held != self._held:
            for held_id in held ^ self._held:
                job = wanting.get(JobId(held_id))
                if job is not None and job.job_id not in recheck:
                    recheck[job.job_id] = job
            self._held = held
        for job_id, job in recheck.items():
            if job.cancel_requested or job_id in held:
                self._leave(job_id, departed)
            else:
                self._enter(job, inputs)
        return departed

    def _enter(self, job: JobRecord, inputs: PlacerInputs) -> None:
        hit = self._built.get(job.job_id)
        if hit is not None and hit[0] is job and hit[1] == inputs.version:
            return
        if hit is None:
            self._depth[job.tenant] = self._depth.get(job.tenant, 0) + 1
        request = self._build(job, inputs)
        self._chunks.edit(job.job_id, None if hit is None else hit[2], request)

    def _leave(self, job_id: JobId, departed: set[JobId]) -> None:
        hit = self._built.pop(job_id, None)
        if hit is None:
            return
        self._chunks.edit(job_id, hit[2], None)
        departed.add(job_id)
        tenant = hit[0].tenant
        left = self._depth[tenant] - 1
        if left:
            self._depth[tenant] = left
        else:
            del self._depth[tenant]


_REQUEST = itemgetter(2)


@dataclass(frozen=True, slots=True)
class CarriedQueue:
    """The placer's queue as `GangRequests.carry` left it."""

    # In chunks, with the edits since the last carry's (`placement.queue_chunks`): the placer's queue
    # carry takes those, and no pass over the queue is made.
    requests: ChunkedQueue
    # Live jobs not queued (running, pending on a cluster): what the snapshot reads besides the queue.
    placed: list[JobRecord]
    # Queued jobs by tenant.
    depth: dict[str, int]
    # The jobs that left the queue since the last carry; None when every job was read (unknown).
    departed: set[JobId] | None
    # The queue's job ids: valid until the next carry.
    ids: KeysView[JobId]


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
    return snapshot_from(
        queued_requests,
        placed,
        inputs,
        inventories,
        statuses=statuses,
        usage=usage,
        preempted_gpus_this_interval=preempted_gpus_this_interval,
        held_off=held_off,
    )


def snapshot_from(
    queued_requests: Sequence[GangRequest],
    placed: Sequence[JobRecord],
    inputs: PlacerInputs,
    inventories: Sequence[ClusterState],
    *,
    statuses: Mapping[ClusterName, Mapping[GangKey, GangStatus] | None] | None = None,
    usage: Mapping[TenantId, TenantUsage] | None = None,
    preempted_gpus_this_interval: int = 0,
    held_off: Collection[JobId] = frozenset(),
) -> Snapshot:
    """The snapshot of the queue's requests (`GangRequests.split` or `carry`) and the live jobs that
    are not queued."""
    statuses = statuses or {}
    usage = usage or {}
    mates = set_mates_stores(placed, inventories)
    # Most cycles place no set member: then no request is widened, and none is asked (a call per job).
    # The carried queue is handed on as it is: its edits since the last cycle are what the placer reads.
    queued: Sequence[GangRequest]
    if mates.placed_any():
        queued = tuple(map(mates.widened, queued_requests))
    elif isinstance(queued_requests, tuple | ChunkedQueue):
        queued = queued_requests
    else:
        queued = tuple(queued_requests)
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
