"""The `Logs` service: a job's logs and a describe view, through the one endpoint.

An engineer reads the logs of their own tenant's jobs without a kubeconfig for any member cluster:
the server reads the pods' logs with the cluster's credentials and relays them. Who may read which
job is decided exactly as for `GetJob` (another tenant's job is NOT_FOUND, in the same words as a
missing one), and what one caller can take is bounded: bytes per call, open streams per tenant and
per server (RESOURCE_EXHAUSTED, with the limit in the message). A cluster that cannot be reached is
UNAVAILABLE naming it; a follow already streaming says so in a notice and goes on when it answers.
Attempts whose pods are gone are served from the copy kept when they ended (`federation.joblogs.archive`):
in etcd, or in the history store once the job was archived (read through `HistoryStore`, with the
same retention and the same cutting). Tails an older archiver left in etcd are read there.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import grpc
import structlog

from clusters.api import ClusterUnreachable, GangInspector, LogOptions, LogUnavailable
from federation.api import history_reads
from federation.api.logs_describe import describe, kept_attempts, set_savings
from federation.api.redact import Redactor, error_text
from federation.api.service import CallHandlers, Ctx, visible_job
from federation.api.status import status_code_for
from federation.api.streams import StreamGuard
from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc
from federation.errors import FailedPrecondition, GpufedError, InvalidArgument, NotFound, RateLimited
from federation.history.protocol import HistoryStore
from federation.joblogs.archive import (
    WAITING_REASONS,
    KeptAttempt,
    KeptReplica,
    LogArchive,
    LogsSettings,
    locate,
)
from federation.joblogs.stream import KEPT, Chunk, Target, merged, select_kept
from federation.ledger.cache import LedgerCache
from federation.ledger.job_cost import job_cost_text
from federation.metrics import Metrics
from federation.scheduling.members import MemberClusters
from federation.secrets.jobs import JobSecretMasks
from federation.secrets.masking import SecretMask
from federation.security.auth import Authenticator, Principal
from federation.security.ratelimit import ReadRateLimiter
from federation.store.intervals import LedgerInterval
from federation.store.job_cache import JobCache
from federation.store.job_store import JobStore
from federation.store.jobs import JobRecord
from placement.model import JobId, TenantId

log = structlog.get_logger("gpufed.api.logs")

# Between tries to read a follow's log again after its cluster stopped answering.
RETRY_S = 1.0


class ClusterUnavailable(GpufedError):
    """The job's cluster does not answer (UNAVAILABLE, by `federation.api.status`)."""

    retryable = True


class StreamLimits:
    """Open StreamLogs calls on this server, per tenant and in all."""

    def __init__(self, per_tenant: int, per_server: int) -> None:
        self._per_tenant = per_tenant
        self._per_server = per_server
        self._open: Counter[TenantId] = Counter()

    @contextmanager
    def slot(self, tenant: TenantId) -> Iterator[None]:
        if self._open[tenant] >= self._per_tenant:
            raise RateLimited(
                f"tenant {tenant} already has {self._per_tenant} log streams open (its limit per server); "
                "close one and try again"
            )
        if sum(self._open.values()) >= self._per_server:
            raise RateLimited(
                f"this server already streams {self._per_server} logs (its limit); try again later"
            )
        self._open[tenant] += 1
        try:
            yield
        finally:
            self._open[tenant] -= 1


def _options(req: pb.StreamLogsRequest) -> LogOptions:
    tail = req.tail_lines if req.HasField("tail_lines") else None
    since = req.since_seconds if req.HasField("since_seconds") else None
    if tail is not None and tail < 0:
        raise InvalidArgument("tail_lines: must not be negative")
    if since is not None and since <= 0:
        raise InvalidArgument("since_seconds: must be positive")
    return LogOptions(
        follow=req.follow, tail_lines=tail, since_s=since, timestamps=req.timestamps, previous=req.previous
    )


def _pb(chunk: Chunk, attempt: int) -> pb.LogChunk:
    return pb.LogChunk(
        task=chunk.task,
        replica=chunk.replica,
        attempt=attempt,
        pod=chunk.pod,
        lines=list(chunk.lines),
        source=chunk.source,
        notice=chunk.notice,
        container=chunk.container,
    )


def _why_none(kept: KeptAttempt, chosen: list[KeptReplica]) -> str:
    """Why an ended attempt has no kept lines, in the words a user can act on."""
    if kept.note:
        return kept.note
    if not kept.replicas:
        return (
            f"its pods were gone from cluster {kept.cluster} before they could be read "
            f"(it ended {kept.outcome or 'without an outcome'})"
        )
    if not chosen:
        shown = ", ".join(sorted({f"{r.task}-{r.replica}" for r in kept.replicas}))
        return f"no replica matches --task/--replica (kept: {shown})"
    if all(r.state.phase == "Pending" or r.state.reason in WAITING_REASONS for r in chosen):
        reasons = sorted({r.state.reason for r in chosen if r.state.reason})
        return "its containers never started" + (f" ({', '.join(reasons)})" if reasons else "")
    return "its containers wrote nothing before the attempt ended"


def _unmasked(missing: Sequence[str]) -> str:
    return (
        f"secret(s) {', '.join(missing)} were deleted after this job was given them: "
        "values of theirs that its programs printed cannot be masked here"
    )


class LogsService(pb_grpc.LogsServicer):
    def __init__(
        self,
        *,
        store: JobStore,
        cache: JobCache,
        auth: Authenticator,
        metrics: Metrics,
        members: MemberClusters,
        archive: LogArchive,
        read_limiter: ReadRateLimiter | None = None,
        clock: Callable[[], float] = time.time,
        history: HistoryStore | None = None,
        ledger: LedgerCache | None = None,
        masks: JobSecretMasks | None = None,
    ) -> None:
        self._store = store
        # The job's secret values, masked out of its logs and describe view (None: no secrets).
        self._masks = masks
        # Ended jobs archived to SQL (issue 19): their record and attempt summaries; None: live only.
        self._history = history
        # etcd's usage ledger, for a live job's cost (None: no cost shown).
        self._ledger = ledger
        self._cache = cache
        self._auth = auth
        self._h = CallHandlers(auth, metrics)
        self._metrics = metrics
        self._members = members
        self._archive = archive
        self._settings: LogsSettings = archive.settings
        self._limits = StreamLimits(
            self._settings.max_streams_per_tenant, self._settings.max_streams_per_server
        )
        self._read_limiter = read_limiter or ReadRateLimiter()
        self._clock = clock

    @property
    def members(self) -> MemberClusters:
        """The member clusters whose pods' logs this service reads (a sweep's early stopping reads
        its running trials' logs through them too)."""
        return self._members

    async def _visible_job(self, who: Principal, job_id: str) -> JobRecord:
        """As `GetJob` decides: one answer, at one cost, for "not yours" and "not there"."""
        stored = await visible_job(who, job_id, self._cache, self._store, self._history, self._read_limiter)
        return stored.value

    async def _mask(self, job: JobRecord) -> SecretMask:
        if self._masks is None:
            return SecretMask(())
        return await self._masks.for_job(job.tenant, job.spec)

    def _archived(self, job: JobRecord) -> bool:
        # Ended and gone from etcd (so from the cache): its pods were collected long ago.
        return job.phase.is_terminal and self._cache.get(job.job_id) is None

    # ---- StreamLogs

    async def StreamLogs(self, request: pb.StreamLogsRequest, context: Ctx) -> AsyncIterator[pb.LogChunk]:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        caller: Principal | None = None  # known once authenticated: whom an error's detail is for
        try:
            who = caller = await self._h.principal(context)
            job = await self._visible_job(who, request.job_id)
            options = _options(request)
            attempt = request.attempt or job.attempt
            if attempt < 0 or attempt > job.attempt:
                raise InvalidArgument(f"attempt: job {job.job_id} has attempts 1 to {job.attempt}")
        except GpufedError as error:
            await context.abort(status_code_for(error), error_text(error, caller))
            return
        guard = StreamGuard(self._auth, context.invocation_metadata(), who)
        sent_bytes = 0
        limit = self._settings.max_bytes_per_call
        try:
            mask = await self._mask(job)
            with self._limits.slot(job.tenant):
                if mask.missing:
                    yield _pb(Chunk("", 0, "", notice=_unmasked(mask.missing), source=KEPT), attempt)
                async for chunk in self._chunks(job, attempt, request, options):
                    await guard.check()
                    if mask and chunk.lines:
                        chunk = replace(chunk, lines=tuple(mask.text(line) for line in chunk.lines))
                    size = sum(len(line) + 1 for line in chunk.lines)
                    if sent_bytes + size > limit:
                        raise RateLimited(
                            f"the log output reached {limit} bytes, the limit per call; "
                            "narrow it with --tail, --since, --task or --replica"
                        )
                    sent_bytes += size
                    yield _pb(chunk, attempt)
        except GpufedError as error:
            code = status_code_for(error)
            log.info("logs_refused", job_id=job.job_id, tenant=job.tenant, code=code.name, error=str(error))
            await context.abort(code, error_text(error, who))
        finally:
            self._metrics.observe_call("StreamLogs", code.name, time.perf_counter() - started)

    def _live(self, job_id: JobId, attempt: int) -> Callable[[], bool]:
        def live() -> bool:
            found = self._cache.get(job_id)
            return found is not None and found.value.attempt == attempt and not found.value.phase.is_terminal

        return live

    async def _chunks(
        self, job: JobRecord, attempt: int, req: pb.StreamLogsRequest, options: LogOptions
    ) -> AsyncIterator[Chunk]:
        def wanted(task: str, replica: int) -> bool:
            return (not req.task or task == req.task) and (
                not req.HasField("replica") or replica == req.replica
            )

        if attempt == job.attempt and job.placement is not None and not self._archived(job):
            cluster = job.placement.cluster
            backend = self._members.get(cluster)
            if isinstance(backend, GangInspector):
                try:
                    replicas = await backend.replicas(job.tenant, job.job_id, attempt)
                except ClusterUnreachable as error:
                    kept = await self._archive.summary(job.job_id, attempt, self._clock())
                    if kept is None:
                        raise ClusterUnavailable(f"cluster {cluster} cannot be reached: {error}") from error
                    replicas = []
                if replicas:
                    targets = [
                        Target(*where, r)
                        for r in replicas
                        if wanted(*(where := locate(r, job.spec, job.job_id, attempt)))
                    ]
                    try:
                        async for chunk in merged(
                            backend,
                            cluster,
                            job.tenant,
                            targets,
                            options,
                            live=self._live(job.job_id, attempt),
                            retry_s=RETRY_S,
                            clock=self._clock,
                        ):
                            yield chunk
                    except ClusterUnreachable as error:
                        raise ClusterUnavailable(f"cluster {cluster} cannot be reached: {error}") from error
                    except LogUnavailable as error:
                        raise NotFound(str(error)) from error
                    return
        async for chunk in self._kept(job, attempt, options, wanted):
            yield chunk

    async def _kept_summary(
        self, job: JobRecord, attempt: int
    ) -> tuple[KeptAttempt | None, dict[tuple[str, int], bytes]]:
        """The attempt's kept summary if its logs are still served, and the tails the history store
        holds of it. An archived attempt with tails in the history is served from there, cut at
        the retention from when it was kept; any other from etcd (a live job's, or one an older
        archiver left there under its lease)."""
        now = self._clock()
        if self._history is not None and self._archived(job):
            tails = await asyncio.to_thread(history_reads.kept_logs, self._history, job.job_id, attempt)
            if tails:
                found = await asyncio.to_thread(history_reads.get_job, self._history, job.job_id)
                kept = None if found is None else kept_attempts(found.attempts).get(attempt)
                if kept is None or not self._archive.fresh(kept, now):
                    return None, {}
                return kept, {(t.task, t.replica): t.data for t in tails}
        return await self._archive.summary(job.job_id, attempt, now), {}

    async def _kept(
        self, job: JobRecord, attempt: int, options: LogOptions, wanted: Callable[[str, int], bool]
    ) -> AsyncIterator[Chunk]:
        kept, in_history = await self._kept_summary(job, attempt)
        if kept is None:
            if job.placement is None and attempt == job.attempt:
                # The job exists and the caller may read it: "not yet" is a state, not an absence
                # (NOT_FOUND stays the answer an outsider gets).
                raise FailedPrecondition(f"job {job.job_id} has not started yet: no logs")
            if self._archived(job):
                raise NotFound(
                    f"job {job.job_id} attempt {attempt}: ended and archived to the history store; its "
                    f"logs are no longer kept (kept tails last {self._settings.retain_hours:g} hours)"
                )
            raise NotFound(
                f"job {job.job_id} attempt {attempt}: no logs (its pods are gone and none were kept, or "
                f"they are older than {self._settings.retain_hours:g} hours)"
            )
        chosen = [
            r for r in sorted(kept.replicas, key=lambda k: (k.task, k.replica)) if wanted(r.task, r.replica)
        ]
        if not any(r.size_bytes for r in chosen):
            # Silence with exit status 0 would read as "the job printed nothing": say why.
            raise NotFound(f"job {job.job_id} attempt {attempt}: no logs kept: {_why_none(kept, chosen)}")
        for r in chosen:
            data = in_history.get((r.task, r.replica))
            if data is None:
                # In etcd: a live job's, or one an older archiver (or a gang too large for one
                # removal) left there under its lease.
                data = await self._archive.log(job.job_id, attempt, r.task, r.replica)
            if r.cut:
                yield Chunk(
                    r.task,
                    r.replica,
                    r.state.pod,
                    notice=f"kept copy cut: {r.cut}",
                    source=KEPT,
                    container=r.state.container,
                )
            lines = select_kept(data, options, self._clock())
            for i in range(0, len(lines), 512):
                yield Chunk(
                    r.task,
                    r.replica,
                    r.state.pod,
                    tuple(lines[i : i + 512]),
                    KEPT,
                    container=r.state.container,
                )
        if kept.note:
            yield Chunk("", 0, "", notice=kept.note, source=KEPT)

    # ---- DescribeJob

    def _tenant_of(self, job_id: JobId) -> TenantId | None:
        found = self._cache.get(job_id)
        return None if found is None else found.value.tenant

    async def DescribeJob(self, request: pb.DescribeJobRequest, context: Ctx) -> pb.JobDescription:
        async def body(who: Principal, req: pb.DescribeJobRequest) -> pb.JobDescription:
            job = await self._visible_job(who, req.job_id)
            archived = None
            found = None
            if self._history is not None and self._archived(job):
                found = await asyncio.to_thread(history_reads.get_job, self._history, job.job_id)
                archived = {} if found is None else kept_attempts(found.attempts)
            described = await describe(
                job,
                Redactor(who, self._tenant_of),
                members=self._members,
                archive=self._archive,
                store=self._store,
                now_s=self._clock(),
                archived=archived,
            )
            # An archived job's intervals came with it from SQL; a live one's are in etcd's ledger.
            if found is not None:
                intervals: Sequence[LedgerInterval] = found.intervals
            else:
                intervals = () if self._ledger is None else self._ledger.for_job(job.job_id)
            described.job.cost_usd = job_cost_text(intervals, now_s=self._clock())
            set_savings(described, intervals)
            # Termination messages and events are what its programs and pods wrote: masked too.
            (await self._mask(job)).message(described)
            return described

        return await self._h.unary("DescribeJob", request, context, body)
