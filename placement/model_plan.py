"""What a cycle decides: admissions, preemptions, capacity to buy, backfill reservations, and reasons.

Federation applies a `Plan` (commits admissions, evicts victims, hands capacity requests to the
provisioner) and stores each waiting job's reasons for `explain`. Every type is a frozen value, so a
plan compares equal to the plan of an equal snapshot.

The values a cycle makes per gang (`WaitReason`, `Admission` and what it holds, `Preemption`; in the
placer `HistogramFit`, `VictimChoice`, `_Fit`, `_Miss`) are declared `init=False` with an `__init__`
written out: compiled, the dataclass's generated `__init__` is a Python function (making a
`WaitReason` by it took about 15,000 instructions), where this one's `object.__setattr__` calls
compile to struct writes. Its parameters are the fields the dataclass would take, in order, with the
same defaults (`tests/unit/test_placement_values.py`); equality, hashing and the rest are still the
dataclass's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from placement.model_ids import CapacityKind, ClusterName, GpuType, JobId, TenantId
from placement.model_values import keep_as_values

# Re-exported: a wait is the plan's value, kept in a module of its own only to stay interpreted.
from placement.model_waiting import Explanation as Explanation
from placement.model_waiting import Waiting as Waiting


@dataclass(frozen=True, slots=True, init=False)
class Alternative:
    """An offer the placer weighed against the one it chose."""

    cluster: ClusterName
    gpu_type: GpuType
    kind: CapacityKind
    usd_per_gpu_hour: float
    expected_cost_usd: float

    def __init__(
        self,
        cluster: ClusterName,
        gpu_type: GpuType,
        kind: CapacityKind,
        usd_per_gpu_hour: float,
        expected_cost_usd: float,
    ) -> None:
        object.__setattr__(self, "cluster", cluster)
        object.__setattr__(self, "gpu_type", gpu_type)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "usd_per_gpu_hour", usd_per_gpu_hour)
        object.__setattr__(self, "expected_cost_usd", expected_cost_usd)


@dataclass(frozen=True, slots=True, init=False)
class Choice:
    """Why an admission went where it went: the figures `placement.explain.admitted` words for
    `explain` of a running job (price, type, data, and what it beat)."""

    # The chosen GPU type's speed for this job (1.0: the reference), and the hours of work there.
    speed: float
    run_hours: float
    # The job's dataset, where it is, and the store the chosen cluster reads from (None: no dataset,
    # or no store); what moving it costs and how long it takes (0: it does not move).
    dataset: str | None
    dataset_store: str | None
    cluster_store: str | None
    egress_usd: float
    transfer_s: float
    # The next best offer that had room (None: no other), and a cheaper one it had to pass over for
    # lack of free GPUs (None: none was cheaper).
    runner_up: Alternative | None
    cheaper_full: Alternative | None
    # On spot, for a resumable gang: the work a reclaim is expected to cost it (hours since its last
    # checkpoint, `PolicyConfig.spot_lost_work_h`); None elsewhere. Out of the repr, which recorded plan
    # digests hash (tests/unit/test_plan_cycles.py): the words of `explain` carry it.
    spot_lost_work_h: float | None = field(default=None, repr=False)

    def __init__(
        self,
        speed: float,
        run_hours: float,
        dataset: str | None,
        dataset_store: str | None,
        cluster_store: str | None,
        egress_usd: float,
        transfer_s: float,
        runner_up: Alternative | None,
        cheaper_full: Alternative | None,
        spot_lost_work_h: float | None = None,
    ) -> None:
        object.__setattr__(self, "speed", speed)
        object.__setattr__(self, "run_hours", run_hours)
        object.__setattr__(self, "dataset", dataset)
        object.__setattr__(self, "dataset_store", dataset_store)
        object.__setattr__(self, "cluster_store", cluster_store)
        object.__setattr__(self, "egress_usd", egress_usd)
        object.__setattr__(self, "transfer_s", transfer_s)
        object.__setattr__(self, "runner_up", runner_up)
        object.__setattr__(self, "cheaper_full", cheaper_full)
        object.__setattr__(self, "spot_lost_work_h", spot_lost_work_h)


@dataclass(frozen=True, slots=True, init=False)
class Admission:
    """A decision to run a job's whole gang on one cluster, on one GPU type, at one price."""

    job_id: JobId
    cluster: ClusterName
    gpu_type: GpuType
    kind: CapacityKind
    usd_per_gpu_hour: float
    # The cost model's estimate for the chosen placement (compute, restart risk, egress, staging delay).
    expected_cost_usd: float = 0.0
    # Why there (None: not recorded). Not part of the decision's equality: it only explains it.
    choice: Choice | None = field(default=None, compare=False)

    def __init__(
        self,
        job_id: JobId,
        cluster: ClusterName,
        gpu_type: GpuType,
        kind: CapacityKind,
        usd_per_gpu_hour: float,
        expected_cost_usd: float = 0.0,
        choice: Choice | None = None,
    ) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "cluster", cluster)
        object.__setattr__(self, "gpu_type", gpu_type)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "usd_per_gpu_hour", usd_per_gpu_hour)
        object.__setattr__(self, "expected_cost_usd", expected_cost_usd)
        object.__setattr__(self, "choice", choice)


class PreemptionReason(StrEnum):
    # The victim's tenant borrows capacity that the preemptor's tenant is guaranteed.
    RECLAIM_GUARANTEE = "reclaim_guarantee"
    # The victim has a lower priority than the preemptor, in the same tenant.
    LOWER_PRIORITY = "lower_priority"
    # The victim has a lower priority than the preemptor, in the same tenant, which is at its cap (or
    # borrowing limit): an approved priority class makes room for itself under the cap.
    TENANT_CAP = "tenant_cap"


@dataclass(frozen=True, slots=True, init=False)
class Preemption:
    """Evict a whole running gang so that `for_job` fits; the victim is requeued at its old position."""

    victim: JobId
    tenant: TenantId
    cluster: ClusterName
    gpu_type: GpuType
    gpu_count: int
    reason: PreemptionReason
    grace_period_s: float
    for_job: JobId
    # Queue position to requeue the victim at: its original queue time, not the eviction time.
    requeue_queued_at_s: float

    def __init__(
        self,
        victim: JobId,
        tenant: TenantId,
        cluster: ClusterName,
        gpu_type: GpuType,
        gpu_count: int,
        reason: PreemptionReason,
        grace_period_s: float,
        for_job: JobId,
        requeue_queued_at_s: float,
    ) -> None:
        object.__setattr__(self, "victim", victim)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "cluster", cluster)
        object.__setattr__(self, "gpu_type", gpu_type)
        object.__setattr__(self, "gpu_count", gpu_count)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "grace_period_s", grace_period_s)
        object.__setattr__(self, "for_job", for_job)
        object.__setattr__(self, "requeue_queued_at_s", requeue_queued_at_s)


@dataclass(frozen=True, slots=True)
class CapacityRequest:
    """Grow one scalable pool by whole nodes, enough for the whole gang or nothing (one request per gang)."""

    cluster: ClusterName
    pool: str
    gpu_type: GpuType
    kind: CapacityKind
    nodes: int
    job_ids: tuple[JobId, ...]


@dataclass(frozen=True, slots=True)
class Reservation:
    """A blocked gang's promised start: later gangs on that cluster and type may not delay it."""

    job_id: JobId
    cluster: ClusterName
    gpu_type: GpuType
    start_at_s: float


class WaitCode(StrEnum):
    """Why a job was not admitted this cycle. Specific enough for a user to act on."""

    UNKNOWN_TENANT = "unknown_tenant"
    PRIORITY_NOT_ALLOWED = "priority_not_allowed"
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_EXPIRED = "approval_expired"
    BUDGET_SPENT = "budget_spent"
    NO_CLUSTER_HAS_GPU_TYPE = "no_cluster_has_gpu_type"
    # The job's own placement rules (spec.placement), or its differing tasks, rule clusters out.
    PLACEMENT_RULES = "placement_rules"
    SPOT_NOT_ALLOWED = "spot_not_allowed"
    CLUSTER_UNREACHABLE = "cluster_unreachable"
    TENANT_CAP_REACHED = "tenant_cap_reached"
    BORROWING_LIMIT = "borrowing_limit"
    QUOTA_EXHAUSTED = "quota_exhausted"
    GANG_LARGER_THAN_CLUSTER = "gang_larger_than_cluster"
    INSUFFICIENT_CAPACITY = "insufficient_capacity"
    DEADLINE_UNMEETABLE = "deadline_unmeetable"
    WAITING_FOR_PRIVATE_CAPACITY = "waiting_for_private_capacity"
    BACKFILL_WOULD_DELAY = "backfill_would_delay"
    PREEMPTION_LIMIT_REACHED = "preemption_limit_reached"
    # Victims were chosen (now or in an earlier cycle) and are leaving; the gang starts when they are gone.
    PREEMPTING = "preempting"
    CAPACITY_REQUESTED = "capacity_requested"
    # Set by the capacity reconciler, not the placer: the pool change was refused (a limit, the
    # spend ceiling) or failed at the provisioner and waits for a retry.
    CAPACITY_REFUSED = "capacity_refused"
    CAPACITY_FAILED = "capacity_failed"
    RESERVED = "reserved"


@dataclass(frozen=True, slots=True, init=False)
class WaitReason:
    """One reason, with the figures behind it where there are some (None: does not apply)."""

    code: WaitCode
    message: str
    cluster: ClusterName | None = None
    gpu_type: GpuType | None = None
    # The tenant whose quota, cap or budget blocks (the job's tenant or one of its ancestors).
    tenant: TenantId | None = None
    # The limit in force (GPUs), what is held against it, and what the job needs.
    limit_gpus: int | None = None
    held_gpus: int | None = None
    needed_gpus: int | None = None
    # Capacity of `cluster` and `gpu_type` usable by the job: free GPUs, largest free block on one node.
    free_gpus: int | None = None
    largest_free_node_gpus: int | None = None
    # A time that matters: approval expiry, end of the wait for private capacity, reserved start.
    at_s: float | None = None

    def __init__(
        self,
        code: WaitCode,
        message: str,
        cluster: ClusterName | None = None,
        gpu_type: GpuType | None = None,
        tenant: TenantId | None = None,
        limit_gpus: int | None = None,
        held_gpus: int | None = None,
        needed_gpus: int | None = None,
        free_gpus: int | None = None,
        largest_free_node_gpus: int | None = None,
        at_s: float | None = None,
    ) -> None:
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "message", message)
        object.__setattr__(self, "cluster", cluster)
        object.__setattr__(self, "gpu_type", gpu_type)
        object.__setattr__(self, "tenant", tenant)
        object.__setattr__(self, "limit_gpus", limit_gpus)
        object.__setattr__(self, "held_gpus", held_gpus)
        object.__setattr__(self, "needed_gpus", needed_gpus)
        object.__setattr__(self, "free_gpus", free_gpus)
        object.__setattr__(self, "largest_free_node_gpus", largest_free_node_gpus)
        object.__setattr__(self, "at_s", at_s)


@dataclass(frozen=True, slots=True)
class Move:
    """Stop a running cloud gang at a checkpoint and restart it at once on idle private GPUs.

    Decided only into room no queued gang takes this cycle and no reservation needs, never by
    evicting anyone (`placement.repatriate`). The figures are the placer's estimate: what the gang
    would still pay in the cloud, what the rest costs on private GPUs, and what the move itself costs
    (its overhead, priced at the cloud rate).
    """

    job_id: JobId
    tenant: TenantId
    gpu_count: int
    from_cluster: ClusterName
    from_gpu_type: GpuType
    from_usd_per_gpu_hour: float
    to_cluster: ClusterName
    to_gpu_type: GpuType
    to_kind: CapacityKind
    to_usd_per_gpu_hour: float
    # Expected cloud run time left (s), and the run time on the private GPUs with the overhead (s).
    remaining_cloud_s: float
    private_run_s: float
    overhead_s: float
    cloud_cost_left_usd: float
    private_cost_usd: float
    move_cost_usd: float
    # cloud_cost_left - private_cost - move_cost.
    saving_usd: float
    # The run-time limit left, which the placer (and the replay) keeps counting on for backfill.
    max_runtime_s: float
    # Between the stop signal and the kill: the time the gang has to write its checkpoint.
    grace_period_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Plan:
    """The placer's output: what to admit, whom to evict, what to buy, and for every job left waiting, why."""

    admissions: tuple[Admission, ...] = ()
    # A tuple, or chunks of one shared with the last plan's where unchanged (`placement.chunks`).
    waiting: Sequence[Waiting] = field(default_factory=tuple)
    preemptions: tuple[Preemption, ...] = ()
    capacity_requests: tuple[CapacityRequest, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    # Running cloud gangs to move back to private GPUs (`PolicyConfig.repatriate`).
    moves: tuple[Move, ...] = ()
    # Per gang that could not run on private GPUs at once, the cloud offer it would burst to now (the
    # alternative its private wait was priced against, or the pool asked to grow for it).
    bursts: Mapping[JobId, Alternative] = field(default_factory=dict)


# Waits made by the compiled placer without an interpreted call (`Waiting` stays interpreted,
# `model_waiting`): a bare object of the class, its three slots written by `object.__setattr__`,
# which skips its guard against writes. By `Waiting.explained` a wait took two interpreted frames
# (the method, its plain object's `__init__`) and a change of class: about 3,200 instructions, and
# a steady cycle makes one per waiting gang. Outside a class, the compiled form makes each
# `object.__setattr__` one C call (`PyObject_GenericSetAttr`), where calling the slots' descriptors'
# `__set__` went through a generic call with its arguments packed, 600 instructions a slot. The same
# wait, slot for slot (`test_placement_values`).
_BARE: Final[Any] = object.__new__


def explained_wait(job_id: JobId, explanation: Explanation) -> Waiting:
    """`Waiting.explained(job_id, explanation)`, made without an interpreted call."""
    waiting: Waiting = _BARE(Waiting)
    object.__setattr__(waiting, "job_id", job_id)
    object.__setattr__(waiting, "_reasons", None)
    object.__setattr__(waiting, "_explanation", explanation)
    return waiting


def wait_for_job(earlier: Waiting, job_id: JobId) -> Waiting:
    """The same wait as `earlier` for another job (a gang of a kind already decided this cycle, which
    waits for the same reasons), made without an interpreted call: a deep queue's cycle makes one per
    such job (nearly a million at a million queued), and the method that made them (`for_job`) cost
    two interpreted frames and a change of class, 0.17 µs a wait."""
    waiting: Waiting = _BARE(Waiting)
    object.__setattr__(waiting, "job_id", job_id)
    object.__setattr__(waiting, "_reasons", earlier._reasons)
    object.__setattr__(waiting, "_explanation", earlier._explanation)
    return waiting


def reasoned_wait(job_id: JobId, reasons: tuple[WaitReason, ...]) -> Waiting:
    """`Waiting(job_id, reasons)`, made without an interpreted call."""
    waiting: Waiting = _BARE(Waiting)
    object.__setattr__(waiting, "job_id", job_id)
    object.__setattr__(waiting, "_reasons", reasons)
    object.__setattr__(waiting, "_explanation", None)
    return waiting


keep_as_values(
    Alternative, Choice, Admission, Preemption, CapacityRequest, Reservation, WaitReason, Move, Plan
)
