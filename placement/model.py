"""Immutable value types shared by the placer and every edge package.

The placer is a pure function from a `Snapshot` to a `Plan`. Everything it reads or returns is
defined here or in the modules this one re-exports (`model_ids`, `model_policy`, `model_plan`),
frozen and slotted, so that a plan can be replayed from a recorded snapshot and two equal snapshots
always give equal plans. Edge packages (`clusters`, `datasync`, `iac`) import these types from
`placement.model`, never each other.

Every field added after the first policy has a default meaning "not known / rule off", so snapshots
built by older callers keep their meaning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter

from placement.model_ids import (
    NO_PINNING,
    PINNING_FIELDS,
    CapacityKind,
    ClusterName,
    GpuType,
    GpuTypePolicy,
    JobId,
    JobPhase,
    Pinning,
    Provider,
    TenantId,
)
from placement.model_plan import (
    Admission,
    Alternative,
    CapacityRequest,
    Choice,
    Move,
    Plan,
    Preemption,
    PreemptionReason,
    Reservation,
    WaitCode,
    Waiting,
    WaitReason,
)
from placement.model_policy import EgressRate, GpuQuota, PolicyConfig, PriorityClass, TenantQuota
from placement.model_values import keep_as_values

__all__ = [
    "NO_PINNING",
    "Admission",
    "Alternative",
    "CapacityKind",
    "CapacityRequest",
    "Choice",
    "ClusterName",
    "ClusterState",
    "EgressRate",
    "GangRequest",
    "GpuQuota",
    "GpuType",
    "GpuTypePolicy",
    "JobId",
    "JobPhase",
    "Move",
    "NodePool",
    "NodeShare",
    "Pinning",
    "Plan",
    "PolicyConfig",
    "PoolSpec",
    "Preemption",
    "PreemptionReason",
    "PriorityClass",
    "Provider",
    "Reservation",
    "RunningGang",
    "ScalablePool",
    "Snapshot",
    "TenantId",
    "TenantQuota",
    "WaitCode",
    "WaitReason",
    "Waiting",
]


# Frozen, so one shared default is safe.
DEFAULT_POLICY = PolicyConfig()


@dataclass(frozen=True, slots=True)
class GangRequest:
    """What the placer needs to know of one queued job: a gang that starts whole or not at all."""

    job_id: JobId
    tenant: TenantId
    # The value of the job's priority class (higher runs first).
    priority: int
    # Position in the queue: submission time, kept across requeues so a victim keeps its place.
    queued_at_s: float
    # GPUs each replica needs, one entry per replica across all tasks (master and workers).
    replica_gpus: tuple[int, ...]
    gpu_types: tuple[GpuType, ...]
    gpu_type_policy: GpuTypePolicy = GpuTypePolicy.ORDERED
    allow_spot: bool = False
    # The run-time limit (wall clock); 0 when the job states none. Backfill relies on it.
    max_runtime_s: int = 0
    dataset: str | None = None
    # Name of the job's priority class ("" for none): says whether it needs approval.
    priority_class: str = ""
    # Highest priority the submitting user may use (None: no per-user limit).
    user_max_priority: int | None = None
    # When the admin's approval of this job's class expires (None: no approval granted).
    approval_expires_at_s: float | None = None
    # The job must finish by this time (same clock as `now`), or None.
    deadline_at_s: float | None = None
    # Expected work in seconds on a GPU of speed 1.0 (0: use `max_runtime_s`, else the policy default).
    expected_runtime_s: float = 0.0
    # The dataset's size and the object store it is in now, for egress and staging time.
    dataset_size_bytes: int = 0
    dataset_store: str | None = None
    # Other stores that already hold a copy of the dataset: placing the job there moves nothing.
    dataset_cached_in: tuple[str, ...] = ()
    # Relative speeds for this job, overriding the snapshot's (e.g. (("H100", 2.0), ("A100", 1.0))).
    gpu_speeds: tuple[tuple[GpuType, float], ...] = ()
    # Clusters, regions and clouds the job must or must not run in (its manifest's `spec.placement`).
    # Unpinned gangs share one value: one object per gang was tens of thousands more for the garbage
    # collector to walk in a deep queue's cycle.
    pinning: Pinning = NO_PINNING
    # False when its replicas differ in what they run (a master of 0 GPUs and workers of 8, say): only
    # a cluster that runs such a gang as one object (Volcano) can take it (`ClusterState.runs_mixed_gangs`).
    uniform: bool = True
    # The job set it belongs to, qualified by its tenant ("tenant/name"; "" for none): its set-mates'
    # placements count as copies of their shared dataset (`placement.set_affinity`).
    job_set: str = ""
    # The longest the job may wait for private GPUs rather than pay cloud prices, from its queue time
    # (the manifest's `spec.maxWait`; None: as long as its tenant's cost policy says).
    max_wait_s: float | None = None
    # The job checkpoints (the manifest's `spec.resumable`): a spot reclaim costs it the work since its
    # last checkpoint (`PolicyConfig.spot_lost_work_h`), not a restart from scratch, so the bound on
    # restart slowdown (`spot_max_restart_slowdown`) does not keep it off spot.
    resumable: bool = False
    # Every GPU of the gang: read tens of times per gang and cycle, so summed once here.
    gpu_count: int = field(init=False, repr=False, compare=False)
    # Uniform and pinned nowhere: every cluster may take it (`Inventory.eligible`'s question, asked
    # several times per gang and cycle, answered once here).
    anywhere: bool = field(init=False, repr=False, compare=False)
    # Every field a placement decision reads but the gang's identity and queue time: two gangs with
    # equal keys, decided on the same working state, wait for the same reasons (`plan._Cycle.decide`).
    # Made once per request, which the scheduler keeps across cycles, not once per decision.
    decision_key: tuple[object, ...] = field(init=False, repr=False, compare=False)
    # `hash(decision_key)`, worked out with the key: each cycle's setup looks at every queued gang's
    # (`plan._Cycle`), and hashing a 22-field key per gang and cycle was a twentieth of a steady cycle.
    # Whoever puts another key object in its place puts an equal one (the scheduler's interning,
    # `federation.scheduling.snapshot.GangRequests`), which hashes the same.
    decision_hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_count", sum(self.replica_gpus))
        object.__setattr__(self, "anywhere", self.uniform and not self.pinning)
        key = _deciding_fields(self)
        # The placement rules as plain tuples: a Pinning in the key was a Python-level hash on every
        # lookup of the key (three a gang and cycle).
        pinning = self.pinning
        flat = () if not pinning else tuple(getattr(pinning, name) for name in PINNING_FIELDS)
        decision_key = (*key[:_PINNING_AT], flat, *key[_PINNING_AT + 1 :])
        object.__setattr__(self, "decision_key", decision_key)
        object.__setattr__(self, "decision_hash", hash(decision_key))


# Taken from the dataclass, so that a field added to GangRequest is part of the key without a change
# here. The queue time is left out: only the private wait reads it, and a decision that did is not
# reused (`CostModel.queue_time_reads`).
_NOT_DECIDING = frozenset({"job_id", "queued_at_s", "gpu_count", "anywhere", "decision_key", "decision_hash"})
_DECIDING = tuple(f.name for f in fields(GangRequest) if f.name not in _NOT_DECIDING)
_deciding_fields = attrgetter(*_DECIDING)
_PINNING_AT = _DECIDING.index("pinning")


@dataclass(frozen=True, slots=True)
class NodePool:
    """A group of identical GPU nodes in one cluster, with each node's free GPUs."""

    name: str
    gpu_type: GpuType
    kind: CapacityKind
    usd_per_gpu_hour: float
    gpus_per_node: int
    # Free GPUs on each schedulable node (cordoned, tainted or not-Ready nodes are left out).
    free_gpus_per_node: tuple[int, ...]
    # Spot only: chance per hour that a node is reclaimed by the provider.
    restart_risk_per_hour: float = 0.0

    @property
    def free_gpus(self) -> int:
        return sum(self.free_gpus_per_node)

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * len(self.free_gpus_per_node)


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """How a node pool is configured: the shape every backend and the config file share."""

    name: str
    gpu_type: GpuType
    kind: CapacityKind
    usd_per_gpu_hour: float
    gpus_per_node: int
    node_count: int
    # Spot pools: how often the cloud takes a node back, per node-hour (the operator's estimate from
    # the cloud's interruption figures). It prices spot and bounds which gangs may use it.
    reclaims_per_node_hour: float = 0.0

    def with_free(self, free_gpus_per_node: tuple[int, ...]) -> NodePool:
        """The pool as the placer sees it, given each schedulable node's free GPUs."""
        return NodePool(
            name=self.name,
            gpu_type=self.gpu_type,
            kind=self.kind,
            usd_per_gpu_hour=self.usd_per_gpu_hour,
            gpus_per_node=self.gpus_per_node,
            free_gpus_per_node=free_gpus_per_node,
            restart_risk_per_hour=self.reclaims_per_node_hour,
        )


@dataclass(frozen=True, slots=True)
class ScalablePool:
    """A node pool the provisioner may grow: the placer asks for nodes when a gang fits nowhere else."""

    name: str
    gpu_type: GpuType
    kind: CapacityKind
    usd_per_gpu_hour: float
    gpus_per_node: int
    node_count: int
    max_nodes: int
    # Nodes already asked for by earlier cycles and not yet in the inventory.
    requested_nodes: int = 0
    restart_risk_per_hour: float = 0.0

    @property
    def addable_nodes(self) -> int:
        return max(0, self.max_nodes - self.node_count - self.requested_nodes)


@dataclass(frozen=True, slots=True)
class ClusterState:
    """One member cluster as the placer sees it at snapshot time."""

    name: ClusterName
    provider: Provider
    region: str
    pools: tuple[NodePool, ...]
    reachable: bool = True
    # Object store that serves datasets to this cluster, if any.
    object_store: str | None = None
    scalable_pools: tuple[ScalablePool, ...] = ()
    # Whether the cluster runs a gang whose replicas differ (Volcano does; an Indexed Job has one pod
    # template). Unknown (not yet discovered) counts as no: such a gang then waits, it is not refused.
    runs_mixed_gangs: bool = True


@dataclass(frozen=True, slots=True)
class NodeShare:
    """GPUs a running gang holds on one node: node `node_index` of `pool`'s `free_gpus_per_node`."""

    pool: str
    node_index: int
    gpus: int


@dataclass(frozen=True, slots=True)
class RunningGang:
    """A gang that holds capacity (admitted, staging, dispatched or running)."""

    job_id: JobId
    tenant: TenantId
    priority: int
    cluster: ClusterName
    gpu_type: GpuType
    gpu_count: int
    priority_class: str = ""
    # False for gangs that must never be evicted (the class may also forbid it).
    preemptible: bool = True
    # Original queue time: a victim is requeued at this position.
    queued_at_s: float = 0.0
    grace_period_s: float | None = None
    # When the gang's run-time limit ends (None: unknown, treated as never, so no reservation counts on it).
    ends_at_s: float | None = None
    # Where the gang sits. Without it the placer cannot tell what evicting it frees, so never evicts it.
    nodes: tuple[NodeShare, ...] = ()
    # Evicted by an earlier cycle and inside its grace period: its GPUs will be free soon.
    terminating: bool = False
    # The queued gang an outstanding preemption order evicts it for (None: no order). Until it is
    # gone its GPUs count as freed for that gang: no new victims for it, none of them for others.
    evicted_for: JobId | None = None
    # What a move back to private GPUs (`placement.repatriate`, `PolicyConfig.repatriate`) needs to know;
    # the defaults mean "not movable". The capacity kind and price it runs at now; its replicas (the
    # shape to fit elsewhere) and the GPU types it accepts (empty: only the one it runs on); when it
    # started running (None: not yet, e.g. in the cloud's lead time); its work at speed 1.0 if known
    # (0: the run-time limit stands for it); and whether it can stop at a checkpoint and resume.
    kind: CapacityKind | None = None
    usd_per_gpu_hour: float = 0.0
    replica_gpus: tuple[int, ...] = ()
    gpu_types: tuple[GpuType, ...] = ()
    started_at_s: float | None = None
    expected_runtime_s: float = 0.0
    movable: bool = False


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scheduling cycle decides from. Built by federation; read-only here."""

    # A tuple, or the scheduler's carried queue (`placement.queue_chunks.ChunkedQueue`: chunks of
    # tuples, with the edits since the last cycle's queue, which a steady plan reads instead of it).
    queued: Sequence[GangRequest]
    running: tuple[RunningGang, ...]
    tenants: tuple[TenantQuota, ...]
    clusters: tuple[ClusterState, ...]
    priority_classes: tuple[PriorityClass, ...] = ()
    # Relative speed per GPU type (1.0 when not listed): an H100 at 2.0 does an A100's hour in half an hour.
    gpu_speeds: tuple[tuple[GpuType, float], ...] = ()
    egress_rates: tuple[EgressRate, ...] = ()
    policy: PolicyConfig = DEFAULT_POLICY
    # (variant, family) per GPU variant (`placement.gpu_types`): a quota on the family bounds its variants.
    gpu_families: tuple[tuple[GpuType, GpuType], ...] = ()


keep_as_values(GangRequest, NodePool, PoolSpec, ScalablePool, ClusterState, NodeShare, RunningGang, Snapshot)
