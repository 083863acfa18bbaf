"""Which gangs on member clusters no longer belong to any job's current attempt.

A gang outlives its purpose when its job moved on without it: the job was requeued as a new attempt
while its cluster was unreachable (the old copy comes back with the cluster), a dispatch that timed
out created the gang after all and the job went elsewhere, or the job finished long ago and its
objects are only clutter. A gang whose object a third party deleted without its pods (`kubectl
delete --cascade=orphan`) is reported by its pods (`GangStatus.orphaned`), and goes the same way: the
backend's `cancel` deletes every pod, service and pod group of the attempt. Deciding this is pure
and kept apart from the reconciler that acts on it, so each rule has a test of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum

from clusters.api import GangStatus
from federation.store.jobs import JobRecord
from placement.model import ClusterName, JobId, JobPhase

# Finished gangs of finished jobs are kept this long, so that users can still read their pods' logs.
FINISHED_GANG_RETENTION_S = 3600.0
# How long a gang whose own controller ended it is left to stop its remaining pods (Volcano's
# CompleteJob and AbortJob, an Indexed Job's success policy) before the collector deletes it.
STOPPING_PATIENCE_S = 30.0


def finished_gang_retention_s(retain_in_etcd_s: float | None) -> float:
    """How long a finished gang is kept: the hour, or less when the archiver (which archives a job
    `retain_in_etcd_s` after it ended; None: it does not run) would take the job first.

    Once its job is archived a gang belongs to no job the cache knows, and gangs of unknown jobs are
    left alone (another federation may share the cluster) unless the history store holds their job
    (`archived` in `stale_gangs`, one SQL lookup a tick). Half the retention leaves the collector
    that long to remove it the cheap way, before its job leaves etcd; the history lookup catches
    the gangs a long reconciler tick under load let through. The pods' logs are kept by then
    (`federation.scheduling.logs_keep`), so readers lose nothing.
    """
    if retain_in_etcd_s is None:
        return FINISHED_GANG_RETENTION_S
    return min(FINISHED_GANG_RETENTION_S, retain_in_etcd_s / 2)


class StaleWhy(StrEnum):
    SUPERSEDED = "superseded"  # the job runs a newer attempt
    ELSEWHERE = "elsewhere"  # the job's current attempt was placed on another cluster
    NOT_PLACED = "not_placed"  # the job went back to the queue without this gang
    JOB_FINISHED = "job_finished"  # the job ended while this gang still runs
    EXPIRED = "expired"  # both ended longer ago than the retention period
    ARCHIVED = "archived"  # the job left etcd for the history store, so it ended long ago


@dataclass(frozen=True, slots=True)
class StaleGang:
    cluster: ClusterName
    job_id: JobId
    attempt: int
    why: StaleWhy


def stale_gangs(
    statuses: Mapping[ClusterName, Mapping[tuple[JobId, int], GangStatus] | None],
    job_of: Callable[[JobId], JobRecord | None],
    *,
    now_s: float,
    retention_s: float = FINISHED_GANG_RETENTION_S,
    archived: Collection[JobId] = (),
    patience_s: float = STOPPING_PATIENCE_S,
) -> list[StaleGang]:
    """Every gang on a reachable cluster that no live attempt needs, in a stable order.

    `archived`: jobs etcd no longer holds that the history store does (`unknown_jobs` says which to
    ask about). Their gangs are this federation's and their jobs ended `history.retainInEtcd` ago.
    """
    stale: list[StaleGang] = []
    for cluster in sorted(statuses):
        gangs = statuses[cluster]
        if gangs is None:
            continue
        for (job_id, attempt), gang in sorted(gangs.items()):
            job = job_of(job_id)
            if job is None:
                # A gang of a job we do not know may belong to another federation sharing the
                # cluster; one whose job we archived is ours, left behind when the archiver took
                # its job before the retention below removed it (a long reconciler tick under load).
                if job_id in archived:
                    stale.append(
                        StaleGang(cluster=cluster, job_id=job_id, attempt=attempt, why=StaleWhy.ARCHIVED)
                    )
                continue
            why = _why_stale(cluster, attempt, gang, job, now_s, retention_s, patience_s)
            if why is not None:
                stale.append(StaleGang(cluster=cluster, job_id=job_id, attempt=attempt, why=why))
    return stale


def unknown_jobs(
    statuses: Mapping[ClusterName, Mapping[tuple[JobId, int], GangStatus] | None],
    job_of: Callable[[JobId], JobRecord | None],
) -> list[JobId]:
    """The jobs of gangs on reachable clusters that the job cache does not hold, sorted: the ones
    to ask the history store about."""
    return sorted(
        {
            job_id
            for gangs in statuses.values()
            if gangs is not None
            for job_id, _attempt in gangs
            if job_of(job_id) is None
        }
    )


def _why_stale(
    cluster: ClusterName,
    attempt: int,
    gang: GangStatus,
    job: JobRecord,
    now_s: float,
    retention_s: float,
    patience_s: float,
) -> StaleWhy | None:
    if attempt > job.attempt:
        # A newer attempt than the record knows: the record is behind (a cache lag), not the gang.
        return None
    why = _unneeded(cluster, attempt, job)
    if why is None:
        return None
    if _stopping(gang, now_s, patience_s):
        return None
    if not gang.phase.is_final or gang.live_pods > 0:
        # Still holding GPUs that no attempt will use (its pods may outlive a finished or deleted
        # gang object): remove it now.
        return why
    # A finished gang holds no GPUs; keep it a while so that its pods' logs can still be read.
    ended_s = gang.finished_at_s if gang.finished_at_s is not None else _last_event_s(job)
    return StaleWhy.EXPIRED if now_s - ended_s >= retention_s else None


def _stopping(gang: GangStatus, now_s: float, patience_s: float) -> bool:
    """The gang's object ended a moment ago with pods of it still live: its own controller is
    stopping them (a master's success ends its workers), or the pod watch has not yet shown what
    the object's watch did. Deleting the gang now would delete its finished pods too, and their logs
    with them (a two-replica task whose second pod succeeded a moment after the first was gone
    before kubectl could read it). Orphaned pods have no controller left, and go at once."""
    return (
        gang.phase.is_final
        and not gang.orphaned
        and gang.live_pods > 0
        and gang.finished_at_s is not None
        and now_s - gang.finished_at_s < patience_s
    )


def _unneeded(cluster: ClusterName, attempt: int, job: JobRecord) -> StaleWhy | None:
    if attempt < job.attempt:
        return StaleWhy.SUPERSEDED
    if job.phase.is_terminal:
        return StaleWhy.JOB_FINISHED
    if job.phase is JobPhase.QUEUED:
        return StaleWhy.NOT_PLACED
    if job.placement is not None and job.placement.cluster != cluster:
        return StaleWhy.ELSEWHERE
    return None


def _last_event_s(job: JobRecord) -> float:
    return job.events[-1].at_s if job.events else job.submitted_at_s
