"""The reconciler's hook where an attempt ends: keep its logs, and name why it failed.

Called before the transition that ends an attempt is committed, so that the copy is taken while the
gang's pods still exist (the collector deletes them only once the job's record has moved on). The
reads are bounded by `keep_timeout_s`: a cluster that does not answer costs the job that much delay
once, and its attempt is kept without logs, with a note that says why.

An attempt that gpufed itself stops (a cancel, a preemption, a move) loses its pods before it can
end: the gang is deleted, and the transition is committed only once the pods are gone. So while
such an attempt is being stopped, from the tick before the stop is sent until its pods are gone,
`stopping` copies its replicas and logs at most every `STOP_PROBE_S`, and `ended` keeps the last copy
of each replica it can no longer read live. Such a copy may miss the lines written after it was
taken; it says so (`KeptReplica.cut`), as does a copy whose first lines did not fit `keep_kib`.
The attempt's start comes from its gang, or else from the job's own history (its RUNNING event,
where the ledger's interval starts too).

The same pods give the failure reason that `get`, `list` and `watch` show (OOMKilled, Error (exit 3),
Evicted), and, while a dispatched gang waits, the reason no waiting will cure (ImagePullBackOff),
looked up at most every `WAIT_PROBE_S` per job.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol, TypeGuard, TypeVar, runtime_checkable

import structlog

from clusters.api import (
    ClusterError,
    GangInspector,
    GangPhase,
    GangStatus,
    KilledPodLogs,
    LogOptions,
    ReplicaState,
)
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
from placement.model import JobId, JobPhase, TenantId

log = structlog.get_logger("gpufed.logs")

WAIT_PROBE_S = 5.0
# How often an attempt being stopped is copied; and how long one copy may take, so that a cluster
# that does not answer holds up the stop that little.
STOP_PROBE_S = 1.0
STOP_READ_TIMEOUT_S = 2.0
# The log lines asked for per replica: enough to fill `keep_kib` with short lines, and no more.
_MIN_TAIL_LINES = 1000


@dataclass(frozen=True, slots=True)
class _Copy:
    """An attempt's replicas and logs as read while it was being stopped."""

    replicas: tuple[ReplicaState, ...]
    logs: dict[tuple[str, int], bytes]
    # When each replica's log was last read (a pod gone between two copies keeps its older one).
    read_at_s: dict[tuple[str, int], float]
    # The replicas whose copy lacks its first lines (more than `keep_kib`).
    head_cut: frozenset[tuple[str, int]]


class AttemptKeeper:
    def __init__(
        self, archive: LogArchive, members: MemberClusters, clock: Callable[[], float] = time.time
    ) -> None:
        self._archive = archive
        self._members = members
        self._clock = clock
        self._probed_at: dict[str, float] = {}
        # The last copy of each attempt being stopped, by (job, attempt); taken by `stopping`,
        # used and dropped by `ended`. Per process: a new leader copies again from its first tick.
        self._copies: dict[tuple[str, int], _Copy] = {}
        self._copied_at: dict[tuple[str, int], float] = {}
        # When each attempt `ended` kept had started, by its gang, its history or its pods; taken by
        # the reconciler (`started_at_s`) for the ledger of an attempt whose gang gave no start.
        self._started: dict[tuple[str, int], float] = {}

    def started_at_s(self, job_id: str, attempt: int) -> float | None:
        """When the attempt that `ended` just kept had started (once: the entry is dropped)."""
        return self._started.pop((job_id, attempt), None)

    async def stopping(self, job: JobRecord, gang: GangStatus | None) -> None:
        """Copy the logs of an attempt that is being stopped, while its pods are still there."""
        key = (job.job_id, job.attempt)
        inspector = self._inspector(job)
        if inspector is None or gang is None or gang.live_pods == 0:
            return
        now = time.monotonic()
        if now - self._copied_at.get(key, float("-inf")) < STOP_PROBE_S:
            return
        self._copied_at[key] = now
        timeout_s = min(self._archive.settings.keep_timeout_s, STOP_READ_TIMEOUT_S)
        try:
            replicas = await asyncio.wait_for(
                inspector.replicas(job.tenant, job.job_id, job.attempt), timeout_s
            )
            logs, head_cut = await asyncio.wait_for(self._logs(inspector, job, replicas), timeout_s)
        except (ClusterError, TimeoutError):
            return
        before = self._copies.get(key)
        read_s = self._clock()
        merged_logs = dict(before.logs) if before is not None else {}
        read_at_s = dict(before.read_at_s) if before is not None else {}
        cut = set(before.head_cut) if before is not None else set()
        for where, data in logs.items():
            if data:
                merged_logs[where], read_at_s[where] = data, read_s
                cut.discard(where)
                if where in head_cut:
                    cut.add(where)
        states = {
            locate(r, job.spec, job.job_id, job.attempt): r for r in (before.replicas if before else ())
        }
        states.update({locate(r, job.spec, job.job_id, job.attempt): r for r in replicas})
        self._copies[key] = _Copy(tuple(states.values()), merged_logs, read_at_s, frozenset(cut))

    def _inspector(self, job: JobRecord) -> GangInspector | None:
        if job.placement is None:
            return None
        backend = self._members.get(job.placement.cluster)
        return backend if backend is not None and conforms(backend, GangInspector) else None  # type: ignore[type-abstract]

    async def ended(self, before: JobRecord, after: JobRecord, gang: GangStatus | None) -> JobRecord:
        """`after` with its failure reason, once the ended attempt of `before` is kept."""
        placement = before.placement
        if placement is None:
            return after
        self._probed_at.pop(before.job_id, None)
        copy = self._copies.pop((before.job_id, before.attempt), None)
        self._copied_at.pop((before.job_id, before.attempt), None)
        started = time.monotonic()
        inspector = self._inspector(before)
        replicas: Sequence[ReplicaState] = ()
        logs: dict[tuple[str, int], bytes] = {}
        killed: set[tuple[str, int]] = set()
        head_cut: set[tuple[str, int]] = set()
        note = ""
        timeout_s = self._archive.settings.keep_timeout_s
        if inspector is None:
            note = f"cluster {placement.cluster} shows no pods"
        else:
            # Each read within its own `asyncio.timeout`, not `wait_for`: the same bound without a
            # task of its own for every read of every ended attempt.
            try:
                async with asyncio.timeout(timeout_s):
                    replicas = await _ended_replicas(inspector, before)
                if not replicas and conforms(inspector, KilledPodLogs):  # type: ignore[type-abstract]
                    # The cluster killed them (a drain, an eviction) and they went: the backend
                    # read their logs as they were killed.
                    async with asyncio.timeout(timeout_s):
                        replicas = await inspector.killed_replicas(
                            before.tenant, before.job_id, before.attempt
                        )
                    killed = {locate(r, before.spec, before.job_id, before.attempt) for r in replicas}
                async with asyncio.timeout(timeout_s):
                    logs, head_cut = await self._logs(inspector, before, replicas)
            except (ClusterError, TimeoutError) as error:
                note = f"logs not kept: cluster {placement.cluster}: {error or 'no answer in time'}"
        failed = gang is None or gang.phase in (GangPhase.FAILED, GangPhase.EVICTED)
        reason = failure_reason(replicas) if failed and after.phase is not JobPhase.CANCELLED else ""
        if not reason and gang is not None and gang.phase is GangPhase.EVICTED:
            reason = "Evicted"
        kept_replicas = self._kept_replicas(before, replicas, logs, copy, killed, head_cut)
        if copy is not None and note.startswith("logs not kept") and any(r.size_bytes for r in kept_replicas):
            note = f"{note}; kept the copy taken while the attempt was being stopped"
        kept = KeptAttempt(
            attempt=before.attempt,
            cluster=placement.cluster,
            gpu_type=placement.gpu_type,
            capacity_kind=placement.kind.value,
            usd_per_gpu_hour=placement.usd_per_gpu_hour,
            started_at_s=_started_at_s(before, gang, kept_replicas),
            finished_at_s=(gang.finished_at_s if gang is not None else None) or self._clock(),
            outcome=(gang.phase.value if gang is not None else "LOST"),
            reason=reason or ("" if gang is None else gang.message),
            kept_at_s=self._clock(),
            note=note,
            replicas=tuple(kept_replicas),
        )
        if kept.started_at_s is not None:
            self._started[(before.job_id, before.attempt)] = kept.started_at_s
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
                replicas=len(kept_replicas),
                size_bytes=sum(r.size_bytes for r in kept_replicas),
                reason=reason,
                took_s=round(time.monotonic() - started, 3),
            )
        return replace(after, reason=reason)

    def _kept_replicas(
        self,
        job: JobRecord,
        replicas: Sequence[ReplicaState],
        logs: dict[tuple[str, int], bytes],
        copy: _Copy | None,
        killed: set[tuple[str, int]],
        head_cut: set[tuple[str, int]],
    ) -> list[KeptReplica]:
        """Each replica once, the live read first; one that read nothing (its pod gone) from the
        copy taken while the attempt was stopped, marked as such. `logs` gains the copy's bytes."""
        keep = self._archive.settings.keep_bytes
        states = {locate(r, job.spec, job.job_id, job.attempt): r for r in replicas}
        cuts: dict[tuple[str, int], list[str]] = {
            where: ["read as its pod was killed; lines written after that were not kept"]
            for where in killed
            if logs.get(where)
        }
        if copy is not None:
            for r in copy.replicas:
                where = locate(r, job.spec, job.job_id, job.attempt)
                states.setdefault(where, r)
                if not logs.get(where) and copy.logs.get(where):
                    logs[where] = copy.logs[where]
                    if where in copy.head_cut:
                        head_cut.add(where)
                    at_s = copy.read_at_s[where]
                    at = datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                    cuts.setdefault(where, []).append(
                        f"copied at {at} while the attempt was being stopped; "
                        "lines written after that were not kept"
                    )
        out = []
        for where, r in sorted(states.items()):
            data = logs.get(where, b"")
            if where in head_cut and data:
                cuts.setdefault(where, []).insert(
                    0, f"its first lines were not kept (the last {keep // 1024} KiB are, logs.keepKiB)"
                )
            out.append(KeptReplica(where[0], where[1], r, len(data), "; ".join(cuts.get(where, []))))
        return out

    async def _logs(
        self, inspector: GangInspector, job: JobRecord, replicas: Sequence[ReplicaState]
    ) -> tuple[dict[tuple[str, int], bytes], set[tuple[str, int]]]:
        """Each replica's log as kept, and the replicas whose read held more than is kept (their
        first lines were not kept)."""
        keep = self._archive.settings.keep_bytes
        tail_lines = _tail_lines(keep)
        options = LogOptions(timestamps=True, tail_lines=tail_lines)

        async def one(r: ReplicaState) -> tuple[tuple[str, int], bytes]:
            where = locate(r, job.spec, job.job_id, job.attempt)
            try:
                data = b"".join([c async for c in inspector.pod_log(job.tenant, r, options)])
            except ClusterError:
                data = b""
            # Cut here to `keep_kib`, or (as far as one can tell) by the API at `tail_lines`.
            if len(data) > keep or data.count(b"\n") >= tail_lines:
                head_cut.add(where)
            return where, last_bytes(data, keep)

        head_cut: set[tuple[str, int]] = set()
        return dict(await asyncio.gather(*(one(r) for r in replicas))), head_cut

    def probe_due(self, job: JobRecord) -> bool:
        """Whether `waiting` would ask the cluster now why the job's pending gang waits: once it has
        been seen pending for WAIT_PROBE_S, then every WAIT_PROBE_S. Not at first sight: most gangs
        start within that, and each probe is a call; a burst's thousands of gangs, each seen
        pending once, made as many calls (bench/scale.py)."""
        now = self._clock()
        return now - self._probed_at.setdefault(job.job_id, now) >= WAIT_PROBE_S

    async def waiting(self, job: JobRecord, gang: GangStatus | None) -> JobRecord | None:
        """The job with the reason its dispatched gang waits, when that changed; else None."""
        if gang is not None and gang.phase is GangPhase.RUNNING and job.reason in WAITING_REASONS:
            return replace(job, reason="")
        if gang is None or gang.phase is not GangPhase.PENDING:
            return None
        if not self.probe_due(job):
            return None
        now = self._clock()
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


@runtime_checkable
class EndedReplicas(Protocol):
    """A backend that can tell an ended attempt's pods from what it already watches, without a
    call (the Kubernetes backend's pod watch), or None when it cannot be sure they are all there."""

    async def ended_replicas(
        self, tenant: TenantId, job_id: JobId, attempt: int, pods: int
    ) -> Sequence[ReplicaState] | None: ...


async def _ended_replicas(inspector: GangInspector, job: JobRecord) -> Sequence[ReplicaState]:
    """The ended attempt's pods: from the backend's watch where it holds them all, else listed. One
    call fewer for every attempt the keeper keeps, on the server and on the cluster's API server."""
    if conforms(inspector, EndedReplicas):  # type: ignore[type-abstract]
        watched = await inspector.ended_replicas(job.tenant, job.job_id, job.attempt, job.spec.replica_count)
        if watched is not None:
            return watched
    return await inspector.replicas(job.tenant, job.job_id, job.attempt)


P = TypeVar("P")
# (class, protocol) -> whether the class has every member of the protocol.
_CONFORMING: dict[tuple[type, type], bool] = {}


def conforms(obj: object, protocol: type[P]) -> TypeGuard[P]:
    """`isinstance(obj, protocol)` for a runtime-checkable protocol, without its walk of every member
    when `obj`'s class has them all (the answer for every instance, kept by class): the keeper asks
    two or three times an ended attempt, and the walks were 1.6 % of the server's CPU in
    bench/scale.py. Otherwise asked as before, as an instance may carry a member its class lacks.
    (mypy refuses a protocol passed as a value, python/mypy#4717: the callers say so.)"""
    key = (type(obj), protocol)
    whole = _CONFORMING.get(key)
    if whole is None:
        try:
            whole = _CONFORMING[key] = issubclass(type(obj), protocol)
        except TypeError:  # a protocol with data members: no class-wide answer
            whole = _CONFORMING[key] = False
    return whole or isinstance(obj, protocol)


def _tail_lines(keep_bytes: int) -> int:
    return max(_MIN_TAIL_LINES, keep_bytes // 16)


def _started_at_s(job: JobRecord, gang: GangStatus | None, kept: Sequence[KeptReplica]) -> float | None:
    """When the attempt started: by its gang; else by the job's own history (its RUNNING event,
    where the ledger's interval starts); else by its earliest container."""
    if gang is not None and gang.started_at_s is not None:
        return gang.started_at_s
    running = [e.at_s for e in job.events if e.attempt == job.attempt and e.phase is JobPhase.RUNNING]
    if running:
        return running[0]
    starts = [r.state.started_at_s for r in kept if r.state.started_at_s is not None]
    return min(starts) if starts else None
