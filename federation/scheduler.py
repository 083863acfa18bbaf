"""The scheduling cycle, run only by the leader.

1. Snapshot: queued and running jobs from the cache, tenants, each cluster's free GPUs (less what is
   admitted but not yet dispatched).
2. Plan: `placement.plan(snapshot, now=...)`, a pure function.
3. Commit: each admission is its own compare-and-swap on the job's revision, fenced by the leader
   lease. A lost race writes nothing; the job is simply tried again next cycle.
4. Explain: wait reasons are written for jobs whose reasons changed, so any server can answer
   `explain` without re-planning.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog

from federation.cache import JobCache
from federation.jobs import JobPlacement, JobRecord, Owner
from federation.members import MemberClusters
from federation.metrics import Metrics
from federation.records import TenantRecord
from federation.store import Fence, JobStore, Stored
from placement.model import (
    Admission,
    ClusterState,
    GangRequest,
    JobId,
    JobPhase,
    Plan,
    Snapshot,
    Waiting,
    WaitReason,
)
from placement.plan import plan
from placement.reserve import PendingGang, reserve_pending

log = structlog.get_logger("gpufed.scheduler")

# Bounded so that a cycle with thousands of admissions does not open thousands of etcd calls at once.
COMMIT_CONCURRENCY = 64
_PENDING_PHASES = frozenset({JobPhase.ADMITTED, JobPhase.STAGING})


@dataclass(frozen=True, slots=True)
class CycleResult:
    admitted: int
    conflicts: int
    waiting: int
    seconds: float


def build_snapshot(
    jobs: Sequence[JobRecord],
    tenants: Sequence[TenantRecord],
    inventories: Sequence[ClusterState],
    gang_request: Callable[[JobRecord], GangRequest] = JobRecord.gang_request,
) -> Snapshot:
    queued = tuple(gang_request(j) for j in jobs if j.phase is JobPhase.QUEUED and not j.cancel_requested)
    running = tuple(rg for j in jobs if (rg := j.running_gang()) is not None)
    pending = [
        PendingGang(
            cluster=j.placement.cluster,
            gpu_type=j.placement.gpu_type,
            kind=j.placement.kind,
            replica_gpus=j.spec.replica_gpus,
        )
        for j in jobs
        if j.phase in _PENDING_PHASES and j.placement is not None
    ]
    clusters = tuple(reserve_pending(c, pending) if pending else c for c in inventories)
    return Snapshot(
        queued=queued,
        running=running,
        tenants=tuple(t.quota() for t in tenants),
        clusters=clusters,
    )


class GangRequests:
    """Each queued job's GangRequest, built once per version of its record.

    Records are immutable and the cache hands out the same object until the job changes, so a
    request built for that object stays right. With thousands queued, rebuilding every request each
    cycle cost as much as planning them.
    """

    def __init__(self) -> None:
        self._built: dict[JobId, tuple[JobRecord, GangRequest]] = {}

    def __call__(self, job: JobRecord) -> GangRequest:
        hit = self._built.get(job.job_id)
        if hit is not None and hit[0] is job:
            return hit[1]
        request = job.gang_request()
        self._built[job.job_id] = (job, request)
        return request

    def keep_only(self, job_ids: set[JobId]) -> None:
        for job_id in [j for j in self._built if j not in job_ids]:
            del self._built[job_id]


def _snapshot_and_plan(
    jobs: Sequence[JobRecord],
    tenants: Sequence[TenantRecord],
    inventories: Sequence[ClusterState],
    now: float,
    requests: GangRequests,
) -> tuple[Snapshot, Plan]:
    snapshot = build_snapshot(jobs, tenants, inventories, requests)
    requests.keep_only({q.job_id for q in snapshot.queued})
    return snapshot, plan(snapshot, now=now)


class Scheduler:
    def __init__(
        self,
        *,
        store: JobStore,
        cache: JobCache,
        members: MemberClusters,
        tenants: Callable[[], Awaitable[list[TenantRecord]]],
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._cache = cache
        self._members = members
        self._tenants = tenants
        self._metrics = metrics
        self._clock = clock
        self._written_reasons: dict[JobId, tuple[WaitReason, ...]] = {}
        self._requests = GangRequests()

    async def run_cycle(self, fence: Fence | None) -> CycleResult:
        started = time.perf_counter()
        stored_jobs = {s.value.job_id: s for s in self._cache.live_jobs()}
        jobs = [s.value for s in stored_jobs.values()]
        tenants = await self._tenants()
        inventories = await self._members.inventories()
        now = self._clock()
        # Building the snapshot and planning are pure and CPU-bound, and grow with the queue. On a
        # worker thread the event loop still gets the GIL every switch interval, so API calls wait
        # milliseconds behind a long cycle instead of its whole length.
        snapshot, result = await asyncio.to_thread(
            _snapshot_and_plan, jobs, tenants, inventories, now, self._requests
        )

        semaphore = asyncio.Semaphore(COMMIT_CONCURRENCY)
        outcomes = await asyncio.gather(
            *(self._admit(stored_jobs[a.job_id], a, now, fence, semaphore) for a in result.admissions)
        )
        admitted = sum(outcomes)
        conflicts = len(outcomes) - admitted

        await self._write_reasons(result.waiting, fence, semaphore)
        self._metrics.set_queue_depth(Counter(q.tenant for q in snapshot.queued))
        seconds = time.perf_counter() - started
        self._metrics.cycle_seconds.observe(seconds)
        if admitted or conflicts:
            log.info("cycle_completed", admitted=admitted, conflicts=conflicts, waiting=len(result.waiting))
        return CycleResult(
            admitted=admitted, conflicts=conflicts, waiting=len(result.waiting), seconds=seconds
        )

    async def _admit(
        self,
        stored: Stored[JobRecord],
        admission: Admission,
        now: float,
        fence: Fence | None,
        semaphore: asyncio.Semaphore,
    ) -> bool:
        job = stored.value.transition(
            JobPhase.ADMITTED,
            by=Owner.SCHEDULER,
            at_s=now,
            reason=f"admitted to {admission.cluster} ({admission.gpu_type}, {admission.kind.value})",
            placement=JobPlacement(
                cluster=admission.cluster,
                gpu_type=admission.gpu_type,
                kind=admission.kind,
                usd_per_gpu_hour=admission.usd_per_gpu_hour,
            ),
        )
        async with semaphore:
            revision = await self._store.commit([(job, stored.mod_revision)], fence=fence)
        if revision is None:
            # Someone changed the job (a cancel, or a racing leader): nothing was written. The job is
            # still queued in the next snapshot if it should be.
            self._metrics.admission_conflicts.inc()
            log.info("admission_conflicted", job_id=job.job_id, tenant=job.tenant, cluster=admission.cluster)
            return False
        self._metrics.admissions.labels(cluster=admission.cluster, gpu_type=admission.gpu_type).inc()
        self._metrics.transitions.labels(to_phase=JobPhase.ADMITTED.value).inc()
        log.info(
            "job_admitted",
            job_id=job.job_id,
            tenant=job.tenant,
            cluster=admission.cluster,
            gpu_type=admission.gpu_type,
            usd_per_gpu_hour=admission.usd_per_gpu_hour,
        )
        return True

    async def _write_reasons(
        self, waiting: Sequence[Waiting], fence: Fence | None, semaphore: asyncio.Semaphore
    ) -> None:
        changed = [w for w in waiting if self._written_reasons.get(w.job_id) != w.reasons]

        async def write(w: Waiting) -> None:
            async with semaphore:
                await self._store.put_wait_reasons(w.job_id, w.reasons, fence=fence)
            self._written_reasons[w.job_id] = w.reasons

        still_waiting = {w.job_id for w in waiting}
        # A job that stopped waiting (admitted or cancelled) has no reasons any more: delete them so
        # etcd does not keep one stale key per job ever queued.
        left = [job_id for job_id in self._written_reasons if job_id not in still_waiting]

        async def clear(job_id: JobId) -> None:
            async with semaphore:
                await self._store.put_wait_reasons(job_id, (), fence=fence)
            del self._written_reasons[job_id]

        await asyncio.gather(*(write(w) for w in changed), *(clear(j) for j in left))
