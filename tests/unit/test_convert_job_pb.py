"""`convert.job_to_pb` fills its timestamps and events in place: the same message, to the byte, as
the form that built each part apart and handed it to the constructor (every reply with a job)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from federation.api import convert
from federation.api.v1 import gpufed_pb2 as pb
from federation.spec.jobspec import DatasetRef
from federation.spec.training_job import render_manifest
from federation.store.jobs import JobPlacement, JobRecord, PhaseEvent
from placement.model import CapacityKind, ClusterName, GpuType, JobPhase
from tests.conftest import build_job


def _reference(job: JobRecord, *, with_manifest: bool = False) -> Any:
    """The constructor form `job_to_pb` had before."""
    placed = job.placement
    return pb.Job(
        job_id=job.job_id,
        name=job.spec.name,
        tenant=job.tenant,
        user=job.user,
        phase=convert.phase_to_pb(job.phase),
        attempt=job.attempt,
        priority_class=job.spec.priority_class,
        priority=job.priority,
        replica_count=job.spec.replica_count,
        gpu_count=job.spec.gpu_count,
        gpu_types=list(job.spec.gpu_types),
        cluster=placed.cluster if placed else "",
        gpu_type=placed.gpu_type if placed else "",
        capacity_kind=placed.kind.value if placed else "",
        usd_per_gpu_hour=placed.usd_per_gpu_hour if placed else 0.0,
        submitted_at=convert.timestamp(job.submitted_at_s),
        message=job.message,
        cancel_requested=job.cancel_requested,
        events=[
            pb.PhaseEvent(
                phase=convert.phase_to_pb(e.phase),
                at=convert.timestamp(e.at_s),
                attempt=e.attempt,
                reason=e.reason,
            )
            for e in job.events
        ],
        manifest=render_manifest(job.spec) if with_manifest else "",
        dataset=str(job.spec.dataset) if job.spec.dataset else "",
        reason=job.reason,
    )


_QUEUED = build_job("queued", replicas=2, gpu="A100")
JOBS = [
    _QUEUED,
    dataclasses.replace(_QUEUED, submitted_at_s=0.0, queued_at_s=0.0),
    dataclasses.replace(
        build_job("placed"),
        phase=JobPhase.RUNNING,
        attempt=2,
        submitted_at_s=1_764_000_000.123456,
        placement=JobPlacement(ClusterName("onprem"), GpuType("H100"), CapacityKind.SPOT, 2.75),
        cancel_requested=True,
        message="running on onprem",
        reason="retried",
        events=(
            PhaseEvent(JobPhase.QUEUED, 1_764_000_000.123456, 1, "submitted"),
            PhaseEvent(JobPhase.ADMITTED, 1_764_000_001.5, 1, ""),
            PhaseEvent(JobPhase.RUNNING, 0.0, 2, "retry"),
        ),
    ),
]


@pytest.mark.parametrize("with_manifest", [False, True])
@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.job_id)
def test_a_job_is_shown_as_the_constructor_form_showed_it(job: JobRecord, with_manifest: bool) -> None:
    shown = convert.job_to_pb(job, with_manifest=with_manifest)
    reference = _reference(job, with_manifest=with_manifest)
    assert shown == reference
    assert shown.SerializeToString(deterministic=True) == reference.SerializeToString(deterministic=True)


def test_a_dataset_is_shown_by_its_reference() -> None:
    job = dataclasses.replace(
        _QUEUED, spec=dataclasses.replace(_QUEUED.spec, dataset=DatasetRef("imagenet", "2012"))
    )
    assert convert.job_to_pb(job).dataset == "imagenet@2012" == _reference(job).dataset
