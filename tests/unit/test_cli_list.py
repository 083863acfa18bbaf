"""`gpufed list --user/--cluster/--newest-first` and `gpufed queues`: what the CLI asks the API, over
real gRPC on loopback to a servicer that records the requests, and what it prints."""

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


class Recording(pb_grpc.JobServiceServicer):
    def __init__(self) -> None:
        self.lists: list[pb.ListJobsRequest] = []

    def ListJobs(self, request: pb.ListJobsRequest, context: Any) -> pb.ListJobsResponse:
        self.lists.append(request)
        if request.user == "x" * 129:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "user: at most 128 characters, got 129")
        # Two pages, to check the CLI follows the token with the same filters and order.
        if not request.page_token:
            return pb.ListJobsResponse(jobs=[pb.Job(job_id="b-2", name="b")], next_page_token="t1")
        return pb.ListJobsResponse(jobs=[pb.Job(job_id="a-1", name="a")])

    def SummarizeJobs(self, request: pb.SummarizeJobsRequest, context: Any) -> pb.JobSummary:
        return pb.JobSummary(
            rows=[
                pb.JobSummaryRow(
                    tenant="vision", gpu_type="H100", group=pb.JOB_GROUP_RUNNING, gpus=16, jobs=2
                ),
                pb.JobSummaryRow(tenant="vision", gpu_type="H100", group=pb.JOB_GROUP_QUEUED, gpus=8, jobs=1),
            ]
        )


@pytest.fixture
def served() -> Iterator[tuple[str, Recording]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    # The generated base class answers UNIMPLEMENTED for the calls a fake leaves out; mypy-protobuf's
    # stubs declare every call abstract.
    servicer = Recording()  # type: ignore[abstract]
    pb_grpc.add_JobServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(None)


def _gpufed(address: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--server", address, "--token", "t", *args])


@pytest.mark.parametrize(
    ("args", "asked"),
    [
        ([], ("", "", False)),
        (["--user", "alice"], ("alice", "", False)),
        (["--cluster", "onprem", "--newest-first"], ("", "onprem", True)),
        (["--user", "bob", "--cluster", "gcp", "--newest-first"], ("bob", "gcp", True)),
    ],
    ids=["no-filter", "user", "cluster-newest-first", "all"],
)
def test_list_sends_the_filters_and_order_on_every_page(
    served: tuple[str, Recording], args: list[str], asked: tuple[str, str, bool]
) -> None:
    address, servicer = served
    result = _gpufed(address, "-o", "json", "list", *args)
    assert result.exit_code == 0, result.output
    assert [(r.user, r.cluster, r.newest_first, r.page_token) for r in servicer.lists] == [
        (*asked, ""),
        (*asked, "t1"),
    ]
    # Printed in the server's order, both pages.
    assert result.output.index('"b-2"') < result.output.index('"a-1"')


def test_a_refused_filter_is_one_line_naming_the_field(served: tuple[str, Recording]) -> None:
    address, _ = served
    result = _gpufed(address, "list", "--user", "x" * 129)
    assert result.exit_code == 1
    assert "INVALID_ARGUMENT: user: at most 128 characters" in result.output


def test_queues_prints_the_summary(served: tuple[str, Recording]) -> None:
    address, _ = served
    result = _gpufed(address, "queues")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "TENANT  GPU   GROUP    GPUS  JOBS",
        "vision  H100  RUNNING  16    2",
        "vision  H100  QUEUED   8     1",
    ]
