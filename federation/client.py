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
        self._admin = pb_grpc.AdminServiceStub(self._channel)
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

    # ---- administration

    def _call(self, method: Any, request: Any) -> Any:
        return method(request, metadata=self._metadata, timeout=self._timeout_s)

    def set_tenant(self, document: str) -> pb.Tenant:
        reply: pb.Tenant = self._call(self._admin.SetTenant, pb.SetTenantRequest(document=document))
        return reply

    def get_tenant(self, name: str) -> pb.Tenant:
        reply: pb.Tenant = self._call(self._admin.GetTenant, pb.GetTenantRequest(name=name))
        return reply

    def list_tenants(self) -> pb.ListTenantsResponse:
        reply: pb.ListTenantsResponse = self._call(self._admin.ListTenants, pb.ListTenantsRequest())
        return reply

    def delete_tenant(self, name: str) -> None:
        self._call(self._admin.DeleteTenant, pb.DeleteTenantRequest(name=name))

    def set_user_priority(self, user: str, max_priority_class: str) -> pb.User:
        request = pb.SetUserPriorityRequest(user=user, max_priority_class=max_priority_class)
        reply: pb.User = self._call(self._admin.SetUserPriority, request)
        return reply

    def grant_approval(
        self, *, tenant: str, priority_class: str, duration_s: float, reason: str, user: str = ""
    ) -> pb.Approval:
        request = pb.GrantApprovalRequest(
            tenant=tenant,
            user=user,
            priority_class=priority_class,
            duration_seconds=duration_s,
            reason=reason,
        )
        reply: pb.Approval = self._call(self._admin.GrantApproval, request)
        return reply

    def list_approvals(self, *, tenant: str = "", include_expired: bool = False) -> pb.ListApprovalsResponse:
        request = pb.ListApprovalsRequest(tenant=tenant, include_expired=include_expired)
        reply: pb.ListApprovalsResponse = self._call(self._admin.ListApprovals, request)
        return reply

    def revoke_approval(self, approval_id: str) -> None:
        self._call(self._admin.RevokeApproval, pb.RevokeApprovalRequest(approval_id=approval_id))


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
