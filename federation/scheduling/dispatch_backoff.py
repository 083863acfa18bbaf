"""Backing off from a cluster that refuses dispatches, per job and per cluster.

A refused dispatch sends the job back to the queue (the placer may find it room elsewhere), and
without a backoff a cluster that keeps refusing (a webhook that rejects every pod, a namespace
stuck terminating) would be asked again every cycle, each time as a new attempt: a requeue loop of
tens of attempts a second. So each refusal is written on the job's record (`DispatchRefusal`, fenced
like every write, so a new leader keeps the backoff) and the dispatcher waits before asking that
cluster again for that job: 1 s, 2 s, 4 s ... up to 5 minutes. A cluster that several jobs found
refusing is "refusing" as a whole until a dispatch there succeeds again: jobs that never tried it
wait for its next probe (at most CLUSTER_PROBE_MAX_S), and `gpufed clusters` says so, with the last
error and since when. None of it charges the job's retries.

Pure functions over job records; the reconciler acts on them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from federation.store.jobs import DispatchRefusal, JobRecord
from placement.model import ClusterName, JobPhase

BASE_DELAY_S = 1.0
MAX_DELAY_S = 300.0
# A refusal is still news this long after its retry time; later, the job has moved on without it.
CURRENT_FOR_S = 60.0
# Jobs refused by one cluster, each within CURRENT_FOR_S, before the cluster counts as refusing.
REFUSING_JOBS = 2
# Or one job refused this many times in a row.
REFUSING_COUNT = 3
# How an admitted job's record begins to say that it waits out a backoff (`backoff_reason`).
BACKOFF_PREFIX = "waiting to dispatch again:"
# The longest a job that never met the refusal waits for a refusing cluster's next probe: a refusal
# may be the refused gang's own (it fits no node there), and other jobs must not wait long for it.
CLUSTER_PROBE_MAX_S = 10.0


def delay_s(count: int) -> float:
    """The wait after the `count`-th refusal in a row: 1, 2, 4 ... seconds, at most MAX_DELAY_S."""
    return min(MAX_DELAY_S, BASE_DELAY_S * float(2 ** max(0, min(count, 32) - 1)))


def refusal_for(job: JobRecord, cluster: ClusterName) -> DispatchRefusal | None:
    return next((r for r in job.refusals if r.cluster == cluster), None)


def refused(job: JobRecord, cluster: ClusterName, error: str, now_s: float) -> tuple[DispatchRefusal, ...]:
    """The job's refusals after `cluster` refused it once more."""
    before = refusal_for(job, cluster)
    count = 1 if before is None else before.count + 1
    entry = DispatchRefusal(
        cluster=cluster,
        count=count,
        first_at_s=now_s if before is None else before.first_at_s,
        last_at_s=now_s,
        retry_at_s=now_s + delay_s(count),
        error=error[:500],
    )
    return (*(r for r in job.refusals if r.cluster != cluster), entry)


def cleared(job: JobRecord, cluster: ClusterName) -> tuple[DispatchRefusal, ...]:
    """The job's refusals once `cluster` took its gang."""
    return tuple(r for r in job.refusals if r.cluster != cluster)


@dataclass(frozen=True, slots=True)
class ClusterRefusing:
    """A cluster that keeps refusing dispatches: shown by `gpufed clusters`, probed sparingly."""

    cluster: ClusterName
    since_s: float
    last_at_s: float
    last_error: str
    jobs: int
    # The most refusals in a row any one job met there.
    count: int
    # No job that has not met the refusal itself is dispatched there before this.
    retry_at_s: float


def refusing_clusters(jobs: Iterable[JobRecord], now_s: float) -> dict[ClusterName, ClusterRefusing]:
    """Every cluster that refused several live jobs (or one, several times) lately, and has taken
    no gang since its last refusal."""
    by_cluster: dict[ClusterName, list[DispatchRefusal]] = {}
    took: dict[ClusterName, float] = {}
    for job in jobs:
        if job.phase.is_terminal:
            continue
        for r in job.refusals:
            if now_s <= r.retry_at_s + CURRENT_FOR_S:
                by_cluster.setdefault(r.cluster, []).append(r)
        if job.placement is not None and job.phase in (JobPhase.DISPATCHED, JobPhase.RUNNING):
            at_s = _dispatched_at_s(job)
            if at_s is not None and at_s > took.get(job.placement.cluster, float("-inf")):
                took[job.placement.cluster] = at_s
    found: dict[ClusterName, ClusterRefusing] = {}
    for cluster, entries in by_cluster.items():
        count = max(r.count for r in entries)
        if len(entries) < REFUSING_JOBS and count < REFUSING_COUNT:
            continue
        last = max(entries, key=lambda r: r.last_at_s)
        if took.get(cluster, float("-inf")) >= last.last_at_s:
            continue
        found[cluster] = ClusterRefusing(
            cluster=cluster,
            since_s=min(r.first_at_s for r in entries),
            last_at_s=last.last_at_s,
            last_error=last.error,
            jobs=len(entries),
            count=count,
            retry_at_s=last.last_at_s + min(delay_s(count), CLUSTER_PROBE_MAX_S),
        )
    return found


def _dispatched_at_s(job: JobRecord) -> float | None:
    """When the current attempt's gang was created (its DISPATCHED event)."""
    for event in reversed(job.events):
        if event.attempt != job.attempt:
            return None
        if event.phase is JobPhase.DISPATCHED:
            return event.at_s
    return None


def wait_until_s(
    job: JobRecord, cluster: ClusterName, refusing: ClusterRefusing | None
) -> tuple[float, DispatchRefusal | None]:
    """When the job may next be dispatched to `cluster`, and the refusal that says so (if its own)."""
    own = refusal_for(job, cluster)
    if own is not None:
        return own.retry_at_s, own
    if refusing is not None:
        return refusing.retry_at_s, None
    return 0.0, None


def backoff_text(job: JobRecord, now_s: float, refusing: ClusterRefusing | None = None) -> str:
    """Why the job's dispatch waits, for `explain`: "" when it does not."""
    cluster = None if job.placement is None else job.placement.cluster
    if cluster is not None:
        until_s, own = wait_until_s(
            job, cluster, refusing if refusing and refusing.cluster == cluster else None
        )
        if until_s > now_s and own is not None:
            return (
                f"dispatch to cluster {cluster} refused ({own.error}): retrying in {until_s - now_s:.0f} s "
                f"(attempt {own.count} of backoff)"
            )
        if until_s > now_s and refusing is not None:
            return (
                f"cluster {cluster} keeps refusing dispatches ({refusing.last_error}): next try in "
                f"{until_s - now_s:.0f} s"
            )
    pending = [r for r in job.refusals if r.retry_at_s > now_s]
    return "; ".join(
        f"dispatch to cluster {r.cluster} refused ({r.error}): not retried there for "
        f"{r.retry_at_s - now_s:.0f} s (attempt {r.count} of backoff)"
        for r in pending
    )


def backoff_reason(
    cluster: ClusterName, until_s: float, error: str | None, refusing: ClusterRefusing | None
) -> str:
    """Why an admitted job waits for a cluster that refused dispatches, until when (UTC)."""
    at = datetime.fromtimestamp(until_s, UTC).strftime("%H:%M:%S")
    if error is not None:
        return f"{BACKOFF_PREFIX} cluster {cluster} refused its gang ({error[:200]}); next try at {at} UTC"
    assert refusing is not None
    return (
        f"{BACKOFF_PREFIX} cluster {cluster} keeps refusing dispatches ({refusing.last_error[:200]}); "
        f"next try at {at} UTC"
    )
