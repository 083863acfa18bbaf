"""The reconciler's hook where an attempt ends: keep its logs, and name why it failed.

Called before the transition that ends an attempt is committed, so that the copy is taken while the
gang's pods still exist (the collector deletes them only once the job's record has moved on). The
reads are bounded by `keep_timeout_s`: a cluster that does not answer costs the job that much delay
once, and its attempt is kept without logs, with a note that says why.

The same pods give the failure reason that `get`, `list` and `watch` show (OOMKilled, Error (exit 3),
Evicted), and, while a dispatched gang waits, the reason no waiting will cure (ImagePullBackOff),
looked up at most every `WAIT_PROBE_S` per job.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import structlog

from clusters.api import ClusterError, GangInspector, GangPhase, GangStatus, LogOptions, ReplicaState
from clusters.logtext import last_bytes
from federation.joblogs.archive import (
    WAITING_REASONS,
    KeptAttempt,
    KeptReplica,
    LogArchive,
    failure_reason,
    locate,
    waiting_reason,
)
from federation.scheduling.members import MemberClusters
from federation.store.jobs import JobRecord
from placement.model import JobPhase

log = structlog.get_logger("gpufed.logs")

WAIT_PROBE_S = 5.0
# The log lines asked for per replica: enough to fill `keep_kib` with short lines, and no more.
_MIN_TAIL_LINES = 1000


class AttemptKeeper:
    def __init__(
        self, archive: LogArchive, members: MemberClusters, clock: Callable[[], float] = time.time
    ) -> None:
        self._archive = archive
        self._members = members
        self._clock = clock
        self._probed_at: dict[str, float] = {}

    def _inspector(self, job: JobRecord) -> GangInspector | None:
        if job.placement is None:
            return None
        backend = self._members.get(job.placement.cluster)
        return backend if isinstance(backend, GangInspector) else None

    async def ended(self, before: JobRecord, after: JobRecord, gang: GangStatus | None) -> JobRecord:
        """`after` with its failure reason, once the ended attempt of `before` is kept."""
        placement = before.placement
        if placement is None:
            return after
        self._probed_at.pop(before.job_id, None)
        started = time.monotonic()
        inspector = self._inspector(before)
        replicas: Sequence[ReplicaState] = ()
        logs: dict[tuple[str, int], bytes] = {}
        note = ""
        timeout_s = self._archive.settings.keep_timeout_s
        if inspector is None:
            note = f"cluster {placement.cluster} shows no pods"
        else:
            try:
                replicas = await asyncio.wait_for(
                    inspector.replicas(before.tenant, before.job_id, before.attempt), timeout_s
                )
                logs = await asyncio.wait_for(self._logs(inspector, before, replicas), timeout_s)
            except (ClusterError, TimeoutError) as error:
                note = f"logs not kept: cluster {placement.cluster}: {error or 'no answer in time'}"
        failed = gang is None or gang.phase in (GangPhase.FAILED, GangPhase.EVICTED)
        reason = failure_reason(replicas) if failed and after.phase is not JobPhase.CANCELLED else ""
        if not reason and gang is not None and gang.phase is GangPhase.EVICTED:
            reason = "Evicted"
        kept_replicas = []
        for r in replicas:
            task, index = locate(r, before.spec, before.job_id, before.attempt)
            kept_replicas.append(KeptReplica(task, index, r, len(logs.get((task, index), b""))))
        kept = KeptAttempt(
            attempt=before.attempt,
            cluster=placement.cluster,
            gpu_type=placement.gpu_type,
            capacity_kind=placement.kind.value,
            usd_per_gpu_hour=placement.usd_per_gpu_hour,
            started_at_s=None if gang is None else gang.started_at_s,
            finished_at_s=(gang.finished_at_s if gang is not None else None) or self._clock(),
            outcome=(gang.phase.value if gang is not None else "LOST"),
            reason=reason or ("" if gang is None else gang.message),
            kept_at_s=self._clock(),
            note=note,
            replicas=tuple(kept_replicas),
        )
        try:
            await self._archive.keep(before.job_id, kept, logs)
        except Exception as error:  # a lost copy must not stop the job's transition
            log.warning(
                "attempt_logs_not_kept", job_id=before.job_id, attempt=before.attempt, error=str(error)
            )
        else:
            log.info(
                "attempt_logs_kept",
                job_id=before.job_id,
                tenant=before.tenant,
                cluster=placement.cluster,
                attempt=before.attempt,
                replicas=len(logs),
                size_bytes=sum(len(v) for v in logs.values()),
                reason=reason,
                took_s=round(time.monotonic() - started, 3),
            )
        return replace(after, reason=reason)

    async def _logs(
        self, inspector: GangInspector, job: JobRecord, replicas: Sequence[ReplicaState]
    ) -> dict[tuple[str, int], bytes]:
        keep = self._archive.settings.keep_bytes
        options = LogOptions(timestamps=True, tail_lines=max(_MIN_TAIL_LINES, keep // 16))

        async def one(r: ReplicaState) -> tuple[tuple[str, int], bytes]:
            where = locate(r, job.spec, job.job_id, job.attempt)
            try:
                data = b"".join([c async for c in inspector.pod_log(job.tenant, r, options)])
            except ClusterError:
                data = b""
            return where, last_bytes(data, keep)

        return dict(await asyncio.gather(*(one(r) for r in replicas)))

    async def waiting(self, job: JobRecord, gang: GangStatus | None) -> JobRecord | None:
        """The job with the reason its dispatched gang waits, when that changed; else None."""
        if gang is not None and gang.phase is GangPhase.RUNNING and job.reason in WAITING_REASONS:
            return replace(job, reason="")
        if gang is None or gang.phase is not GangPhase.PENDING:
            return None
        now = self._clock()
        if now - self._probed_at.get(job.job_id, float("-inf")) < WAIT_PROBE_S:
            return None
        self._probed_at[job.job_id] = now
        inspector = self._inspector(job)
        if inspector is None:
            return None
        try:
            replicas = await asyncio.wait_for(
                inspector.replicas(job.tenant, job.job_id, job.attempt), WAIT_PROBE_S
            )
        except (ClusterError, TimeoutError):
            return None
        reason = waiting_reason(replicas)
        return None if reason == job.reason else replace(job, reason=reason)
