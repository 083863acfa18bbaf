"""The gRPC servicers: authenticate, authorize, validate, then read or write through the store.

Handlers are thin. Authorization rules live in `federation.security.auth`, validation in
`federation.spec.training_job`, storage in `federation.store.job_store`; each handler only strings
them together, and `_unary` maps every project error to its status code in one place.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any, Protocol, TypeVar

import grpc
import structlog

from federation.api import convert, history_reads
from federation.api.job_queries import (
    ListFilter,
    decode_page_token,
    encode_page_token,
    list_order,
    one_page,
    summary_reply,
)
from federation.api.jobsets import Checked, JobSetCalls, SetListFilter
from federation.api.queue_limit import QueueLimits
from federation.api.redact import Redactor, error_text
from federation.api.status import status_code_for
from federation.api.streams import StreamGuard, next_event
from federation.api.submit_checks import check_submission
from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.errors import (
    FailedPrecondition,
    GpufedError,
    InvalidArgument,
    InvalidSpec,
    JobIdTaken,
    NotFound,
    PermissionDenied,
    QueueFull,
    RateLimited,
)
from federation.history.protocol import HistoryStore
from federation.jobsets.store import JobSetStore
from federation.ledger.cache import LedgerCache
from federation.ledger.job_cost import job_cost_text
from federation.metrics import Metrics
from federation.scheduling.dispatch_backoff import ClusterRefusing, backoff_text
from federation.security.auth import (
    Authenticator,
    Principal,
    acting_tenant,
    can_read_tenant,
    check_write_job,
    job_not_found,
    listable_tenant,
)
from federation.security.ratelimit import ReadRateLimiter, SubmitRateLimiter
from federation.security.tokens import AuditEvent, SecurityStore
from federation.spec.jobspec import DatasetRef, TrainingJobSpec
from federation.spec.training_job import manifest_digest, parse_manifest
from federation.spec.validate import free_text, name_field
from federation.store.idempotent_retry import accepted_before
from federation.store.intervals import LedgerInterval
from federation.store.job_cache import JobCache
from federation.store.job_store import JobStore, Stored, idempotency_digest
from federation.store.jobs import JobRecord
from federation.store.records import SchedulingSettings, TenantRecord, UserRecord
from federation.store.schema_version import SchemaTooNew
from placement.model import ClusterName, ClusterState, JobId, JobPhase, TenantId, WaitReason

log = structlog.get_logger("gpufed.api")

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Ctx = grpc.aio.ServicerContext[Any, Any]

# Job ids are a name of at most 40 characters and 8 hex digits; anything much longer is not one.
MAX_JOB_ID_LENGTH = 128
MAX_IDEMPOTENCY_KEY_LENGTH = 128
MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 100
# How long a submission waits for the job cache to have the job before it answers.
READ_YOUR_WRITES_WAIT_S = 5.0


class SubmitPolicy(Protocol):
    """What a submission is checked against: the tenant's record and the priority classes."""

    async def get(self, name: TenantId) -> TenantRecord | None: ...

    async def settings(self) -> SchedulingSettings: ...


class SecretPolicy(Protocol):
    """Whether each secret a job names exists in its tenant (`federation.secrets.jobs.SecretCheck`)."""

    async def check(self, tenant: str, spec: TrainingJobSpec) -> None: ...


class DatasetPolicy(Protocol):
    """Whether a tenant's job may name a dataset (`federation.datasets.check.DatasetCheck`)."""

    async def check(self, tenant: TenantId, ref: DatasetRef, settings: SchedulingSettings) -> None: ...

    async def check_outputs(self, tenant: TenantId, spec: TrainingJobSpec) -> None: ...

    def awaiting(self, job: JobRecord) -> str: ...


def check_priority_class(
    who: Principal, tenant: TenantRecord, settings: SchedulingSettings, name: str
) -> int:
    """The class's value, if the user and the tenant may use it.

    A class that needs an approval (urgent) may be submitted by anyone allowed that high: the placer
    admits it only while an admin's approval covers it, and says so in the job's wait reasons.
    """
    values = settings.class_values()
    value = values.get(name)
    if value is None:
        raise InvalidSpec(
            "spec.priorityClassName", f"{name!r} is not a priority class (known: {', '.join(sorted(values))})"
        )
    for who_limits, limit in (
        ("tenant " + tenant.name, tenant.max_priority_class),
        ("user " + who.user, who.max_priority_class),
    ):
        if limit is not None and value > values.get(limit, value):
            raise PermissionDenied(
                f"spec.priorityClassName: {name!r} is above what {who_limits} may use (at most {limit!r})"
            )
    return value


# Ids drawn for one submission before its collision is given up on (each is a live job's with a
# chance of (live jobs of that name) / 2**64).
JOB_ID_DRAWS = 8


def _new_job_id(name: str) -> JobId:
    # Readable and DNS-label safe: the job name plus 64 random bits. The create is create-only, so a
    # live job's id is caught and another drawn (`JobService._submit`), but an archived job's is not
    # there to be caught: with 32 bits, a million jobs of one name (a team's sweeps over the years)
    # would have drawn about a hundred ids of archived jobs, and such a job is never archived (the
    # history holds another job under its id) and shares its ledger keys with the old one. With 64
    # bits, about one in 40 million for that million. Long names are cut short, with a hash, where a
    # cluster's names need it (`clusters.kubernetes.names`).
    return JobId(f"{name[:40].rstrip('-')}-{secrets.token_hex(8)}")


async def _abort(context: Ctx, error: GpufedError, who: Principal | None) -> None:
    # Infrastructure detail (a store's host and port, a driver's words) for admins only.
    await context.abort(status_code_for(error), error_text(error, who))


def _user(who: Principal | None) -> str:
    return "" if who is None else who.user


class CallHandlers:
    """Shared plumbing: authentication, error mapping and latency metrics for every call."""

    def __init__(self, auth: Authenticator, metrics: Metrics) -> None:
        self._auth = auth
        self._metrics = metrics

    async def principal(self, context: Ctx) -> Principal:
        # The peer's address bounds its failed authentications (`federation.security.auth_limits`); test
        # doubles of the context may not have one.
        peer = context.peer() if hasattr(context, "peer") else ""
        return await self._auth.authenticate(context.invocation_metadata(), peer=peer)

    def token_issued(self, token: str, user: UserRecord) -> None:
        """A token was just stored: it must work on its first call, whatever was tried before."""
        self._auth.issued(token, user)

    async def unary(
        self,
        method: str,
        request: Req,
        context: Ctx,
        body: Callable[[Principal, Req], Awaitable[Resp]],
    ) -> Resp:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        who: Principal | None = None
        self._metrics.calls_in_flight += 1
        try:
            who = await self.principal(context)
            return await body(who, request)
        except GpufedError as error:
            code = status_code_for(error)
            log.info("call_refused", method=method, code=code.name, error=str(error), user=_user(who))
            await _abort(context, error, who)
            raise  # unreachable: abort raises
        except grpc.aio.AbortError:
            raise  # a handler's own abort: its status is already chosen
        except Exception as error:
            # Nothing translated it into one of federation's errors: gRPC would send its text to
            # anyone as UNKNOWN. Logged whole; the caller reads it only if an admin.
            code = grpc.StatusCode.INTERNAL
            log.exception("call_failed", method=method, user=_user(who))
            await context.abort(code, error_text(error, who))
            raise  # unreachable: abort raises
        finally:
            self._metrics.calls_in_flight -= 1
            self._metrics.observe_call(method, code.name, time.perf_counter() - started)


class JobService(pb_grpc.JobServiceServicer):
    def __init__(
        self,
        *,
        store: JobStore,
        cache: JobCache,
        auth: Authenticator,
        metrics: Metrics,
        tenants: SubmitPolicy,
        datasets: DatasetPolicy,
        clock: Callable[[], float] = time.time,
        read_limiter: ReadRateLimiter | None = None,
        security: SecurityStore | None = None,
        history: HistoryStore | None = None,
        ledger: LedgerCache | None = None,
        secrets: SecretPolicy | None = None,
    ) -> None:
        self._store = store
        # Tenant secrets the templates name must exist at submission (issue 32); None: not checked.
        self._secrets = secrets
        # Ended jobs archived to SQL (issue 19); None: the live store only.
        self._history = history
        # etcd's usage ledger, for a live job's cost on GetJob (None: no cost shown).
        self._ledger = ledger
        self._datasets = datasets
        # Where a cancel is recorded in the audit trail (None: not recorded, for tests of the rest).
        self._security = security
        # Per caller, on this server: one caller's polling loop must not slow everyone's reads.
        self._read_limiter = read_limiter or ReadRateLimiter()
        self._cache = cache
        self._h = CallHandlers(auth, metrics)
        self._auth = auth
        self._metrics = metrics
        self._tenants = tenants
        self._clock = clock
        self._rate_limiter = SubmitRateLimiter()
        self._queue_limits = QueueLimits(cache, tenants.get, tenants.settings)
        # Job sets (issue 34) keep their records beside the jobs, in the same etcd.
        kv = getattr(store, "kv", None)
        self._sets = (
            None
            if kv is None
            else JobSetCalls(
                sets=JobSetStore(kv),
                store=store,
                cache=cache,
                ledger=ledger,
                history=history,
                clock=clock,
                queue_room=self._queue_limits.room,
            )
        )

    @property
    def job_sets(self) -> JobSetCalls | None:
        """The set calls, whose controller the server runs (federation.runtime.serve)."""
        return self._sets

    # ---- submit

    async def SubmitJob(self, request: pb.SubmitJobRequest, context: Ctx) -> pb.SubmitJobResponse:
        return await self._h.unary("SubmitJob", request, context, self._submit)

    async def _submit(self, who: Principal, request: pb.SubmitJobRequest) -> pb.SubmitJobResponse:
        key = request.idempotency_key
        if len(key) > MAX_IDEMPOTENCY_KEY_LENGTH:
            raise InvalidArgument(f"idempotency_key: at most {MAX_IDEMPOTENCY_KEY_LENGTH} characters")
        settings = await self._tenants.settings()
        checked = await self.checked(who, request.manifest, settings)
        spec, tenant, record, priority, digest = (
            checked.spec,
            checked.tenant,
            checked.record,
            checked.priority,
            checked.digest,
        )
        # After the checks, so that a flood of invalid manifests costs the tenant nothing but time.
        try:
            self._rate_limiter.admit(tenant, record.submit_rate_per_s, record.submit_burst)
            # A refused submission keeps its place in the rate: a script that retries against a full
            # queue is slowed as any other.
            self._queue_limits.check(record, settings)
        except (RateLimited, QueueFull) as refused:
            # A retry of a submission already accepted creates nothing: answer it, do not refuse it.
            earlier = await accepted_before(self._store, tenant, key, digest)
            if earlier is None:
                reason = "queue_full" if isinstance(refused, QueueFull) else "rate_limited"
                self._metrics.submissions_refused.labels(tenant=tenant, reason=reason).inc()
                raise
            return pb.SubmitJobResponse(
                job_id=earlier.value.job_id, created=False, job=self._shown(who, earlier.value)
            )
        if spec.dataset is not None:
            # After the rate limiter: a reference the in-memory view cannot vouch for costs an etcd
            # read, and a flood of unknown ones must stay within the tenant's rate.
            await self._datasets.check(tenant, spec.dataset, settings)
        now = self._clock()
        for attempt in range(1, JOB_ID_DRAWS + 1):
            # Without a client key every call is its own submission: key it by 128 random bits.
            # Not by the job id, whose random bits can draw a live job's: that job's key would
            # then answer this submission as a retry of it, and the new job would never be made.
            idempotency_key = key or f"auto:{secrets.token_hex(16)}"
            job = JobRecord(
                job_id=_new_job_id(spec.name),
                tenant=tenant,
                user=who.user,
                spec=spec,
                phase=JobPhase.QUEUED,
                submitted_at_s=now,
                queued_at_s=now,
                priority=priority,
                # What the store names the record's key by: given here, the record is not copied there.
                idempotency_digest=idempotency_digest(idempotency_key),
            )
            try:
                stored, created = await self._store.create_job(
                    job, idempotency_key=idempotency_key, manifest_digest=digest
                )
                break
            except JobIdTaken:
                # The random id is a live job's (likely only among many jobs of one name: a sweep's
                # trials, a nightly job). The create wrote nothing: draw another id.
                if attempt == JOB_ID_DRAWS:
                    raise
        if created:
            self._metrics.job_submitted(tenant)
            log.info("job_submitted", job_id=stored.value.job_id, tenant=tenant, user=who.user)
        else:
            self._rate_limiter.refund(tenant)
        # Read-your-writes: lists and watches are served from the cache, which learns of the job from
        # etcd's watch a moment later (longer on a busy server). A submitter who lists at once (the
        # console's redirect to the jobs page, a script) must find the job; if the cache is slower
        # than this, the job is accepted all the same and shows up as soon as the cache has it.
        await self._cache.wait_for_revision(stored.mod_revision, timeout_s=READ_YOUR_WRITES_WAIT_S)
        return pb.SubmitJobResponse(
            job_id=stored.value.job_id, created=created, job=self._shown(who, stored.value)
        )

    async def checked(self, who: Principal, manifest: str, settings: SchedulingSettings) -> Checked:
        """A manifest through every check of a submission that needs no store write: parsed, for a
        tenant the caller may submit to, at a priority class they may use. A job set's members pass
        the same (federation.api.jobsets)."""
        spec = parse_manifest(manifest, priority_classes=settings.class_values().keys())
        tenant = acting_tenant(who, spec.tenant, action="submit jobs", field="spec.tenant")
        record = await self._tenants.get(tenant)
        if record is None:
            raise InvalidSpec("spec.tenant", f"tenant {tenant!r} does not exist")
        priority = check_priority_class(who, record, settings, spec.priority_class)
        spec = check_submission(spec, record, settings, acting=tenant)
        if self._secrets is not None:
            await self._secrets.check(tenant, spec)
        if spec.outputs:
            # Outputs become the tenant's dataset versions (issue 34): its own, on its granted prefixes.
            await self._datasets.check_outputs(tenant, spec)
        return Checked(
            spec=spec, tenant=tenant, record=record, priority=priority, digest=manifest_digest(spec)
        )

    # ---- job sets (federation.api.jobsets)

    def _job_sets(self) -> JobSetCalls:
        if self._sets is None:
            raise FailedPrecondition("job sets need the etcd-backed store")
        return self._sets

    async def SubmitJobSet(self, request: pb.SubmitJobSetRequest, context: Ctx) -> pb.SubmitJobSetResponse:
        async def body(who: Principal, req: pb.SubmitJobSetRequest) -> pb.SubmitJobSetResponse:
            settings = await self._tenants.settings()

            def admit(tenant: TenantId, record: TenantRecord) -> None:
                # A set is one submission to the tenant's rate, whatever its size (bounded there).
                self._rate_limiter.admit(tenant, record.submit_rate_per_s, record.submit_burst)

            async def check_dataset(tenant: TenantId, spec: TrainingJobSpec) -> None:
                assert spec.dataset is not None
                await self._datasets.check(tenant, spec.dataset, settings)

            reply = await self._job_sets().submit(
                who, req, settings=settings, check=self.checked, admit=admit, check_dataset=check_dataset
            )
            if reply.created:
                log.info("job_set_submitted", job_set=req.name, tenant=reply.job_set.tenant, user=who.user)
            return reply

        return await self._h.unary("SubmitJobSet", request, context, body)

    async def GetJobSet(self, request: pb.GetJobSetRequest, context: Ctx) -> pb.JobSet:
        async def body(who: Principal, req: pb.GetJobSetRequest) -> pb.JobSet:
            self._read_limiter.admit(who.user)
            return await self._job_sets().get(who, req)

        return await self._h.unary("GetJobSet", request, context, body)

    async def GetSweepResults(self, request: pb.GetJobSetRequest, context: Ctx) -> pb.SweepResults:
        async def body(who: Principal, req: pb.GetJobSetRequest) -> pb.SweepResults:
            self._read_limiter.admit(who.user)
            return await self._job_sets().sweep_results(who, req)

        return await self._h.unary("GetSweepResults", request, context, body)

    async def ListJobSets(self, request: pb.ListJobSetsRequest, context: Ctx) -> pb.ListJobSetsResponse:
        async def body(who: Principal, req: pb.ListJobSetsRequest) -> pb.ListJobSetsResponse:
            self._read_limiter.admit(who.user)
            return await self._job_sets().list_sets(who, req)

        return await self._h.unary("ListJobSets", request, context, body)

    async def CancelJobSet(self, request: pb.CancelJobSetRequest, context: Ctx) -> pb.JobSet:
        async def body(who: Principal, req: pb.CancelJobSetRequest) -> pb.JobSet:
            shown = await self._job_sets().cancel(who, req)
            if self._security is not None:
                # As a job's cancel: who stopped someone's GPUs is on record.
                event = AuditEvent(
                    self._clock(),
                    who.user,
                    who.role.value,
                    "job_set_cancel_requested",
                    shown.name,
                    f"tenant={shown.tenant} reason={shown.cancel_reason}",
                )
                await self._security.append_audit(event)
            return shown

        return await self._h.unary("CancelJobSet", request, context, body)

    async def ResubmitJobSet(self, request: pb.ResubmitJobSetRequest, context: Ctx) -> pb.JobSet:
        async def body(who: Principal, req: pb.ResubmitJobSetRequest) -> pb.JobSet:
            return await self._job_sets().resubmit(who, req)

        return await self._h.unary("ResubmitJobSet", request, context, body)

    async def WatchJobSet(self, request: pb.GetJobSetRequest, context: Ctx) -> AsyncIterator[pb.JobSet]:
        caller: Principal | None = None
        try:
            who = caller = await self._h.principal(context)
            self._read_limiter.admit(who.user)
            stream = self._job_sets().watch(who, request)
            guard = StreamGuard(self._auth, context.invocation_metadata(), who)
            async for shown in stream:
                # A revoked token, or a caller moved to another tenant, ends the stream.
                await guard.check()
                yield shown
        except GpufedError as error:
            await _abort(context, error, caller)

    # ---- reads

    async def _visible_job(self, who: Principal, job_id: str) -> Stored[JobRecord]:
        return await visible_job(who, job_id, self._cache, self._store, self._history, self._read_limiter)

    def _shown(self, who: Principal, job: JobRecord, *, with_manifest: bool = False) -> pb.Job:
        """The job as this caller may read it (see `federation.api.redact`)."""
        shown = convert.job_to_pb(self.redactor(who).job(job), with_manifest=with_manifest)
        if job.job_set:
            shown.job_set = job.job_set
            if job.array_index is not None:
                shown.array_index = job.array_index
        return shown

    def redactor(self, who: Principal) -> Redactor:
        def tenant_of(job_id: JobId) -> TenantId | None:
            found = self._cache.get(job_id)
            return None if found is None else found.value.tenant

        return Redactor(who, tenant_of)

    async def GetJob(self, request: pb.GetJobRequest, context: Ctx) -> pb.Job:
        async def body(who: Principal, req: pb.GetJobRequest) -> pb.Job:
            stored = await self._visible_job(who, req.job_id)
            shown = self._shown(who, stored.value, with_manifest=True)
            shown.cost_usd = job_cost(stored, self._ledger, now_s=self._clock())
            return shown

        return await self._h.unary("GetJob", request, context, body)

    async def ListJobs(self, request: pb.ListJobsRequest, context: Ctx) -> pb.ListJobsResponse:
        return await self._h.unary("ListJobs", request, context, self._list)

    async def _list(self, who: Principal, req: pb.ListJobsRequest) -> pb.ListJobsResponse:
        self._read_limiter.admit(who.user)
        tenant = listable_tenant(who, req.tenant)
        if req.page_size < 0:
            raise InvalidArgument("page_size: must not be negative")
        size = min(req.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        phases = {p for p in (convert.phase_from_pb(v) for v in req.phases) if p is not None}
        wanted = ListFilter.of(req)
        if req.job_set:
            wanted = SetListFilter.of_set(wanted, name_field(req.job_set, "job_set"))
        after = decode_page_token(req.page_token, newest_first=req.newest_first)
        # The cache's index walks only the caller's tenant (and phases), in order from the page's
        # start: one tenant's thousands of jobs do not slow another's list. User and cluster are
        # checked on the records walked; only the page returned is converted.
        since_s = req.since.ToNanoseconds() / 1e9 if req.HasField("since") else None
        start = after
        if since_s is not None and not req.newest_first and (start is None or start < (since_s, "")):
            start = (since_s, "")  # the walk starts at `since` instead of skipping everything older
        walked = self._cache.ordered(tenant, phases, start, newest_first=req.newest_first)
        if not req.include_archived or self._history is None:
            page, more = one_page(since_filtered(walked, since_s, req.newest_first), wanted, size)
        else:
            page, more = await self._both_stores(req, tenant, phases, wanted, since_s, start, walked, size)
        token = encode_page_token(list_order(page[-1]), newest_first=req.newest_first) if more else ""
        total = 0
        if req.with_total:
            # The console's "N in total": the same index walk from the start, no conversion.
            every = self._cache.ordered(tenant, phases, None, newest_first=req.newest_first)
            total = sum(1 for j in since_filtered(every, since_s, req.newest_first) if wanted.wants(j))
        return pb.ListJobsResponse(
            jobs=[self._shown(who, j) for j in page], next_page_token=token, total_count=total
        )

    async def _both_stores(
        self,
        req: pb.ListJobsRequest,
        tenant: TenantId | None,
        phases: set[JobPhase],
        wanted: ListFilter,
        since_s: float | None,
        after: tuple[float, str] | None,
        walked: Iterator[Stored[JobRecord]],
        size: int,
    ) -> tuple[list[JobRecord], bool]:
        """One page over the cache and the history store, merged on (submitted_at, job_id).

        The cache is read first, then SQL: the archiver commits a job to SQL before it deletes it
        from etcd, and the cache drops it only after etcd did, so a job missing from the cache's
        read is already in SQL when SQL is read. Every job past the token is in one store or both
        (a job in both, during the archiver's window, is shown once), and nothing at or before the
        token is: no job is repeated or skipped across pages, whichever store holds it.
        """
        live, _ = one_page(since_filtered(walked, since_s, req.newest_first), wanted, size + 1)
        assert self._history is not None
        archived = await asyncio.to_thread(
            history_reads.list_archived,
            self._history,
            tenant=tenant,
            phases=frozenset(phases),
            wants=wanted.wants,
            user=wanted.user,
            since_s=since_s,
            after=after,
            newest_first=req.newest_first,
            count=size + 1,
        )
        merged: dict[JobId, JobRecord] = {j.job_id: j for j in archived}
        merged.update((j.job_id, j) for j in live)  # the live copy wins while a job is in both
        ordered = sorted(merged.values(), key=list_order, reverse=req.newest_first)
        return ordered[:size], len(ordered) > size

    async def SummarizeJobs(self, request: pb.SummarizeJobsRequest, context: Ctx) -> pb.JobSummary:
        async def body(who: Principal, req: pb.SummarizeJobsRequest) -> pb.JobSummary:
            self._read_limiter.admit(who.user)
            # The same rule as ListJobs: a member its own tenant, finance not at all.
            tenant = listable_tenant(who, req.tenant)
            return summary_reply(self._cache.summary(), tenant)

        return await self._h.unary("SummarizeJobs", request, context, body)

    async def WatchJobs(self, request: pb.WatchJobsRequest, context: Ctx) -> AsyncIterator[pb.JobEvent]:
        caller: Principal | None = None  # known once authenticated: whom an error's detail is for
        try:
            who = caller = await self._h.principal(context)
            self._read_limiter.admit(who.user)
            if request.job_id:
                first = await self._visible_job(who, request.job_id)
                tenant: TenantId | None = first.value.tenant
            else:
                tenant = listable_tenant(who, request.tenant)
        except GpufedError as error:
            await _abort(context, error, caller)
            return
        guard = StreamGuard(self._auth, context.invocation_metadata(), who)
        queue = self._cache.subscribe()
        try:
            last_sent: dict[JobId, tuple[JobPhase, int, bool, str]] = {}

            def wanted(job: JobRecord) -> bool:
                if request.job_id and job.job_id != request.job_id:
                    return False
                return tenant is None or job.tenant == tenant

            def changed(job: JobRecord) -> bool:
                # The reason too: an attempt waiting on ImagePullBackOff is news before its phase moves.
                state = (job.phase, job.attempt, job.cancel_requested, job.reason)
                if last_sent.get(job.job_id) == state:
                    return False
                last_sent[job.job_id] = state
                return True

            if request.include_initial or request.job_id:
                # Read whole before the first yield: the cache changes while the stream waits.
                if request.job_id:
                    found = self._cache.get(JobId(request.job_id))
                    # An archived job is in no cache: its one (ended) state is all there is to send.
                    initial = [first] if found is None and first.value.phase.is_terminal else []
                    initial = initial if found is None else [found]
                else:
                    initial = list(self._cache.ordered(tenant))
                for stored in initial:
                    if wanted(stored.value) and changed(stored.value):
                        yield pb.JobEvent(job=self._shown(who, stored.value))
                if request.job_id:
                    current = self._cache.get(JobId(request.job_id)) or first
                    if current.value.phase.is_terminal:
                        return
            while True:
                try:
                    event = await next_event(queue, guard)
                except GpufedError as error:
                    # Revoked, or moved to another tenant or role: the stream's scope is no longer theirs.
                    await _abort(context, error, who)
                    return
                if event is None:
                    # The cache dropped this subscriber (it fell too far behind): end the stream so
                    # the client re-watches with include_initial instead of silently missing changes.
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "watch fell behind; watch again")
                    return
                job = event.job
                if job is None or not wanted(job) or not changed(job):
                    continue
                yield pb.JobEvent(job=self._shown(who, job))
                if request.job_id and job.phase.is_terminal:
                    return
        finally:
            self._cache.unsubscribe(queue)

    async def CancelJob(self, request: pb.CancelJobRequest, context: Ctx) -> pb.Job:
        return await self._h.unary("CancelJob", request, context, self._cancel)

    async def _cancel(self, who: Principal, req: pb.CancelJobRequest) -> pb.Job:
        stored = await self._visible_job(who, req.job_id)
        for _ in range(5):
            check_write_job(who, stored.value.tenant, req.job_id)
            job = stored.value
            if job.phase.is_terminal:
                raise FailedPrecondition(f"job {job.job_id} already {job.phase}")
            if job.cancel_requested:
                return self._shown(who, job)
            # The API only records the request; the dispatcher (the one writer of that transition)
            # stops the gang and moves the job to CANCELLED.
            reason = free_text(req.reason[:256], "reason") or f"cancelled by {who.user}"
            updated = replace(job, cancel_requested=True, message=reason)
            if await self._store.commit([(updated, stored.mod_revision)]) is not None:
                log.info("job_cancel_requested", job_id=job.job_id, tenant=job.tenant, user=who.user)
                if self._security is not None:
                    # A cancel stops someone's GPUs: who did it must be on record, as an admin's action is.
                    event = AuditEvent(
                        self._clock(),
                        who.user,
                        who.role.value,
                        "job_cancel_requested",
                        job.job_id,
                        f"tenant={job.tenant} reason={reason}",
                    )
                    await self._security.append_audit(event)
                return self._shown(who, updated)
            await asyncio.sleep(0.01)
            # Again from etcd, not the cache: the compare failed because the job was written after
            # the record this server holds, and its cache may trail that write for longer than these
            # tries last (a busy server's watch), so every retry from it would fail the same way.
            fresh = await self._store.get_job(job.job_id)
            if fresh is None:
                raise NotFound(job_not_found(req.job_id))
            stored = fresh
        raise FailedPrecondition(f"job {req.job_id} is changing too fast to cancel; try again")

    async def ExplainJob(self, request: pb.ExplainJobRequest, context: Ctx) -> pb.ExplainJobResponse:
        async def body(who: Principal, req: pb.ExplainJobRequest) -> pb.ExplainJobResponse:
            redactor = self.redactor(who)
            job = redactor.job((await self._visible_job(who, req.job_id)).value)
            reasons: tuple[WaitReason, ...] = ()
            if job.phase is JobPhase.QUEUED:
                # Reasons are read from etcd: within the caller's read limit.
                self._read_limiter.admit(who.user)
                reasons = await self._store.get_wait_reasons(job.job_id)
            reasons = redactor.reasons(reasons)
            summary = explain_summary(job, len(reasons), now=self._clock())
            # Held out of the placer's queue until another job makes its input (issue 34).
            awaiting = self._datasets.awaiting(job) if job.phase is JobPhase.QUEUED else ""
            return pb.ExplainJobResponse(
                job_id=job.job_id,
                phase=convert.phase_to_pb(job.phase),
                summary=f"queued; {awaiting}" if awaiting else summary,
                reasons=[convert.wait_reason_to_pb(r) for r in reasons],
            )

        return await self._h.unary("ExplainJob", request, context, body)


async def visible_job(
    who: Principal,
    job_id: str,
    cache: JobCache,
    store: JobStore,
    history: HistoryStore | None,
    read_limiter: ReadRateLimiter,
) -> Stored[JobRecord]:
    """The job if the caller may read it, live or archived; else NOT_FOUND, in the same words and
    (as near as the reads can make it) the same time whether it is another tenant's or not there.

    A job of the caller's in the cache is answered from it. Otherwise (the cache may trail a write
    made a moment ago on this or another server, or the job is not the caller's): one etcd read, and
    one history read unless etcd had the caller's own job, within the caller's read limit (a flood
    of made-up ids must not become a flood of reads). The history is read for another tenant's live
    job too, not only for a job etcd lacks: skipping it there made "another tenant's" answer a
    quarter faster than "does not exist" (tests/e2e/test_isolation_matrix.py times the two).
    """
    if not job_id:
        raise InvalidArgument("job_id: required")
    if len(job_id) > MAX_JOB_ID_LENGTH:
        raise InvalidArgument(f"job_id: at most {MAX_JOB_ID_LENGTH} characters, got {len(job_id)}")
    cached = cache.get(JobId(job_id))
    if cached is not None and can_read_tenant(who, cached.value.tenant):
        return cached
    read_limiter.admit(who.user)
    try:
        stored = await store.get_job(JobId(job_id))
    except SchemaTooNew as e:
        # A record newer than this build: its tenant and admins read why, anyone else "not found".
        if who.is_admin or (e.tenant is not None and can_read_tenant(who, TenantId(e.tenant))):
            raise
        raise NotFound(job_not_found(job_id)) from None
    if stored is None or not can_read_tenant(who, stored.value.tenant):
        archived = await archived_job(history, JobId(job_id))
        stored = archived if stored is None else stored
    if stored is None or not can_read_tenant(who, stored.value.tenant):
        raise NotFound(job_not_found(job_id))
    return stored


def job_cost(stored: Stored[JobRecord], ledger: LedgerCache | None, *, now_s: float) -> str:
    """`Job.cost_usd` of a job the caller may read: from etcd's ledger while the job is live, from
    the intervals read with its record once archived (`archived_job`, so the history is not asked
    a second time); '' when it never ran."""
    if isinstance(stored, ArchivedStored):
        intervals = stored.intervals
    else:
        intervals = () if ledger is None else tuple(ledger.for_job(stored.value.job_id))
    return job_cost_text(intervals, now_s=now_s)


class ArchivedStored(Stored[JobRecord]):
    """An archived job's record as the live store gives one (revision 0: it is ended, nobody writes
    it), with the ledger intervals read in the same history read, for its cost."""

    __slots__ = ("intervals",)

    def __init__(self, value: JobRecord, intervals: tuple[LedgerInterval, ...]) -> None:
        super().__init__(value, 0)
        self.intervals = intervals


async def archived_job(history: HistoryStore | None, job_id: JobId) -> ArchivedStored | None:
    """An archived job as the live store gives one, with its intervals."""
    if history is None:
        return None
    found = await asyncio.to_thread(history_reads.get_job, history, job_id)
    return None if found is None else ArchivedStored(found.record, found.intervals)


def since_filtered(
    walked: Iterator[Stored[JobRecord]], since_s: float | None, newest_first: bool
) -> Iterator[JobRecord]:
    """The walked jobs submitted at or after `since_s`; newest first, the walk stops below it."""
    for stored in walked:
        job = stored.value
        if since_s is not None and job.submitted_at_s < since_s:
            if newest_first:
                return
            continue
        yield job


def explain_summary(job: JobRecord, reason_count: int, *, now: float) -> str:
    placed = job.placement
    # A cluster that refused the job's dispatch is not asked again until its backoff has passed.
    backoff = "" if job.phase.is_terminal else backoff_text(job, now)
    if job.phase is JobPhase.QUEUED:
        waited = max(0.0, now - job.queued_at_s)
        if job.cancel_requested:
            return "queued; cancellation requested"
        if reason_count == 0:
            text = f"queued for {waited:.0f}s; not yet considered by a scheduling cycle"
            return f"{text}; {backoff}" if backoff else text
        if backoff:
            return f"queued for {waited:.0f}s (attempt {job.attempt}); {backoff}; waiting because:"
        return f"queued for {waited:.0f}s (attempt {job.attempt}); waiting because:"
    if placed is not None and not job.phase.is_terminal:
        text = (
            f"{job.phase.value.lower()} on {placed.cluster} ({job.spec.gpu_count} x {placed.gpu_type}, "
            f"{placed.kind.value}, ${placed.usd_per_gpu_hour:.2f}/GPU-hour), attempt {job.attempt}"
        )
        # Why there: the placer's words at admission (price, type, data, what it beat).
        why = next((e.reason for e in reversed(job.events) if e.phase is JobPhase.ADMITTED), "")
        text += f"; {why.partition('; ')[2]}" if "; placed on" in why else ""
        return f"{text}; {backoff}" if backoff else text
    return f"{job.phase.value.lower()}: {job.message}" if job.message else job.phase.value.lower()


class FederationService(pb_grpc.FederationServiceServicer):
    def __init__(
        self,
        *,
        auth: Authenticator,
        metrics: Metrics,
        clusters: Callable[[], Awaitable[list[ClusterState]]],
        refusing: Callable[[], Mapping[ClusterName, ClusterRefusing]] | None = None,
    ) -> None:
        self._h = CallHandlers(auth, metrics)
        self._clusters = clusters
        # Clusters that keep refusing dispatches, from the live jobs' records (any server has them).
        self._refusing = refusing

    async def WhoAmI(self, request: pb.WhoAmIRequest, context: Ctx) -> pb.Identity:
        async def body(who: Principal, _req: pb.WhoAmIRequest) -> pb.Identity:
            return pb.Identity(user=who.user, tenant=who.tenant, role=who.role.value)

        return await self._h.unary("WhoAmI", request, context, body)

    async def ListClusters(self, request: pb.ListClustersRequest, context: Ctx) -> pb.ListClustersResponse:
        async def body(_who: Principal, _req: pb.ListClustersRequest) -> pb.ListClustersResponse:
            refusing = {} if self._refusing is None else self._refusing()
            clusters = []
            for state in await self._clusters():
                cluster = convert.cluster_to_pb(state)
                refusal = refusing.get(state.name)
                if refusal is not None:
                    cluster.state = "refusing"
                    cluster.last_error = refusal.last_error
                    cluster.refusing_since.FromNanoseconds(int(refusal.since_s * 1e9))
                    cluster.refused_jobs = refusal.jobs
                    cluster.next_try.FromNanoseconds(int(refusal.retry_at_s * 1e9))
                clusters.append(cluster)
            return pb.ListClustersResponse(clusters=clusters)

        return await self._h.unary("ListClusters", request, context, body)
