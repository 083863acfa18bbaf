"""`gpufed describe`'s Gang line names what a job asked for, also when it named no type."""

from __future__ import annotations

from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.render import job_detail


def test_a_job_asking_only_for_memory_says_so() -> None:
    job = pb.Job(job_id="j", replica_count=1, gpu_count=8, manifest="spec:\n  minGpuMemoryGiB: 80\n")
    assert "8 GPUs of any type with 80 GiB or more" in job_detail(job)


def test_a_job_naming_types_lists_them() -> None:
    job = pb.Job(job_id="j", replica_count=2, gpu_count=16, gpu_types=["A100-80GB", "H100"])
    assert "16 GPUs of A100-80GB, H100" in job_detail(job)
