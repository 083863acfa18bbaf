"""The validated form of a `TrainingJob` manifest.

Users write YAML that a Volcano user would recognise (`federation.spec.training_job` parses and validates it);
everything past the API edge works with these frozen values instead, never with raw dicts or
protobuf messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from placement.model import GpuType, GpuTypePolicy, Pinning, TenantId
from placement.model_ids import NO_PINNING

API_VERSION = "gpufed.io/v1"
KIND = "TrainingJob"

# Annotations read by the simulated clusters only: how long the gang runs and how it exits.
SIM_DURATION_ANNOTATION = "sim.gpufed.io/duration"
SIM_EXIT_CODE_ANNOTATION = "sim.gpufed.io/exit-code"


class PodSecurityLevel(StrEnum):
    """Kubernetes' Pod Security Standards levels, as a tenant's policy (`federation.spec.pod_security`)."""

    PRIVILEGED = "privileged"
    BASELINE = "baseline"
    RESTRICTED = "restricted"


class RestartAction(StrEnum):
    """What happens to the whole gang when a pod fails or is evicted (Volcano's action names)."""

    RESTART_JOB = "RestartJob"
    ABORT_JOB = "AbortJob"


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A role in the gang (for example `master` or `worker`) with its replica count."""

    name: str
    replicas: int
    image: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    gpus_per_replica: int
    # The rest of the pod (`federation.spec.pod_template`): a PodTemplateSpec as compact JSON with
    # sorted keys, its main container without the image and command above; "" when the task has none.
    template: str = ""
    # An in-memory emptyDir at /dev/shm of this size (a Kubernetes quantity), or "" for the runtime's.
    shm_size: str = ""


@dataclass(frozen=True, slots=True)
class DatasetRef:
    name: str
    version: str | None = None

    def __str__(self) -> str:
        return self.name if self.version is None else f"{self.name}@{self.version}"


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """What a job writes that becomes a dataset version when it succeeds (issue 34): the job's own
    tenant's dataset `dataset` (new or existing), the objects under `path` in the store of the
    cluster it runs on, and the version's name (None: the job's id)."""

    dataset: str
    path: str
    version: str | None = None


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    on_failure: RestartAction = RestartAction.ABORT_JOB
    on_eviction: RestartAction = RestartAction.RESTART_JOB
    # How many times the whole gang may be restarted before the job fails.
    max_retries: int = 3


@dataclass(frozen=True, slots=True)
class TrainingJobSpec:
    name: str
    # None when the manifest leaves it out: the server fills in the caller's tenant.
    tenant: TenantId | None
    priority_class: str
    tasks: tuple[TaskSpec, ...]
    gpu_types: tuple[GpuType, ...]
    gpu_type_policy: GpuTypePolicy
    min_available: int
    max_runtime_s: int
    restart_policy: RestartPolicy
    allow_spot: bool = False
    # The job writes a checkpoint when its pods get SIGTERM and resumes from it when started again,
    # so gpufed may stop it and start it elsewhere without losing more than the time since: a cloud
    # gang that says so may be moved back to idle private GPUs (`placement.repatriate`).
    resumable: bool = False
    dataset: DatasetRef | None = None
    # Seconds since the epoch (UTC) by which the job should finish, if the user has a deadline.
    deadline_s: float | None = None
    # The longest the job may wait for private GPUs rather than pay cloud prices, from its queue
    # time (`spec.maxWait`; None: as its tenant's cost policy says; 0: never waits).
    max_wait_s: int | None = None
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    # The least memory each GPU must have (GiB), 0 for no bound; with no `gpu_types`, any type with it.
    min_gpu_memory_gib: int = 0
    # Clusters, regions and clouds the job must or must not run in (`spec.placement`).
    pinning: Pinning = NO_PINNING
    # The tenant's pod security level when the job was submitted (set by the server, not written in
    # the manifest): its pods were checked against it, and its namespace is labelled with it.
    pod_security: PodSecurityLevel = PodSecurityLevel.BASELINE
    # Datasets the job's objects become when it succeeds (`federation.datasets.outputs`).
    outputs: tuple[OutputSpec, ...] = ()

    @property
    def replica_count(self) -> int:
        return sum(t.replicas for t in self.tasks)

    @property
    def gpu_count(self) -> int:
        return sum(t.replicas * t.gpus_per_replica for t in self.tasks)

    @property
    def replica_gpus(self) -> tuple[int, ...]:
        return tuple(t.gpus_per_replica for t in self.tasks for _ in range(t.replicas))

    def annotation(self, key: str) -> str | None:
        for k, v in self.annotations:
            if k == key:
                return v
        return None
