"""A small synchronous client for the gpufed.v1 API, used by the CLI, the demo and the benchmarks."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any

import grpc

from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.manifest_text import wire_manifest


class GpufedClient:
    def __init__(self, target: str, token: str, *, timeout_s: float = 10.0) -> None:
        self._channel = grpc.insecure_channel(target)
        self._jobs = pb_grpc.JobServiceStub(self._channel)
        self._fed = pb_grpc.FederationServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._timeout_s = timeout_s

    def __enter__(self) -> GpufedClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def submit(self, manifest: str, *, idempotency_key: str = "") -> pb.SubmitJobResponse:
        return self._jobs.SubmitJob(
            pb.SubmitJobRequest(manifest=wire_manifest(manifest), idempotency_key=idempotency_key),
            metadata=self._metadata,
            timeout=self._timeout_s,
        )

    def get(self, job_id: str) -> pb.Job:
        return self._jobs.GetJob(
            pb.GetJobRequest(job_id=job_id), metadata=self._metadata, timeout=self._timeout_s
        )

    def list_page(
        self,
        *,
        tenant: str = "",
        phases: Sequence[pb.JobPhase.ValueType] = (),
        page_size: int = 0,
        page_token: str = "",
        name_prefix: str = "",
    ) -> pb.ListJobsResponse:
        return self._jobs.ListJobs(
            pb.ListJobsRequest(
                tenant=tenant,
                phases=phases,
                page_size=page_size,
                page_token=page_token,
                name_prefix=name_prefix,
            ),
            metadata=self._metadata,
            timeout=self._timeout_s,
        )

    def list_all(self, *, tenant: str = "", phases: Sequence[pb.JobPhase.ValueType] = ()) -> list[pb.Job]:
        jobs: list[pb.Job] = []
        token = ""
        while True:
            page = self.list_page(tenant=tenant, phases=phases, page_size=500, page_token=token)
            jobs.extend(page.jobs)
            token = page.next_page_token
            if not token:
                return jobs

    def watch(
        self,
        *,
        job_id: str = "",
        tenant: str = "",
        include_initial: bool = True,
        timeout_s: float | None = None,
    ) -> Iterator[pb.JobEvent]:
        stream: Iterator[pb.JobEvent] = self._jobs.WatchJobs(
            pb.WatchJobsRequest(job_id=job_id, tenant=tenant, include_initial=include_initial),
            metadata=self._metadata,
            timeout=timeout_s,
        )
        return stream

    def cancel(self, job_id: str, *, reason: str = "") -> pb.Job:
        return self._jobs.CancelJob(
            pb.CancelJobRequest(job_id=job_id, reason=reason),
            metadata=self._metadata,
            timeout=self._timeout_s,
        )

    def explain(self, job_id: str) -> pb.ExplainJobResponse:
        return self._jobs.ExplainJob(
            pb.ExplainJobRequest(job_id=job_id), metadata=self._metadata, timeout=self._timeout_s
        )

    def whoami(self) -> pb.Identity:
        return self._fed.WhoAmI(pb.WhoAmIRequest(), metadata=self._metadata, timeout=self._timeout_s)

    def clusters(self) -> pb.ListClustersResponse:
        return self._fed.ListClusters(
            pb.ListClustersRequest(), metadata=self._metadata, timeout=self._timeout_s
        )


def wait_until_serving(target: str, *, timeout_s: float = 30.0) -> None:
    """Block until the server's health service says SERVING."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
        # types-grpcio-health-checking declares HealthStub without its generated methods.
        stub: Any = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            raise RuntimeError(f"{target} is not serving: {reply.status}")
