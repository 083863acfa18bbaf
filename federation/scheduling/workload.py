"""What a job's current attempt asks of its cluster: the `GangWorkload` the dispatcher sends.

Kept apart from the reconciler, which decides when to send it; the simulated duration and exit code
come from the job's annotations, for the simulated clusters.
"""

from __future__ import annotations

import re

from clusters.api import GangWorkload, ReplicaSpec
from federation.datasets.outputs import output_env
from federation.spec.jobspec import SIM_DURATION_ANNOTATION, SIM_EXIT_CODE_ANNOTATION
from federation.spec.pod_template import expanded_template
from federation.store.jobs import JobRecord

# The simulated kubelet's annotations (docs/kubernetes.md); the job's are passed to its pods.
SIM_PREFIX = "sim.gpufed.io/"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def sim_duration_s(text: str | None) -> float | None:
    """`"4s"`, `"1.5m"`, `"250ms"` or plain seconds; None when absent or unreadable."""
    if text is None:
        return None
    match = _DURATION.match(text)
    if match is None:
        return None
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def workload_for(job: JobRecord) -> GangWorkload:
    assert job.placement is not None
    # Where this attempt writes each declared output (issue 34, federation.datasets.outputs).
    outputs = output_env(job)
    replicas = tuple(
        ReplicaSpec(
            task=task.name,
            index=index,
            gpu_count=task.gpus_per_replica,
            image=task.image,
            command=task.command,
            env=(*task.env, *outputs),
            pod_template=expanded_template(task.template, task.shm_size or None),
        )
        for task in job.spec.tasks
        for index in range(task.replicas)
    )
    exit_code = job.spec.annotation(SIM_EXIT_CODE_ANNOTATION)
    return GangWorkload(
        job_id=job.job_id,
        attempt=job.attempt,
        tenant=job.tenant,
        gpu_type=job.placement.gpu_type,
        kind=job.placement.kind,
        priority_class=job.spec.priority_class,
        replicas=replicas,
        min_available=job.spec.min_available,
        max_runtime_s=job.spec.max_runtime_s,
        sim_duration_s=sim_duration_s(job.spec.annotation(SIM_DURATION_ANNOTATION)),
        sim_exit_code=int(exit_code) if exit_code and exit_code.lstrip("-").isdigit() else 0,
        sim_annotations=tuple(
            (k, v)
            for k, v in job.spec.annotations
            if k.startswith(SIM_PREFIX) and k not in (SIM_DURATION_ANNOTATION, SIM_EXIT_CODE_ANNOTATION)
        ),
        pod_security=job.spec.pod_security.value,
    )
