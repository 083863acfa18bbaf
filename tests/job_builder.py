"""The test suite's one job builder, in a module of its own: a benchmark may import it without
tests/conftest.py, whose import turns on the suite's check of every record a process takes back from
its watch (`federation.store.written.CHECK_ENV`) for that process and every server it starts. A
server measured with that check on decodes and compares what no production server does."""

from __future__ import annotations

from federation.spec.jobspec import RestartPolicy, TaskSpec, TrainingJobSpec
from federation.store.jobs import JobRecord
from placement.model import GpuType, GpuTypePolicy, JobId, JobPhase, TenantId


def build_job(
    job_id: str,
    *,
    tenant: str = "t1",
    gpus: int = 8,
    replicas: int = 1,
    gpu: str = "H100",
    phase: JobPhase = JobPhase.QUEUED,
    tasks: tuple[TaskSpec, ...] | None = None,
    policy: RestartPolicy | None = None,
    annotations: tuple[tuple[str, str], ...] = (),
) -> JobRecord:
    """The one job builder of the test suite: a queued gang of `replicas` workers by default."""
    tasks = tasks or (
        TaskSpec(
            name="worker",
            replicas=replicas,
            image="ghcr.io/example/train:1",
            command=("python", "train.py"),
            env=(("EPOCHS", "3"),),
            gpus_per_replica=gpus,
        ),
    )
    spec = TrainingJobSpec(
        name=f"train-{job_id}",
        tenant=TenantId(tenant),
        priority_class="default",
        tasks=tasks,
        gpu_types=(GpuType(gpu),),
        gpu_type_policy=GpuTypePolicy.ORDERED,
        min_available=sum(t.replicas for t in tasks),
        max_runtime_s=3600,
        restart_policy=policy or RestartPolicy(),
        annotations=tuple(sorted(annotations)),
    )
    return JobRecord(
        job_id=JobId(job_id),
        tenant=TenantId(tenant),
        user="alice",
        spec=spec,
        phase=phase,
        submitted_at_s=1000.0,
        queued_at_s=1000.0,
        priority=100,
    )
