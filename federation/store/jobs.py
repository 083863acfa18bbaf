"""A job as federation stores it, and the one table that says which phase may follow which.

Every phase change goes through `JobRecord.transition`, which checks the table and records an event,
so the history a user sees through `get`/`watch` and the rule the reconcilers obey cannot drift
apart. Each transition has exactly one owning component (named in the table) that may write it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import msgspec

from federation.errors import InvalidTransition
from federation.spec.jobspec import (
    DatasetRef,
    OutputSpec,
    PodSecurityLevel,
    RestartAction,
    RestartPolicy,
    TaskSpec,
    TrainingJobSpec,
)
from federation.store.schema_version import check_json
from placement.model import (
    CapacityKind,
    ClusterName,
    GangRequest,
    GpuType,
    GpuTypePolicy,
    JobId,
    JobPhase,
    Pinning,
    RunningGang,
    TenantId,
)
from placement.model_ids import PINNING_FIELDS


class Owner(StrEnum):
    """The component that writes a transition. One writer per transition keeps races explicit."""

    API = "api"
    SCHEDULER = "scheduler"
    DISPATCHER = "dispatcher"
    STATUS = "status"


Q, AD, ST, DI, RU = (
    JobPhase.QUEUED,
    JobPhase.ADMITTED,
    JobPhase.STAGING,
    JobPhase.DISPATCHED,
    JobPhase.RUNNING,
)
SU, FA, CA = JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED

# (from, to) -> owner. QUEUED is also a target: a requeue (cluster rejected the gang, the gang was
# evicted and the restart policy says restart, or the cluster was lost) goes back to the queue.
TRANSITIONS: dict[tuple[JobPhase, JobPhase], Owner] = {
    (Q, AD): Owner.SCHEDULER,
    (Q, CA): Owner.DISPATCHER,
    (AD, ST): Owner.DISPATCHER,
    (AD, DI): Owner.DISPATCHER,
    (AD, Q): Owner.DISPATCHER,
    (AD, CA): Owner.DISPATCHER,
    # A secret the job references was deleted before its gang could be created (federation.secrets).
    (AD, FA): Owner.DISPATCHER,
    (ST, DI): Owner.DISPATCHER,
    (ST, Q): Owner.DISPATCHER,
    (ST, FA): Owner.DISPATCHER,
    (ST, CA): Owner.DISPATCHER,
    (DI, RU): Owner.STATUS,
    (DI, SU): Owner.STATUS,
    (DI, FA): Owner.STATUS,
    (DI, Q): Owner.STATUS,
    (DI, CA): Owner.DISPATCHER,
    (RU, SU): Owner.STATUS,
    (RU, FA): Owner.STATUS,
    (RU, Q): Owner.STATUS,
    (RU, CA): Owner.DISPATCHER,
}


@dataclass(frozen=True, slots=True)
class PhaseEvent:
    phase: JobPhase
    at_s: float
    attempt: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class JobPlacement:
    """Where the scheduler put the current attempt, and at what price."""

    cluster: ClusterName
    gpu_type: GpuType
    kind: CapacityKind
    usd_per_gpu_hour: float


@dataclass(frozen=True, slots=True)
class BurstOffer:
    """What bursting at once would have cost an attempt (issue 35): the cheapest public offer the
    placer saw for the gang in the first cycle that considered this attempt, while it chose to wait
    for private GPUs or placed it. The savings report prices the attempt's run at this offer for the
    counterfactual ("burst at once") against what the ledger says it paid, and the extra queueing
    time from `seen_at_s`. None when no public offer fitted the gang then (nothing to burst to).
    """

    cluster: ClusterName
    gpu_type: GpuType
    kind: CapacityKind
    usd_per_gpu_hour: float
    seen_at_s: float
    attempt: int


@dataclass(frozen=True, slots=True)
class PreemptionOrder:
    """The scheduler's decision to evict this job's running gang so that another job fits, or, for
    a move (`move_to`), so that the job resumes from its checkpoint on idle private GPUs.

    Written by the scheduler on the running job's record (a compare-and-swap like any decision);
    the reconciler then evicts the gang with the grace period and, once the cluster reports it
    gone, requeues the job at its original queue position without charging a retry.
    """

    for_job: JobId
    reason: str
    grace_period_s: float
    requested_at_s: float
    requeue_queued_at_s: float
    # Set when the order is a move, not a preemption (`placement.repatriate`): the job itself is
    # `for_job`, and it stops at a checkpoint to resume on this private cluster's idle GPUs of this
    # type, which the snapshot holds for it until it is requeued.
    move_to: ClusterName | None = None
    move_gpu_type: GpuType | None = None


@dataclass(frozen=True, slots=True)
class DispatchRefusal:
    """A cluster refused (or did not take) this job's dispatch `count` times in a row.

    Kept on the record, so that the backoff outlives a leader change and is fenced like every other
    write; `federation.scheduling.dispatch_backoff` decides with it. A dispatch that succeeds clears it.
    """

    cluster: ClusterName
    count: int
    first_at_s: float
    last_at_s: float
    retry_at_s: float
    error: str


@dataclass(frozen=True, slots=True)
class JobRecord:
    job_id: JobId
    tenant: TenantId
    user: str
    spec: TrainingJobSpec
    phase: JobPhase
    submitted_at_s: float
    # Queue position; kept when a job is requeued so that it does not go to the back.
    queued_at_s: float
    priority: int
    attempt: int = 1
    # Restarts charged to the job's restart policy. A new attempt forced by the federation (its
    # cluster was lost) is not the job's fault, so attempts and retries are counted apart.
    retries_used: int = 0
    placement: JobPlacement | None = None
    cancel_requested: bool = False
    message: str = ""
    events: tuple[PhaseEvent, ...] = ()
    # Set while the current attempt's gang is being evicted for another job; cleared on requeue.
    preemption: PreemptionOrder | None = None
    # Clusters that refused this job's dispatch, each backing off (federation.scheduling.dispatch_backoff).
    refusals: tuple[DispatchRefusal, ...] = ()
    # Why the job failed or its attempt waits (OOMKilled, Error (exit 3), ImagePullBackOff),
    # from its pods; written by the reconciler (federation.joblogs.archive), shown by get/list.
    reason: str = ""
    # The job set it belongs to (issue 34, federation.jobsets), "" for a job submitted alone; and
    # its index when the set is an array. Records written before the fields existed have neither.
    job_set: str = ""
    array_index: int | None = None
    # The current attempt's burst-at-once alternative, written by the scheduler (issue 35); None on
    # records written before the field existed and while the placer has not yet considered it.
    burst_offer: BurstOffer | None = None
    # The digest of the submission's idempotency key, which names its key in etcd
    # (`job_store.IDEM`/<tenant>/<digest>), written by `create_job`: the archiver removes that key by
    # name. "" on records written before the field existed (the archiver then looks for it).
    idempotency_digest: str = ""

    def transition(
        self, to: JobPhase, *, by: Owner, at_s: float, reason: str = "", **changes: Any
    ) -> JobRecord:
        """The record after a checked phase change. Raises InvalidTransition if the table forbids it."""
        owner = TRANSITIONS.get((self.phase, to))
        if owner is None:
            raise InvalidTransition(f"job {self.job_id}: {self.phase} -> {to} is not a valid transition")
        if owner is not by:
            raise InvalidTransition(
                f"job {self.job_id}: {self.phase} -> {to} is written by {owner}, not {by}"
            )
        if to is JobPhase.QUEUED:
            # Back in the queue, nothing is being evicted any more: a new attempt starts clean.
            changes.setdefault("preemption", None)
        attempt = int(changes.get("attempt", self.attempt))
        event = PhaseEvent(phase=to, at_s=at_s, attempt=attempt, reason=reason)
        return replace(self, phase=to, message=reason, events=(*self.events, event), **changes)

    def gang_request(self) -> GangRequest:
        return GangRequest(
            job_id=self.job_id,
            tenant=self.tenant,
            priority=self.priority,
            queued_at_s=self.queued_at_s,
            replica_gpus=self.spec.replica_gpus,
            gpu_types=self.spec.gpu_types,
            gpu_type_policy=self.spec.gpu_type_policy,
            allow_spot=self.spec.allow_spot,
            max_runtime_s=self.spec.max_runtime_s,
            dataset=None if self.spec.dataset is None else str(self.spec.dataset),
        )

    def running_gang(self) -> RunningGang | None:
        if not self.phase.holds_capacity or self.placement is None:
            return None
        return RunningGang(
            job_id=self.job_id,
            tenant=self.tenant,
            priority=self.priority,
            cluster=self.placement.cluster,
            gpu_type=self.placement.gpu_type,
            gpu_count=self.spec.gpu_count,
        )


# ---- storage codec: the JSON kept in etcd. Explicit, so that a field rename is a visible change.


def spec_to_dict(spec: TrainingJobSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "tenant": spec.tenant,
        "priority_class": spec.priority_class,
        "tasks": [
            {
                "name": t.name,
                "replicas": t.replicas,
                "image": t.image,
                "command": list(t.command),
                "env": [list(kv) for kv in t.env],
                "gpus_per_replica": t.gpus_per_replica,
                # Only tasks with a pod template or shared memory carry these (issue 32).
                **({"template": t.template} if t.template else {}),
                **({"shm_size": t.shm_size} if t.shm_size else {}),
            }
            for t in spec.tasks
        ],
        "gpu_types": list(spec.gpu_types),
        "gpu_type_policy": spec.gpu_type_policy.value,
        "min_available": spec.min_available,
        "max_runtime_s": spec.max_runtime_s,
        "restart_policy": {
            "on_failure": spec.restart_policy.on_failure.value,
            "on_eviction": spec.restart_policy.on_eviction.value,
            "max_retries": spec.restart_policy.max_retries,
        },
        "allow_spot": spec.allow_spot,
        "resumable": spec.resumable,
        "dataset": None
        if spec.dataset is None
        else {"name": spec.dataset.name, "version": spec.dataset.version},
        "deadline_s": spec.deadline_s,
        # Only where the job sets it (issue 35).
        **({} if spec.max_wait_s is None else {"max_wait_s": spec.max_wait_s}),
        "labels": [list(kv) for kv in spec.labels],
        "annotations": [list(kv) for kv in spec.annotations],
        # Only a tenant's level other than the default is written (issue 32).
        **({} if spec.pod_security is PodSecurityLevel.BASELINE else {"pod_security": spec.pod_security}),
        # GPU memory and placement rules, only where the job sets them (issue 32).
        **({"min_gpu_memory_gib": spec.min_gpu_memory_gib} if spec.min_gpu_memory_gib else {}),
        **({"pinning": {f: list(getattr(spec.pinning, f)) for f in PINNING_FIELDS}} if spec.pinning else {}),
        # Outputs that become dataset versions, only where the job declares some (issue 34).
        **(
            {"outputs": [{"dataset": o.dataset, "path": o.path, "version": o.version} for o in spec.outputs]}
            if spec.outputs
            else {}
        ),
    }


def _pairs(raw: list[list[str]]) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in raw)


def spec_from_dict(d: dict[str, Any]) -> TrainingJobSpec:
    rp = d["restart_policy"]
    ds = d["dataset"]
    return TrainingJobSpec(
        name=d["name"],
        tenant=None if d["tenant"] is None else TenantId(d["tenant"]),
        priority_class=d["priority_class"],
        tasks=tuple(
            TaskSpec(
                name=t["name"],
                replicas=int(t["replicas"]),
                image=t["image"],
                command=tuple(t["command"]),
                env=_pairs(t["env"]),
                gpus_per_replica=int(t["gpus_per_replica"]),
                template=str(t.get("template", "")),
                shm_size=str(t.get("shm_size", "")),
            )
            for t in d["tasks"]
        ),
        gpu_types=tuple(GpuType(g) for g in d["gpu_types"]),
        gpu_type_policy=GpuTypePolicy(d["gpu_type_policy"]),
        min_available=int(d["min_available"]),
        max_runtime_s=int(d["max_runtime_s"]),
        restart_policy=RestartPolicy(
            on_failure=RestartAction(rp["on_failure"]),
            on_eviction=RestartAction(rp["on_eviction"]),
            max_retries=int(rp["max_retries"]),
        ),
        allow_spot=bool(d["allow_spot"]),
        # Records written before the field existed: not resumable, as their manifests said nothing.
        resumable=bool(d.get("resumable", False)),
        dataset=None if ds is None else DatasetRef(name=ds["name"], version=ds["version"]),
        deadline_s=d["deadline_s"],
        max_wait_s=None if d.get("max_wait_s") is None else int(d["max_wait_s"]),
        labels=_pairs(d["labels"]),
        annotations=_pairs(d["annotations"]),
        pod_security=PodSecurityLevel(d.get("pod_security", PodSecurityLevel.BASELINE.value)),
        min_gpu_memory_gib=int(d.get("min_gpu_memory_gib", 0)),
        pinning=Pinning(
            **{f: tuple(str(v) for v in (d.get("pinning") or {}).get(f, ())) for f in PINNING_FIELDS}
        ),
        outputs=tuple(
            OutputSpec(
                str(o["dataset"]), str(o["path"]), None if o.get("version") is None else str(o["version"])
            )
            for o in d.get("outputs") or ()
        ),
    )


def job_to_dict(job: JobRecord) -> dict[str, Any]:
    p = job.placement
    return {
        "job_id": job.job_id,
        "tenant": job.tenant,
        "user": job.user,
        "spec": spec_to_dict(job.spec),
        "phase": job.phase.value,
        "submitted_at_s": job.submitted_at_s,
        "queued_at_s": job.queued_at_s,
        "priority": job.priority,
        "attempt": job.attempt,
        "retries_used": job.retries_used,
        "placement": None
        if p is None
        else {
            "cluster": p.cluster,
            "gpu_type": p.gpu_type,
            "kind": p.kind.value,
            "usd_per_gpu_hour": p.usd_per_gpu_hour,
        },
        "cancel_requested": job.cancel_requested,
        "preemption": None
        if job.preemption is None
        else {
            "for_job": job.preemption.for_job,
            "reason": job.preemption.reason,
            "grace_period_s": job.preemption.grace_period_s,
            "requested_at_s": job.preemption.requested_at_s,
            "requeue_queued_at_s": job.preemption.requeue_queued_at_s,
            "move_to": job.preemption.move_to,
            "move_gpu_type": job.preemption.move_gpu_type,
        },
        "message": job.message,
        "reason": job.reason,
        "refusals": [
            {
                "cluster": r.cluster,
                "count": r.count,
                "first_at_s": r.first_at_s,
                "last_at_s": r.last_at_s,
                "retry_at_s": r.retry_at_s,
                "error": r.error,
            }
            for r in job.refusals
        ],
        "events": [
            {"phase": e.phase.value, "at_s": e.at_s, "attempt": e.attempt, "reason": e.reason}
            for e in job.events
        ],
        # Only a set's jobs carry these: every other record stays as it was written before them.
        **({"job_set": job.job_set, "array_index": job.array_index} if job.job_set else {}),
        **({"burst_offer": burst_offer_to_dict(job.burst_offer)} if job.burst_offer else {}),
        **({"idempotency_digest": job.idempotency_digest} if job.idempotency_digest else {}),
    }


def burst_offer_to_dict(b: BurstOffer) -> dict[str, Any]:
    return {
        "cluster": b.cluster,
        "gpu_type": b.gpu_type,
        "kind": b.kind.value,
        "usd_per_gpu_hour": b.usd_per_gpu_hour,
        "seen_at_s": b.seen_at_s,
        "attempt": b.attempt,
    }


def burst_offer_from_dict(d: dict[str, Any] | None) -> BurstOffer | None:
    if d is None:
        return None
    return BurstOffer(
        cluster=ClusterName(d["cluster"]),
        gpu_type=GpuType(d["gpu_type"]),
        kind=CapacityKind(d["kind"]),
        usd_per_gpu_hour=float(d["usd_per_gpu_hour"]),
        seen_at_s=float(d["seen_at_s"]),
        attempt=int(d["attempt"]),
    )


# Phases by their value: a dict lookup, where `JobPhase(value)` costs a few microseconds, and a
# restart decodes every job's events (federation.store.job_cache).
_PHASES: dict[str, JobPhase] = {p.value: p for p in JobPhase}


def job_from_dict(d: dict[str, Any]) -> JobRecord:
    p = d["placement"]
    return JobRecord(
        job_id=JobId(d["job_id"]),
        tenant=TenantId(d["tenant"]),
        user=d["user"],
        spec=spec_from_dict(d["spec"]),
        phase=_PHASES[d["phase"]],
        submitted_at_s=float(d["submitted_at_s"]),
        queued_at_s=float(d["queued_at_s"]),
        priority=int(d["priority"]),
        attempt=int(d["attempt"]),
        # Records written before the field existed counted every new attempt as a retry.
        retries_used=int(d.get("retries_used", int(d["attempt"]) - 1)),
        placement=None
        if p is None
        else JobPlacement(
            cluster=ClusterName(p["cluster"]),
            gpu_type=GpuType(p["gpu_type"]),
            kind=CapacityKind(p["kind"]),
            usd_per_gpu_hour=float(p["usd_per_gpu_hour"]),
        ),
        cancel_requested=bool(d["cancel_requested"]),
        preemption=_preemption_from_dict(d.get("preemption")),
        refusals=tuple(
            DispatchRefusal(
                cluster=ClusterName(r["cluster"]),
                count=int(r["count"]),
                first_at_s=float(r["first_at_s"]),
                last_at_s=float(r["last_at_s"]),
                retry_at_s=float(r["retry_at_s"]),
                error=str(r["error"]),
            )
            for r in d.get("refusals") or ()
        ),
        message=d["message"],
        reason=str(d.get("reason", "")),
        job_set=str(d.get("job_set", "")),
        array_index=None if d.get("array_index") is None else int(d["array_index"]),
        burst_offer=burst_offer_from_dict(d.get("burst_offer")),
        idempotency_digest=str(d.get("idempotency_digest", "")),
        events=tuple(
            [
                PhaseEvent(
                    phase=_PHASES[e["phase"]],
                    at_s=float(e["at_s"]),
                    attempt=int(e["attempt"]),
                    reason=e["reason"],
                )
                for e in d["events"]
            ]
        ),
    )


# JSON straight into the dataclasses, typed by their annotations (msgspec): a 1.2 KB record in
# about 13 µs where `json.loads` and `job_from_dict` take 60 to 80 µs. A restart decodes every job
# in etcd before it serves (issue 19), so this is most of its time. Field names in the stored JSON
# are the dataclasses' own, which is what makes the typed decode possible; keys it does not know
# are ignored, as `job_from_dict` ignores them.
_JOB_JSON = msgspec.json.Decoder(JobRecord)


def job_from_json(raw: bytes | str, key: bytes | str | None = None) -> JobRecord:
    """A stored job record's JSON as a `JobRecord`, the same as `job_from_dict(json.loads(raw))`.

    The typed decode is tried first. Anything it refuses (a value of another JSON type than the
    field's, which `job_from_dict` would coerce, or a record that is not one) goes the old way,
    which raises as it always did. One default differs between the two: a record written before
    `retries_used` existed counts `attempt - 1` retries where the dataclass says 0, so a decoded
    record that might be such a one (retries 0 on a later attempt) is decoded the old way too.
    A record of a newer schema version than this build's raises `SchemaTooNew` naming `key`."""
    check_json(raw, key)
    try:
        job = _JOB_JSON.decode(raw)
    except msgspec.DecodeError:  # ValidationError too
        return job_from_dict(json.loads(raw))
    if job.retries_used == 0 and job.attempt > 1:
        return job_from_dict(json.loads(raw))
    return job


class JobHead(msgspec.Struct, frozen=True):
    """What the job cache files a job by (`federation.store.job_cache_index`), decoded from its
    record without the rest: a tenth of the time of the whole record."""

    job_id: JobId
    tenant: TenantId
    phase: JobPhase
    submitted_at_s: float


_HEAD_JSON = msgspec.json.Decoder(JobHead)


def job_head_from_json(raw: bytes | str) -> JobHead | None:
    """The head of a stored job record (as `job_from_json` would give those fields), or None when
    the typed decode refuses it: then decode the whole record, which says what is wrong with it."""
    try:
        return _HEAD_JSON.decode(raw)
    except msgspec.DecodeError:
        return None


def _preemption_from_dict(d: dict[str, Any] | None) -> PreemptionOrder | None:
    if d is None:
        return None
    return PreemptionOrder(
        for_job=JobId(d["for_job"]),
        reason=d["reason"],
        grace_period_s=float(d["grace_period_s"]),
        requested_at_s=float(d["requested_at_s"]),
        requeue_queued_at_s=float(d["requeue_queued_at_s"]),
        move_to=None if d.get("move_to") is None else ClusterName(d["move_to"]),
        move_gpu_type=None if d.get("move_gpu_type") is None else GpuType(d["move_gpu_type"]),
    )
