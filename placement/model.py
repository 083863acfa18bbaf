"""Immutable value types shared by the placer and every edge package.

The placer is a pure function from a `Snapshot` to a `Plan`. Everything it reads or returns is
defined here, frozen and slotted, so that a plan can be replayed from a recorded snapshot and two
equal snapshots always give equal plans. Edge packages (`clusters`, `datasync`, `iac`) import these
types, never each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import NewType

JobId = NewType("JobId", str)
TenantId = NewType("TenantId", str)
ClusterName = NewType("ClusterName", str)
# A GPU product as the placer compares them: "A100", "H100", "L4", ...
GpuType = NewType("GpuType", str)


class JobPhase(StrEnum):
    """Where a job is in its life. Transitions are checked against one table (federation.jobs)."""

    QUEUED = "QUEUED"
    ADMITTED = "ADMITTED"
    STAGING = "STAGING"
    DISPATCHED = "DISPATCHED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_PHASES

    @property
    def holds_capacity(self) -> bool:
        """Phases in which the job's gang counts against quota and cluster capacity."""
        return self in _CAPACITY_PHASES


_TERMINAL_PHASES = frozenset({JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED})
_CAPACITY_PHASES = frozenset({JobPhase.ADMITTED, JobPhase.STAGING, JobPhase.DISPATCHED, JobPhase.RUNNING})


class Provider(StrEnum):
    PRIVATE = "private"
    AWS = "aws"
    GCP = "gcp"
    AZURE = "azure"
    LAMBDA = "lambda"
    NEBIUS = "nebius"


class CapacityKind(StrEnum):
    """How a GPU is paid for: owned capacity at an internal rate, or cloud on demand or spot."""

    PRIVATE = "private"
    ON_DEMAND = "on_demand"
    SPOT = "spot"


class GpuTypePolicy(StrEnum):
    """How a job's list of acceptable GPU types is read."""

    # Try the types in the order given; a later type is used only when no earlier one fits.
    ORDERED = "ordered"
    # Any type in the set is acceptable; the cheapest fit wins.
    ANY = "any"


@dataclass(frozen=True, slots=True)
class GangRequest:
    """What the placer needs to know of one queued job: a gang that starts whole or not at all."""

    job_id: JobId
    tenant: TenantId
    priority: int
    # Position in the queue: submission time, kept across requeues so a victim keeps its place.
    queued_at_s: float
    # GPUs each replica needs, one entry per replica across all tasks (master and workers).
    replica_gpus: tuple[int, ...]
    gpu_types: tuple[GpuType, ...]
    gpu_type_policy: GpuTypePolicy = GpuTypePolicy.ORDERED
    allow_spot: bool = False
    max_runtime_s: int = 0
    dataset: str | None = None

    @property
    def gpu_count(self) -> int:
        return sum(self.replica_gpus)


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

    def with_free(self, free_gpus_per_node: tuple[int, ...]) -> NodePool:
        """The pool as the placer sees it, given each schedulable node's free GPUs."""
        return NodePool(
            name=self.name,
            gpu_type=self.gpu_type,
            kind=self.kind,
            usd_per_gpu_hour=self.usd_per_gpu_hour,
            gpus_per_node=self.gpus_per_node,
            free_gpus_per_node=free_gpus_per_node,
        )


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


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """A tenant's limits. The full quota model (guaranteed, borrowing, lending) is the placer's issue."""

    tenant: TenantId
    # Hard cap on GPUs held at once, per GPU type; a type not listed is uncapped.
    gpu_caps: tuple[tuple[GpuType, int], ...] = ()

    def cap_for(self, gpu_type: GpuType) -> int | None:
        for listed_type, cap in self.gpu_caps:
            if listed_type == gpu_type:
                return cap
        return None


@dataclass(frozen=True, slots=True)
class RunningGang:
    """A gang that holds capacity (admitted, staging, dispatched or running)."""

    job_id: JobId
    tenant: TenantId
    priority: int
    cluster: ClusterName
    gpu_type: GpuType
    gpu_count: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scheduling cycle decides from. Built by federation; read-only here."""

    queued: tuple[GangRequest, ...]
    running: tuple[RunningGang, ...]
    tenants: tuple[TenantQuota, ...]
    clusters: tuple[ClusterState, ...]


@dataclass(frozen=True, slots=True)
class Admission:
    """A decision to run a job's whole gang on one cluster, on one GPU type, at one price."""

    job_id: JobId
    cluster: ClusterName
    gpu_type: GpuType
    kind: CapacityKind
    usd_per_gpu_hour: float


class WaitCode(StrEnum):
    """Why a job was not admitted this cycle. Specific enough for a user to act on."""

    NO_CLUSTER_HAS_GPU_TYPE = "no_cluster_has_gpu_type"
    INSUFFICIENT_CAPACITY = "insufficient_capacity"
    TENANT_CAP_REACHED = "tenant_cap_reached"
    UNKNOWN_TENANT = "unknown_tenant"
    CLUSTER_UNREACHABLE = "cluster_unreachable"
    SPOT_NOT_ALLOWED = "spot_not_allowed"
    GANG_LARGER_THAN_CLUSTER = "gang_larger_than_cluster"


@dataclass(frozen=True, slots=True)
class WaitReason:
    code: WaitCode
    message: str
    cluster: ClusterName | None = None
    gpu_type: GpuType | None = None


@dataclass(frozen=True, slots=True)
class Waiting:
    job_id: JobId
    reasons: tuple[WaitReason, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """The placer's output: what to admit, and for every job left waiting, why."""

    admissions: tuple[Admission, ...] = ()
    waiting: tuple[Waiting, ...] = field(default_factory=tuple)
