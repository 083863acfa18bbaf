"""A small synchronous client for the gpufed.v1 API, used by the CLI, the demo and the benchmarks."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import grpc

from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.spec.manifest_text import MAX_MANIFEST_BYTES, wire_manifest


class RefusedLocally(grpc.RpcError):
    """A request the server would refuse, refused before it is sent: the same code and wording a
    caller handles for the server's answer, without moving megabytes to get it."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def check_manifest_size(manifest: str) -> None:
    """Refuse a manifest (or a tenant document, read by the same loader) over the server's limit
    here: a 50 MB file is not worth sending to learn that."""
    if len(manifest) > MAX_MANIFEST_BYTES:
        size = len(manifest)
        raise RefusedLocally(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"manifest: is at least {size} bytes, over the limit of {MAX_MANIFEST_BYTES} (not sent)",
        )
    size = len(manifest.encode("utf-8", "surrogatepass"))
    if size > MAX_MANIFEST_BYTES:
        raise RefusedLocally(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"manifest: is {size} bytes, over the limit of {MAX_MANIFEST_BYTES} (not sent)",
        )


@dataclass(frozen=True, slots=True)
class TlsClient:
    """Trust `ca_pem` for the server; present a certificate too when the server asks (mutual TLS)."""

    ca_pem: bytes
    cert_pem: bytes | None = None
    key_pem: bytes | None = None


class LogStream(Protocol):
    """What `GpufedClient.logs` returns: gRPC's streaming call, typed by what its callers use. A
    follow never ends by itself while the attempt runs, so a caller that stops reading (a `gpufed
    logs -f` interrupted, a test done) cancels it."""

    def __iter__(self) -> Iterator[pb.LogChunk]: ...

    def __next__(self) -> pb.LogChunk: ...

    def cancel(self) -> bool: ...


class GpufedClient:
    def __init__(
        self, target: str, token: str, *, timeout_s: float = 10.0, tls: TlsClient | None = None
    ) -> None:
        if tls is None:
            self._channel = grpc.insecure_channel(target)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.ca_pem, private_key=tls.key_pem, certificate_chain=tls.cert_pem
            )
            self._channel = grpc.secure_channel(target, credentials)
        self._jobs = pb_grpc.JobServiceStub(self._channel)
        self._fed = pb_grpc.FederationServiceStub(self._channel)
        self._admin = pb_grpc.AdminServiceStub(self._channel)
        self._reports = pb_grpc.ReportServiceStub(self._channel)
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

    # For the clients of other services (federation.api.datasets_client) on the same channel and token.
    @property
    def channel(self) -> grpc.Channel:
        return self._channel

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def submit(self, manifest: str, *, idempotency_key: str = "") -> pb.SubmitJobResponse:
        check_manifest_size(manifest)
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
        user: str = "",
        cluster: str = "",
        newest_first: bool = False,
        include_archived: bool = False,
        since_s: float | None = None,
        job_set: str = "",
    ) -> pb.ListJobsResponse:
        request = pb.ListJobsRequest(
            job_set=job_set,
            tenant=tenant,
            phases=phases,
            page_size=page_size,
            page_token=page_token,
            name_prefix=name_prefix,
            user=user,
            cluster=cluster,
            newest_first=newest_first,
            include_archived=include_archived,
        )
        if since_s is not None:
            request.since.FromNanoseconds(int(since_s * 1e9))
        return self._jobs.ListJobs(request, metadata=self._metadata, timeout=self._timeout_s)

    def list_all(
        self,
        *,
        tenant: str = "",
        phases: Sequence[pb.JobPhase.ValueType] = (),
        user: str = "",
        cluster: str = "",
        newest_first: bool = False,
        include_archived: bool = False,
        since_s: float | None = None,
        job_set: str = "",
    ) -> list[pb.Job]:
        jobs: list[pb.Job] = []
        token = ""
        while True:
            page = self.list_page(
                tenant=tenant,
                phases=phases,
                page_size=500,
                page_token=token,
                user=user,
                cluster=cluster,
                newest_first=newest_first,
                include_archived=include_archived,
                since_s=since_s,
                job_set=job_set,
            )
            jobs.extend(page.jobs)
            token = page.next_page_token
            if not token:
                return jobs

    def summarize(self, *, tenant: str = "") -> pb.JobSummary:
        """GPUs and jobs per tenant, GPU type and phase group over the jobs not finished."""
        return self._jobs.SummarizeJobs(
            pb.SummarizeJobsRequest(tenant=tenant), metadata=self._metadata, timeout=self._timeout_s
        )

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

    # ---- job sets and arrays (docs/jobsets.md)

    def submit_set(
        self, name: str, manifests: Sequence[str], *, array: str = "", max_parallel: int = 0, sweep: str = ""
    ) -> pb.SubmitJobSetResponse:
        for manifest in manifests:
            check_manifest_size(manifest)
        request = pb.SubmitJobSetRequest(
            name=name,
            manifests=[wire_manifest(m) for m in manifests],
            array=array,
            max_parallel=max_parallel,
            sweep=sweep,
        )
        # Every member's manifest is checked before the reply: more than one job's time.
        reply: pb.SubmitJobSetResponse = self._jobs.SubmitJobSet(
            request, metadata=self._metadata, timeout=max(self._timeout_s, 60.0)
        )
        return reply

    def get_set(self, name: str, *, tenant: str = "") -> pb.JobSet:
        reply: pb.JobSet = self._call(self._jobs.GetJobSet, pb.GetJobSetRequest(name=name, tenant=tenant))
        return reply

    def sweep_results(self, name: str, *, tenant: str = "") -> pb.SweepResults:
        """A sweep's trials ranked by its metric, best first (docs/jobsets.md, "Sweeps")."""
        reply: pb.SweepResults = self._call(
            self._jobs.GetSweepResults, pb.GetJobSetRequest(name=name, tenant=tenant)
        )
        return reply

    def list_sets(self, *, tenant: str = "") -> pb.ListJobSetsResponse:
        reply: pb.ListJobSetsResponse = self._call(
            self._jobs.ListJobSets, pb.ListJobSetsRequest(tenant=tenant)
        )
        return reply

    def watch_set(
        self, name: str, *, tenant: str = "", timeout_s: float | None = None
    ) -> Iterator[pb.JobSet]:
        stream: Iterator[pb.JobSet] = self._jobs.WatchJobSet(
            pb.GetJobSetRequest(name=name, tenant=tenant), metadata=self._metadata, timeout=timeout_s
        )
        return stream

    def cancel_set(self, name: str, *, tenant: str = "", reason: str = "") -> pb.JobSet:
        reply: pb.JobSet = self._jobs.CancelJobSet(
            pb.CancelJobSetRequest(name=name, tenant=tenant, reason=reason),
            metadata=self._metadata,
            timeout=max(self._timeout_s, 60.0),
        )
        return reply

    def resubmit_set(self, name: str, *, tenant: str = "") -> pb.JobSet:
        reply: pb.JobSet = self._call(
            self._jobs.ResubmitJobSet, pb.ResubmitJobSetRequest(name=name, tenant=tenant)
        )
        return reply

    def explain(self, job_id: str) -> pb.ExplainJobResponse:
        return self._jobs.ExplainJob(
            pb.ExplainJobRequest(job_id=job_id), metadata=self._metadata, timeout=self._timeout_s
        )

    def logs(self, request: pb.StreamLogsRequest, *, timeout_s: float | None = None) -> LogStream:
        """A job's log chunks (federation.api.logs), as a stream that can be `cancel()`ed."""
        stream: LogStream = pb_grpc.LogsStub(self._channel).StreamLogs(
            request, metadata=self._metadata, timeout=timeout_s
        )
        return stream

    def describe(self, job_id: str) -> pb.JobDescription:
        return pb_grpc.LogsStub(self._channel).DescribeJob(
            pb.DescribeJobRequest(job_id=job_id), metadata=self._metadata, timeout=self._timeout_s
        )

    def whoami(self) -> pb.Identity:
        return self._fed.WhoAmI(pb.WhoAmIRequest(), metadata=self._metadata, timeout=self._timeout_s)

    def clusters(self) -> pb.ListClustersResponse:
        return self._fed.ListClusters(
            pb.ListClustersRequest(), metadata=self._metadata, timeout=self._timeout_s
        )

    # ---- tenant secrets (values go in, never come back)

    def put_secret(self, name: str, data: dict[str, bytes], *, tenant: str = "") -> pb.SecretInfo:
        request = pb.PutSecretRequest(tenant=tenant, name=name, data=data)
        reply: pb.SecretInfo = self._call(pb_grpc.SecretsStub(self._channel).PutSecret, request)
        return reply

    def list_secrets(self, *, tenant: str = "") -> pb.ListSecretsResponse:
        request = pb.ListSecretsRequest(tenant=tenant)
        reply: pb.ListSecretsResponse = self._call(pb_grpc.SecretsStub(self._channel).ListSecrets, request)
        return reply

    def delete_secret(self, name: str, *, tenant: str = "") -> pb.SecretInfo:
        request = pb.DeleteSecretRequest(tenant=tenant, name=name)
        reply: pb.SecretInfo = self._call(pb_grpc.SecretsStub(self._channel).DeleteSecret, request)
        return reply

    # ---- administration

    def _call(self, method: Any, request: Any) -> Any:
        return method(request, metadata=self._metadata, timeout=self._timeout_s)

    def set_tenant(self, document: str) -> pb.Tenant:
        check_manifest_size(document)
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

    def set_user(self, name: str, *, tenant: str, role: str, max_priority_class: str = "") -> pb.User:
        request = pb.SetUserRequest(
            name=name, tenant=tenant, role=role, max_priority_class=max_priority_class
        )
        reply: pb.User = self._call(self._admin.SetUser, request)
        return reply

    def list_users(self) -> pb.ListUsersResponse:
        reply: pb.ListUsersResponse = self._call(self._admin.ListUsers, pb.ListUsersRequest())
        return reply

    def issue_token(self, user: str, *, ttl_s: float = 0.0) -> pb.IssuedToken:
        reply: pb.IssuedToken = self._call(
            self._admin.IssueToken, pb.IssueTokenRequest(user=user, ttl_seconds=ttl_s)
        )
        return reply

    def list_tokens(self, *, user: str = "") -> pb.ListTokensResponse:
        reply: pb.ListTokensResponse = self._call(self._admin.ListTokens, pb.ListTokensRequest(user=user))
        return reply

    def revoke_token(self, token_id: str) -> None:
        self._call(self._admin.RevokeToken, pb.RevokeTokenRequest(token_id=token_id))

    def list_audit(self, *, limit: int = 100, page_token: str = "") -> pb.ListAuditResponse:
        request = pb.ListAuditRequest(limit=limit, page_token=page_token)
        reply: pb.ListAuditResponse = self._call(self._admin.ListAudit, request)
        return reply

    # ---- finance

    def report(
        self,
        *,
        start_s: float | None = None,
        end_s: float | None = None,
        group_by: Sequence[str] = (),
        bucket: str = "",
        tenant: str = "",
        fmt: str = "table",
        report: str = "",
    ) -> pb.RenderedReport:
        request = pb.GetReportRequest(
            group_by=list(group_by), bucket=bucket, tenant=tenant, format=fmt, report=report
        )
        _set_period(request, start_s, end_s)
        reply: pb.RenderedReport = self._call(self._reports.GetReport, request)
        return reply

    def export_focus(
        self, *, start_s: float | None = None, end_s: float | None = None, tenant: str = "", fmt: str = "csv"
    ) -> pb.RenderedReport:
        request = pb.ExportFocusRequest(tenant=tenant, format=fmt)
        _set_period(request, start_s, end_s)
        reply: pb.RenderedReport = self._call(self._reports.ExportFocus, request)
        return reply

    def ledger(
        self, *, start_s: float | None = None, end_s: float | None = None, tenant: str = ""
    ) -> pb.ListLedgerResponse:
        request = pb.ListLedgerRequest(tenant=tenant)
        _set_period(request, start_s, end_s)
        reply: pb.ListLedgerResponse = self._call(self._reports.ListLedger, request)
        return reply


def _set_period(request: Any, start_s: float | None, end_s: float | None) -> None:
    if start_s is not None:
        request.start.FromNanoseconds(int(start_s * 1e9))
    if end_s is not None:
        request.end.FromNanoseconds(int(end_s * 1e9))


# While a server is still starting, its port refuses connections, and gRPC waits longer after each
# refusal (1 s, then 1.6 times more each time, with jitter): a server that listened 6 s after its
# start was seen only at about 9.5 s. Retrying every 0.1 to 0.5 s sees it within half a second.
_WAIT_RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]


def wait_until_serving(target: str, *, timeout_s: float = 30.0, tls: TlsClient | None = None) -> None:
    """Block until the server's health service says SERVING."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channel = (
        grpc.insecure_channel(target, options=_WAIT_RECONNECT_OPTIONS)
        if tls is None
        else grpc.secure_channel(
            target,
            grpc.ssl_channel_credentials(
                root_certificates=tls.ca_pem, private_key=tls.key_pem, certificate_chain=tls.cert_pem
            ),
            options=_WAIT_RECONNECT_OPTIONS,
        )
    )
    with channel:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
        # types-grpcio-health-checking declares HealthStub without its generated methods.
        stub: Any = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            raise RuntimeError(f"{target} is not serving: {reply.status}")
