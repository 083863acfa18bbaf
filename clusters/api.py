"""The contract every member cluster meets: inventory, gang dispatch, status, cancel.

Federation drives clusters only through `ClusterBackend`. A backend turns a `GangWorkload` into
whatever its cluster runs (a Volcano Job, an Indexed Job, or a simulated gang) and reports back in
`GangStatus`. Names are deterministic from job id and attempt, so a repeated dispatch after a crash
finds the gang it already created instead of starting a second copy.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from placement.model import CapacityKind, ClusterName, ClusterState, GpuType, JobId, NodeShare, TenantId


class GangPhase(StrEnum):
    """A gang's state as its cluster reports it."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    # A replica was evicted or its node was lost: the job's restart policy decides what follows.
    EVICTED = "EVICTED"
    CANCELLED = "CANCELLED"

    @property
    def is_final(self) -> bool:
        return self in {GangPhase.SUCCEEDED, GangPhase.FAILED, GangPhase.EVICTED, GangPhase.CANCELLED}


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One pod of the gang."""

    task: str
    index: int
    gpu_count: int
    image: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    # The rest of the pod, as the user's task template says (a PodTemplateSpec as JSON, "" for
    # none): volumes, resources, tolerations, ... The backend adds what gpufed owns (the GPUs, the
    # scheduler, node selection, labels, the rendezvous env); the federation checked it at submission.
    pod_template: str = ""


@dataclass(frozen=True, slots=True)
class GangSecret:
    """One of the tenant's secrets that the gang's pods reference, with its values, for the member
    cluster's Secret (issue 32). The values never show in a repr, so never in a log line."""

    name: str
    data: tuple[tuple[str, bytes], ...] = field(repr=False)


@dataclass(frozen=True, slots=True)
class GangWorkload:
    """A whole gang, ready to create on one cluster."""

    job_id: JobId
    attempt: int
    tenant: TenantId
    gpu_type: GpuType
    kind: CapacityKind
    priority_class: str
    replicas: tuple[ReplicaSpec, ...]
    min_available: int
    max_runtime_s: int
    # Simulated backends run the gang for this long; real clusters ignore it.
    sim_duration_s: float | None = None
    # Simulated backends end the gang with this exit code (non-zero fails it).
    sim_exit_code: int = 0
    # Other `sim.gpufed.io/*` annotations of the job (an OOM kill, an image that never pulls), put
    # on its pods for a simulated kubelet; a real kubelet ignores them.
    sim_annotations: tuple[tuple[str, str], ...] = ()
    # The Pod Security Standards level the gang's pods were checked against: the tenant's namespace
    # on the member cluster is labelled `pod-security.kubernetes.io/enforce` with it.
    pod_security: str = "baseline"
    # The tenant's secrets the pods reference by name (their templates' secretKeyRef, envFrom,
    # secret volumes): copied into one Secret of the gang's, in its namespace, for its lifetime.
    secrets: tuple[GangSecret, ...] = ()

    @property
    def name(self) -> str:
        return gang_name(self.job_id, self.attempt)

    @property
    def gpu_count(self) -> int:
        return sum(r.gpu_count for r in self.replicas)


def gang_name(job_id: JobId, attempt: int) -> str:
    """The deterministic object name of a job's attempt: the same dispatch twice names one object."""
    return f"{job_id}-a{attempt}"


@dataclass(frozen=True, slots=True)
class GangStatus:
    job_id: JobId
    attempt: int
    phase: GangPhase
    message: str = ""
    started_at_s: float | None = None
    finished_at_s: float | None = None
    # Where a gang holds GPUs, by the node indices of `inventory()`'s free_gpus_per_node (the placer
    # adds them back to see what evicting it would free; for a PENDING gang, only its pods already
    # bound). Empty when finished, or partly on nodes the inventory leaves out: a partial location
    # would miscount.
    nodes: tuple[NodeShare, ...] = ()
    # GPUs of the gang's pods that the same pod view the inventory is computed from has seen bound
    # to a node (still holding them or finished); None where the backend accounts a gang's GPUs in
    # its inventory the moment it accepts the gang (the in-memory cluster). The federation holds
    # back the rest of a live gang's GPUs, which its cluster's inventory does not show yet.
    bound_gpus: int | None = None
    # Pods of this attempt that still exist unfinished (pending, running, or stopping): the attempt
    # is over on the cluster only once this is 0, however its gang object says it ended. Backends
    # that model no pods (the in-memory cluster) report 0.
    live_pods: int = 0
    # When the gang's pods ended, by their containers' own finishedAt: set once every replica's pod
    # is there and finished, None while one runs or is gone without a trace (then only the time it
    # was noticed gone is known). An attempt held back for its pods is charged to this.
    pods_ended_at_s: float | None = None
    # The gang's own object is gone (a third party deleted it, perhaps with `--cascade=orphan`)
    # while pods or other objects of the attempt are left; `cancel` removes what is left.
    orphaned: bool = False


@dataclass(frozen=True, slots=True)
class VanishedAttempt:
    """When an attempt's pods ran, as the cluster showed them before they were deleted."""

    started_at_s: float
    ended_at_s: float


@runtime_checkable
class RemembersVanished(Protocol):
    """A backend that can say when the pods of an attempt that is gone from its cluster ran.

    Asked only for an attempt `statuses()` no longer reports: a gang a third party deleted between
    two looks of the reconciler, which never saw it running, is still charged for what it held.
    """

    def vanished(self, job_id: JobId, attempt: int) -> VanishedAttempt | None: ...


class ClusterError(Exception):
    """Root of the errors a backend raises. `retryable` says whether trying again may help."""

    retryable: bool = True


class ClusterUnreachable(ClusterError):
    retryable = True


class GangRejected(ClusterError):
    """The cluster will not take the gang as asked (it does not fit, or the spec is unusable)."""

    retryable = False


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """One pod of a gang as `kubectl describe pod` would sum it up (for `gpufed describe`).

    `index` is the pod's gang-wide rank when `by_rank` (an Indexed Job's completion index), else
    its index within `task` (a Volcano task); federation maps either to the spec's task/replica.
    """

    pod: str
    task: str
    index: int
    by_rank: bool
    node: str
    phase: str
    restarts: int
    # The container's last exit code (None while it never ended).
    exit_code: int | None
    # Why it waits or ended: OOMKilled, Error, ImagePullBackOff, Evicted, ...; "" while all is well.
    reason: str
    message: str
    started_at_s: float | None = None
    finished_at_s: float | None = None
    container: str = ""


@dataclass(frozen=True, slots=True)
class GangEvent:
    """A Kubernetes Event about one of the gang's objects (the gang, its pods)."""

    object_kind: str
    object_name: str
    type: str
    reason: str
    message: str
    count: int
    last_at_s: float | None


@dataclass(frozen=True, slots=True)
class LogOptions:
    """The pod log API's options (`GET .../pods/{name}/log`), passed through as they are."""

    follow: bool = False
    tail_lines: int | None = None
    since_s: int | None = None
    timestamps: bool = False
    previous: bool = False
    limit_bytes: int | None = None


class LogUnavailable(ClusterError):
    """The cluster answered but has no log to give (the pod is gone, or has not started)."""

    retryable = False


@runtime_checkable
class GangInspector(Protocol):
    """What a backend can show of a gang beyond its status: its pods, their events and logs.

    Apart from `ClusterBackend` so that a backend (or a test's fake) without it still drives
    jobs; the logs service asks each backend whether it is one.
    """

    async def replicas(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[ReplicaState]:
        """The attempt's pods that exist now, with their status details."""
        ...

    async def events(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[GangEvent]:
        """Events of the attempt's gang object and pods, oldest first."""
        ...

    def pod_log(self, tenant: TenantId, replica: ReplicaState, options: LogOptions) -> AsyncIterator[bytes]:
        """The pod's log in chunks of whole lines; with `follow`, until its container ends.
        Raises ClusterUnreachable (no answer) or LogUnavailable (no such log)."""
        ...


@runtime_checkable
class KilledPodLogs(Protocol):
    """A GangInspector that read the logs of pods killed while they ran, as they went (a drain, an
    eviction): the keeper of an ended attempt asks for them once no pod of the gang is left."""

    async def killed_replicas(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[ReplicaState]:
        """The attempt's killed pods whose logs were read (`pod_log` serves them), gone or not."""
        ...


class ClusterBackend(Protocol):
    """One member cluster."""

    @property
    def name(self) -> ClusterName: ...

    async def inventory(self) -> ClusterState:
        """The cluster's description and its free GPUs per node, by pool."""
        ...

    async def dispatch(self, gang: GangWorkload) -> None:
        """Create the whole gang or nothing. Idempotent: a gang that exists is left as it is."""
        ...

    async def statuses(self) -> Sequence[GangStatus]:
        """Every gang this cluster knows of, finished ones included until they are deleted."""
        ...

    async def observe(self) -> tuple[Sequence[GangStatus], ClusterState]:
        """`statuses()` and `inventory()` as of one instant: a pod bound between two separate reads
        would be unbound in one and hold its GPUs in the other. The scheduler's cycle reads both
        this way, as it holds back exactly the GPUs of live gangs that the inventory does not show."""
        ...

    async def cancel(self, job_id: JobId, attempt: int, grace_period_s: float) -> None:
        """Stop the gang (if it runs) and delete its objects, with every pod, service and pod group
        of the attempt that outlived its gang object. Cancelling a missing gang is fine."""
        ...

    async def release_secrets(self, tenant: TenantId, job_id: JobId, attempt: int) -> None:
        """Delete the attempt's copy of its tenant's secrets (`GangWorkload.secrets`) once the attempt
        has ended: its finished gang is kept a while for its logs, the secrets are not. Releasing an
        attempt that had none is fine."""
        ...

    async def evict(self, job_id: JobId, attempt: int, grace_period_s: float, reason: str) -> None:
        """Preempt the gang: its pods get `grace_period_s` to stop, and it reports EVICTED with
        `reason` as its message by the time they have (unless it finishes first). Until its pods
        stop, `inventory()` counts their GPUs as used. Evicting again keeps the first reason, and the
        gang stops no later than the shortest grace period asked. Evicting a missing or finished gang
        is fine."""
        ...
