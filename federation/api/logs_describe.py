"""`gpufed describe`: one view of a job across all its attempts, as `kubectl describe` gives of a pod.

The current attempt is read live from its cluster (its pods, their last states, the events of the
gang's objects); ended attempts come from the summary kept when they ended (`federation.joblogs.archive`),
so they stay visible after their pods were collected or their cluster was lost. Where neither
exists, the job's own history still says where each attempt ran and how it ended.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from clusters.api import ClusterError, GangEvent, GangInspector, ReplicaState
from federation.api import convert
from federation.api.redact import Redactor
from federation.api.v1 import gpufed_pb2 as pb
from federation.history.model import ArchivedAttempt
from federation.joblogs.archive import KeptAttempt, LogArchive, kept_replica, locate, waiting_reason
from federation.ledger.report.savings import attempt_savings_text
from federation.scheduling.members import MemberClusters
from federation.store.intervals import LedgerInterval
from federation.store.job_store import JobStore
from federation.store.jobs import JobRecord
from placement.model import JobPhase


def _replica_pb(task: str, index: int, r: ReplicaState) -> pb.ReplicaDescription:
    out = pb.ReplicaDescription(
        task=task,
        replica=index,
        pod=r.pod,
        node=r.node,
        phase=r.phase,
        restarts=r.restarts,
        reason=r.reason,
        message=r.message,
    )
    if r.exit_code is not None:
        out.exit_code = r.exit_code
    if r.started_at_s is not None:
        out.started_at.CopyFrom(convert.timestamp(r.started_at_s))
    if r.finished_at_s is not None:
        out.finished_at.CopyFrom(convert.timestamp(r.finished_at_s))
    return out


def _event_pb(e: GangEvent) -> pb.KubeEvent:
    out = pb.KubeEvent(
        object_kind=e.object_kind,
        object_name=e.object_name,
        type=e.type,
        reason=e.reason,
        message=e.message,
        count=e.count,
    )
    if e.last_at_s is not None:
        out.last_at.CopyFrom(convert.timestamp(e.last_at_s))
    return out


def _times(job: JobRecord, attempt: int) -> tuple[float | None, float | None, str, str]:
    """(started, finished, outcome, reason) of an attempt from the job's own history."""
    started = finished = None
    outcome = reason = ""
    for e in job.events:
        if e.attempt == attempt and e.phase is JobPhase.RUNNING:
            started = e.at_s
        if e.attempt == attempt and e.phase.is_terminal:
            finished, outcome, reason = e.at_s, e.phase.value, e.reason
        if e.attempt == attempt + 1 and e.phase is JobPhase.QUEUED and finished is None:
            finished, outcome, reason = e.at_s, "REQUEUED", e.reason
    return started, finished, outcome, reason


def kept_attempts(attempts: Sequence[ArchivedAttempt]) -> dict[int, KeptAttempt]:
    """The attempt summaries the archiver copied to SQL, by attempt, as joblogs kept them."""
    out = {}
    for a in attempts:
        # A JSON round trip: a copy we may pop from, in the shape `joblogs.archive` wrote it.
        d: dict[str, Any] = json.loads(json.dumps(dict(a.summary)))
        try:
            replicas = tuple(kept_replica(r) for r in d.pop("replicas", []))
            out[a.attempt] = KeptAttempt(**d, replicas=replicas)
        except (KeyError, TypeError, ValueError):
            # The history keeps what it was given; a summary of another shape (an older joblogs, a
            # hand-written row) is skipped, and describe falls back to the job's own events.
            continue
    return out


def _kept_pb(kept: KeptAttempt, job: JobRecord) -> pb.AttemptDescription:
    """`job`: its own history gives the start a summary lacks (one kept once the gang object was
    gone, or by an older keeper), as the ledger has it."""
    out = pb.AttemptDescription(
        attempt=kept.attempt,
        cluster=kept.cluster,
        gpu_type=kept.gpu_type,
        capacity_kind=kept.capacity_kind,
        usd_per_gpu_hour=kept.usd_per_gpu_hour,
        outcome=kept.outcome,
        reason=kept.reason,
        replicas=[_replica_pb(r.task, r.replica, r.state) for r in kept.replicas],
        note="kept when the attempt ended" + (f"; {kept.note}" if kept.note else ""),
        logs_kept=any(r.size_bytes for r in kept.replicas),
    )
    started_at_s = kept.started_at_s if kept.started_at_s is not None else _times(job, kept.attempt)[0]
    if started_at_s is not None:
        out.started_at.CopyFrom(convert.timestamp(started_at_s))
    if kept.finished_at_s is not None:
        out.finished_at.CopyFrom(convert.timestamp(kept.finished_at_s))
    return out


async def _live(
    job: JobRecord, members: MemberClusters
) -> tuple[pb.AttemptDescription, Sequence[ReplicaState]] | None:
    """The current attempt from its cluster; None when it has no pods there (any more)."""
    placed = job.placement
    if placed is None:
        return None
    out = pb.AttemptDescription(
        attempt=job.attempt,
        cluster=placed.cluster,
        gpu_type=placed.gpu_type,
        capacity_kind=placed.kind.value,
        usd_per_gpu_hour=placed.usd_per_gpu_hour,
        reason=job.reason,
        note="live",
    )
    started, finished, outcome, _ = _times(job, job.attempt)
    if started is not None:
        out.started_at.CopyFrom(convert.timestamp(started))
    if finished is not None:
        out.finished_at.CopyFrom(convert.timestamp(finished))
    out.outcome = outcome
    backend = members.get(placed.cluster)
    if not isinstance(backend, GangInspector):
        out.note = f"cluster {placed.cluster} shows no pods"
        return out, ()
    try:
        replicas = await backend.replicas(job.tenant, job.job_id, job.attempt)
        events = await backend.events(job.tenant, job.job_id, job.attempt)
    except ClusterError as error:
        out.note = f"cluster {placed.cluster} cannot be reached: {error}"
        return out, ()
    if not replicas and job.phase.is_terminal:
        return None
    for r in replicas:
        task, index = locate(r, job.spec, job.job_id, job.attempt)
        out.replicas.append(_replica_pb(task, index, r))
    out.events.extend(_event_pb(e) for e in events)
    if not out.reason:
        out.reason = waiting_reason(replicas)
    return out, replicas


async def describe(
    job: JobRecord,
    redactor: Redactor,
    *,
    members: MemberClusters,
    archive: LogArchive,
    store: JobStore,
    now_s: float,
    archived: Mapping[int, KeptAttempt] | None = None,
) -> pb.JobDescription:
    """`archived`: the job is in the history store only, with these attempt summaries from SQL
    (its cluster is not asked: an archived job's pods were collected long ago)."""
    shown = redactor.job(job)
    out = pb.JobDescription(job=convert.job_to_pb(shown))
    for t in job.spec.tasks:
        command = " ".join(t.command)
        out.spec_summary.append(
            f"{t.name}: {t.replicas} x {t.gpus_per_replica} GPU, image {t.image}"
            + (f", command {command}" if command else "")
        )
    out.spec_summary.append(
        f"gpu types {', '.join(job.spec.gpu_types) or 'any'}, priority {job.spec.priority_class}, "
        f"restart on failure {job.spec.restart_policy.on_failure.value} "
        f"(max {job.spec.restart_policy.max_retries} retries)"
    )
    live: tuple[pb.AttemptDescription, Sequence[ReplicaState]] | None = None
    for attempt in range(1, job.attempt + 1):
        if archived is not None and attempt in archived:
            described = _kept_pb(archived[attempt], job)
            # The summary stays in the history for good; its logs only for the retention.
            described.logs_kept = described.logs_kept and archive.fresh(archived[attempt], now_s)
            out.attempts.append(described)
            continue
        if attempt == job.attempt and job.placement is not None and archived is None:
            live = await _live(job, members)
            if live is not None:
                out.attempts.append(live[0])
                continue
        kept = await archive.summary(job.job_id, attempt, now_s)
        if kept is not None:
            out.attempts.append(_kept_pb(kept, job))
            continue
        if attempt == job.attempt and job.phase is JobPhase.QUEUED:
            continue
        started, finished, outcome, reason = _times(shown, attempt)
        gone = pb.AttemptDescription(attempt=attempt, outcome=outcome, reason=reason, note="nothing kept")
        if started is not None:
            gone.started_at.CopyFrom(convert.timestamp(started))
        if finished is not None:
            gone.finished_at.CopyFrom(convert.timestamp(finished))
        out.attempts.append(gone)
    if job.phase is JobPhase.QUEUED:
        reasons = redactor.reasons(await store.get_wait_reasons(job.job_id))
        out.wait_reasons.extend(f"{r.code.value}: {r.message}" for r in reasons)
    elif live is not None and job.phase is JobPhase.DISPATCHED:
        for r in live[1]:
            if r.reason:
                out.wait_reasons.append(f"pod {r.pod}: {r.reason}" + (f": {r.message}" if r.message else ""))
    return out


def set_savings(out: pb.JobDescription, intervals: Sequence[LedgerInterval]) -> None:
    """Each ended attempt's cloud cost against bursting at once (issue 35), from its ledger interval
    (and the offer it carries): the job's own record, so whoever may describe the job may read it."""
    by_attempt = {iv.attempt: iv for iv in intervals}
    for a in out.attempts:
        iv = by_attempt.get(a.attempt)
        if iv is not None:
            a.savings = attempt_savings_text(iv)
