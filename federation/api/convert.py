"""Domain values to protobuf messages. Protobuf stays at the API edge; nothing inside uses it."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from federation.api.v1 import gpufed_pb2 as pb
from federation.spec.training_job import render_manifest
from federation.store.jobs import JobRecord
from placement.model import ClusterState, JobPhase, WaitReason

_PHASES: dict[JobPhase, pb.JobPhase.ValueType] = {
    JobPhase.QUEUED: pb.JOB_PHASE_QUEUED,
    JobPhase.ADMITTED: pb.JOB_PHASE_ADMITTED,
    JobPhase.STAGING: pb.JOB_PHASE_STAGING,
    JobPhase.DISPATCHED: pb.JOB_PHASE_DISPATCHED,
    JobPhase.RUNNING: pb.JOB_PHASE_RUNNING,
    JobPhase.SUCCEEDED: pb.JOB_PHASE_SUCCEEDED,
    JobPhase.FAILED: pb.JOB_PHASE_FAILED,
    JobPhase.CANCELLED: pb.JOB_PHASE_CANCELLED,
}
_PHASES_BACK = {v: k for k, v in _PHASES.items()}


def phase_to_pb(phase: JobPhase) -> pb.JobPhase.ValueType:
    return _PHASES[phase]


def phase_from_pb(value: pb.JobPhase.ValueType) -> JobPhase | None:
    return _PHASES_BACK.get(value)


def phase_name(value: pb.JobPhase.ValueType) -> str:
    """`JOB_PHASE_RUNNING` -> `RUNNING`, for people."""
    return pb.JobPhase.Name(value).removeprefix("JOB_PHASE_")


def timestamp(at_s: float) -> Timestamp:
    ts = Timestamp()
    _set_time(ts, at_s)
    return ts


def _set_time(field: Timestamp, at_s: float) -> None:
    """`field` (a message's own, filled in place) set to `at_s`, rounded as every timestamp here."""
    field.FromNanoseconds(int(at_s * 1e9))


def job_to_pb(job: JobRecord, *, with_manifest: bool = False) -> pb.Job:
    """The job as the API shows it. Every reply with a job (a submission's, each of a list's, each
    watch event) builds one: its timestamps and events are filled in place, where messages made
    apart and given to the constructor were each copied into it again."""
    placed = job.placement
    spec = job.spec
    shown = pb.Job(
        job_id=job.job_id,
        name=spec.name,
        tenant=job.tenant,
        user=job.user,
        phase=_PHASES[job.phase],
        attempt=job.attempt,
        priority_class=spec.priority_class,
        priority=job.priority,
        replica_count=spec.replica_count,
        gpu_count=spec.gpu_count,
        gpu_types=spec.gpu_types,
        cluster=placed.cluster if placed else "",
        gpu_type=placed.gpu_type if placed else "",
        capacity_kind=placed.kind.value if placed else "",
        usd_per_gpu_hour=placed.usd_per_gpu_hour if placed else 0.0,
        message=job.message,
        cancel_requested=job.cancel_requested,
        manifest=render_manifest(spec) if with_manifest else "",
        dataset=str(spec.dataset) if spec.dataset else "",
        reason=job.reason,
    )
    _set_time(shown.submitted_at, job.submitted_at_s)
    add_event = shown.events.add
    for e in job.events:
        event = add_event(phase=_PHASES[e.phase], attempt=e.attempt, reason=e.reason)
        _set_time(event.at, e.at_s)
    return shown


def wait_reason_to_pb(r: WaitReason) -> pb.WaitReason:
    return pb.WaitReason(
        code=r.code.value, message=r.message, cluster=r.cluster or "", gpu_type=r.gpu_type or ""
    )


def cluster_to_pb(c: ClusterState) -> pb.Cluster:
    return pb.Cluster(
        name=c.name,
        provider=c.provider.value,
        region=c.region,
        reachable=c.reachable,
        pools=[
            pb.Pool(
                name=p.name,
                gpu_type=p.gpu_type,
                capacity_kind=p.kind.value,
                usd_per_gpu_hour=p.usd_per_gpu_hour,
                gpus_per_node=p.gpus_per_node,
                node_count=len(p.free_gpus_per_node),
                free_gpus=p.free_gpus,
            )
            for p in c.pools
        ],
    )
