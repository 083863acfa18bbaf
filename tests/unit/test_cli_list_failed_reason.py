"""`gpufed list`'s REASON for a FAILED job (issue 30, item 16): the failure's message when no pod
gave a reason (a staging that failed, a gang lost with no retries left), as `gpufed get` shows it;
over real gRPC on loopback to a servicer that answers with such jobs."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from click.testing import CliRunner

from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.cli.main import cli

STAGING = "sync of vision/broken@v1 to s3-us-east-1 failed"
LOST = (
    "attempt 1 lost its gang object on the cluster (deleted); and a second sentence that makes the "
    "message longer than a column should be"
)


def a_job(job_id: str, phase: pb.JobPhase.ValueType, *, reason: str = "", message: str = "") -> pb.Job:
    return pb.Job(
        job_id=job_id, tenant="vision", phase=phase, reason=reason, message=message, gpu_types=["A100"]
    )


JOBS = [
    a_job("staged-1", pb.JOB_PHASE_FAILED, message=STAGING),
    a_job("lost-2", pb.JOB_PHASE_FAILED, message=LOST),
    a_job("exit-3", pb.JOB_PHASE_FAILED, reason="Error (exit 3)", message="attempt 1 failed: Aborted"),
    a_job("queued-4", pb.JOB_PHASE_QUEUED, message="attempt 1 evicted: node drained; restarting"),
    a_job("done-5", pb.JOB_PHASE_SUCCEEDED),
]


class Jobs(pb_grpc.JobServiceServicer):
    def ListJobs(self, request: pb.ListJobsRequest, context: Any) -> pb.ListJobsResponse:
        return pb.ListJobsResponse(jobs=JOBS)

    def GetJob(self, request: pb.GetJobRequest, context: Any) -> pb.Job:
        return next(j for j in JOBS if j.job_id == request.job_id)


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    # The generated base class answers UNIMPLEMENTED for the calls a fake leaves out; mypy-protobuf's
    # stubs declare every call abstract.
    pb_grpc.add_JobServiceServicer_to_server(Jobs(), server)  # type: ignore[abstract]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def _reasons(address: str) -> dict[str, str]:
    result = CliRunner().invoke(cli, ["--server", address, "--token", "t", "list"])
    assert result.exit_code == 0, result.output
    head, *rows = result.stdout.splitlines()
    start = head.index("REASON")
    end = head.index("GPUS")
    return {row.split()[0]: row[start:end].strip() for row in rows}


@pytest.mark.parametrize(
    ("job_id", "shown"),
    [
        ("staged-1", STAGING),
        ("lost-2", LOST[:59] + "…"),
        ("exit-3", "Error (exit 3)"),
        ("queued-4", "-"),
        ("done-5", "-"),
    ],
    ids=["failed-staging-message", "failed-long-message-cut", "pod-reason-first", "not-failed", "no-message"],
)
def test_list_shows_why_a_failed_job_failed(address: str, job_id: str, shown: str) -> None:
    assert _reasons(address)[job_id] == shown


def test_get_shows_the_same_message_whole(address: str) -> None:
    result = CliRunner().invoke(cli, ["--server", address, "--token", "t", "get", "lost-2"])
    assert f"Message:   {LOST}" in result.stdout
