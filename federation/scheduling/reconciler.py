"""Reconcilers that move admitted jobs through their clusters. Run only by the leader.

Active transitions (decide and act), written by the dispatcher:
  ADMITTED -> DISPATCHED   the backend created the whole gang (idempotent by name)
  ADMITTED -> QUEUED       the cluster refused the gang or did not answer: back to the queue, and that
                           cluster is not asked again for this job until its backoff has passed
                           (federation.scheduling.dispatch_backoff); no retry is charged
  ADMITTED -> STAGING      the job's dataset is not in its cluster's store: a background sync copies
                           it (federation.datasets.staging); then STAGING -> DISPATCHED, or FAILED / QUEUED
                           (by the job's restart policy) when the sync fails
  any live -> CANCELLED    a user asked to cancel: stop the gang first, then record it once its
                           pods are gone

Passive transitions (mirror what the cluster reports), written by the status reconciler:
  DISPATCHED -> RUNNING -> SUCCEEDED | FAILED
  DISPATCHED | RUNNING -> QUEUED   the scheduler ordered a preemption: the gang is evicted with its
                                   grace period, then the job is requeued at its original position
                                   (a new attempt that uses up no retry)
  DISPATCHED | RUNNING -> QUEUED   the gang failed or was evicted and the restart policy restarts it
                                   as a new attempt (the queue position is kept), or its cluster has
                                   not answered for longer than its grace period (a new attempt that
                                   uses up no retry: losing a cluster is not the job's fault)

An attempt ends only once its pods are gone: a gang that ended, or whose object vanished, while
pods of it still run holds the job where it is (and its ledger interval open) while
`federation.scheduling.leftovers` deletes them, so the next attempt never runs beside them; and no attempt is
dispatched while an earlier one of the job still holds pods on a reachable cluster.

Clean-up: gangs that no current attempt needs (`federation.scheduling.collector`) are cancelled on their
clusters, with every pod, service and pod group of theirs, so the copy left on a cluster that comes
back after its jobs moved on is removed, and so are pods orphaned by a third party.

Every write is a compare-and-swap on the job's revision, fenced by the leader lease, so a server
that lost leadership mid-tick commits nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar, runtime_checkable

import structlog

from clusters.api import (
    ClusterError,
    GangPhase,
    GangRejected,
    GangStatus,
    RemembersVanished,
    VanishedAttempt,
)
from federation.datasets.staging import GateKind, Stager, gate_transition
from federation.errors import StoreUnavailable
from federation.metrics import Metrics
from federation.scheduling.collector import (
    FINISHED_GANG_RETENTION_S,
    StaleGang,
    StaleWhy,
    stale_gangs,
    unknown_jobs,
)
from federation.scheduling.dispatch_backoff import (
    BACKOFF_PREFIX,
    ClusterRefusing,
    backoff_reason,
    cleared,
    refused,
    refusing_clusters,
    wait_until_s,
)
from federation.scheduling.leftovers import Leftovers, holding_attempts, pods_outlive
from federation.scheduling.logs_keep import AttemptKeeper, conforms
from federation.scheduling.members import GangKey, MemberClusters
from federation.scheduling.workload import workload_for
from federation.secrets.crypto import SecretUnreadable
from federation.secrets.jobs import GangSecrets, SecretMissing, uses_secrets
from federation.spec.jobspec import RestartAction
from federation.store.intervals import ledger_update
from federation.store.job_cache import JobCache
from federation.store.job_store import Fence, JobStore, Stored
from federation.store.jobs import JobRecord, Owner, PreemptionOrder
from placement.model import ClusterName, JobId, JobPhase

log = structlog.get_logger("gpufed.reconciler")

_K = TypeVar("_K")


@runtime_checkable
class RemovesMany(Protocol):
    """A backend that removes several gangs in fewer calls than one each (the Kubernetes backend:
    one `deletecollection` a namespace), each as `cancel` would."""

    async def cancel_many(self, keys: Sequence[GangKey], grace_period_s: float) -> None: ...


CANCEL_GRACE_PERIOD_S = 30.0
# Jobs reconciled (and stale gangs removed) at once in a tick: etcd took the most puts a second here
# with about 64 in flight; 128 cost the server more CPU a job in bench/scale.py's 100 clusters (each
# cluster call is a thread of the Kubernetes client, and they contend for the GIL) for no more jobs.
RECONCILE_CONCURRENCY = 64
# That bound is the dispatch lane's. The other lane (an ended attempt's logs and record, a running
# gang's record, cancels, evictions, removals) has RECORD_CONCURRENCY: an ended attempt holds its
# slot while its pods' logs are read, a call whose answer took 0.1 to 0.7 s at 100 clusters
# (bench/scale.py, the simulator's loop busy), so with 64 the ends waited for a slot 0.9 s (median,
# 2.9 at p90) and held their GPUs meanwhile. With 128, six pairs in turns (load 4-9): from a pod's end
# to its job's record 2.37 s against 2.87 (mean of a run, medians; less in five pairs of six), a GPU
# held 11.4 s a job against 12.9, the server's CPU a job 4.21 ms against 4.31.
RECORD_CONCURRENCY = 128
# Calls in flight to one member cluster (dispatches, cancels, evictions, log reads): what a tick
# asks of a cluster at once, so that a burst on one cluster neither floods its API server nor takes
# every slot of the tick from the other clusters. As many as the Kubernetes backend's API threads
# (clusters.kubernetes.config `api_threads`), which would queue any more.
CLUSTER_CONCURRENCY = 16
# A tick's work (a dispatch, an ended attempt's logs and its record, a stale gang's removal) runs as
# tasks, each committed as it comes, and no job (or gang) has two at once. While some is in flight
# the tick looks at its jobs again every TICK_WAIT_S, so an end is noticed within about a second
# whatever else is in flight; it returns once its work is done, or after TICK_HOLD_S, leaving the
# rest in flight to later ticks. Waiting for all of it made a burst's tick last until its last gang
# was created (tens of seconds at 100 clusters): no end was recorded meanwhile, nor anything placed
# on the GPUs they freed. Returning after each second instead made the loop plan over every live
# job once a second (the scheduling cycle runs after each tick, about 0.2 s of CPU at 4,000 live
# jobs): 35-71 cycles a run against 7-19, 1-4 ms of CPU a job more (bench/scale.py).
TICK_WAIT_S = 1.0
TICK_HOLD_S = 5.0
# A member cluster's ended gangs (stale, holding no GPUs: `COLLECT_CAN_WAIT`) are removed together,
# with one call a namespace where its backend can (`RemovesMany`: the Kubernetes backend's
# `deletecollection` by label), at most once every COLLECT_HOLD_S or as soon as COLLECT_BATCH wait.
# Removed at each look, a cluster had one or two a call at 100 clusters (bench/scale.py: a delete
# was a third of a one-pod job's calls). A gang still holding GPUs goes at once, and the ended ones
# waiting with it. The wait is nothing beside the hour a finished gang is kept for its logs.
COLLECT_HOLD_S = 5.0
COLLECT_BATCH = 50
COLLECT_CAN_WAIT = frozenset({StaleWhy.EXPIRED, StaleWhy.ARCHIVED})
# Gangs of unknown jobs asked about a tick: a bound on one SQL lookup when a cluster shared with
# another federation carries many gangs of its; the rest are asked about on later ticks.
MAX_ARCHIVED_LOOKUPS = 2000
# How long a job the history store did not hold is not asked about again. A gang of another
# federation on a shared cluster stays there for good and would cost a lookup every tick. Ours are
# archived before the cache forgets them (SQL is written before etcd's delete), so an answer of
# "not archived" stays true for them too; this only bounds how long a wrong answer would last.
NOT_ARCHIVED_RECHECK_S = 600.0


@dataclass
class _Lane:
    """One lane's slots of calls in flight: `all` in all, CLUSTER_CONCURRENCY a cluster."""

    all: asyncio.Semaphore
    clusters: dict[ClusterName, asyncio.Semaphore] = field(default_factory=dict)


class Reconciler:
    def __init__(
        self,
        *,
        store: JobStore,
        cache: JobCache,
        members: MemberClusters,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        staging: Stager | None = None,
        keeper: AttemptKeeper | None = None,
        finished_gang_retention_s: float = FINISHED_GANG_RETENTION_S,
        archived_ids: Callable[[Sequence[JobId]], set[JobId]] | None = None,
        secrets: GangSecrets | None = None,
    ) -> None:
        self._store = store
        # Opens the tenant secrets a gang's pods reference, to send them with it (federation.secrets).
        self._secrets = secrets
        self._finished_gang_retention_s = finished_gang_retention_s
        # Which jobs the history store holds (`HistoryStore.archived_ids`; None: no archiver), so
        # that gangs of archived jobs are collected too (federation.scheduling.collector).
        self._archived_ids = archived_ids
        # Jobs the history store said it did not hold, and when it said so (NOT_ARCHIVED_RECHECK_S).
        self._not_archived: dict[JobId, float] = {}
        # Keeps an ended attempt's logs and names its failure (federation.scheduling.logs_keep).
        self._keeper = keeper
        self._staging = staging
        self._cache = cache
        self._members = members
        self._metrics = metrics
        self._clock = clock
        # When each silent cluster stopped answering, by this server's clock. Forgotten on restart,
        # which only makes a new leader wait a full grace period before it requeues anything.
        self._silent_since: dict[ClusterName, float] = {}
        self._evictions_sent: set[GangKey] = set()
        self._cancels_sent: set[GangKey] = set()
        self._leftovers = Leftovers(members, clock, CANCEL_GRACE_PERIOD_S)
        # The first start each live attempt's cluster reported. An attempt killed before it was seen
        # RUNNING (a namespace deleted under it) may close only once its pods are gone, when the
        # cluster no longer says when they started; the ledger still charges from here. A new leader
        # starts empty and relies on what the cluster still shows.
        self._started_at: dict[GangKey, float] = {}
        self._refusing: dict[ClusterName, ClusterRefusing] = {}
        self._holding: dict[JobId, list[tuple[ClusterName, int]]] = {}
        # Slots of calls in flight, across ticks, in two lanes: dispatches, and everything else (an
        # ended attempt's logs and record, cancels, evictions, removals). A burst of thousands of
        # admitted gangs queued for the one lane ahead of the ends that free GPUs: an end waited
        # behind every dispatch started before it (20 s at 100 clusters, bench/scale.py).
        self._lanes: dict[bool, _Lane] = {
            True: _Lane(asyncio.Semaphore(RECONCILE_CONCURRENCY)),
            False: _Lane(asyncio.Semaphore(RECORD_CONCURRENCY)),
        }
        # Work that outlasted its tick (TICK_WAIT_S): each job's, and each stale gang's removal.
        self._in_flight: dict[JobId, asyncio.Task[bool]] = {}
        self._removing: dict[tuple[ClusterName, JobId, int], asyncio.Task[None]] = {}
        # Stale gangs whose removal the cluster took, and when. A deleted gang is shown (deleting)
        # until its pods are gone, and the watch shows its end a moment after the call: asked again
        # at every look meanwhile, the cluster got a second delete (or, once the object was gone
        # from the cache, two lists to find it) for a quarter of the gangs at 100 clusters
        # (bench/scale.py: 4,930 removals for 4,000 gangs). Asked again only after
        # CANCEL_GRACE_PERIOD_S, as a cancel is; forgotten once the gang no longer shows.
        self._removed: dict[tuple[ClusterName, JobId, int], float] = {}
        # When each cluster's stale gangs were last sent to go together (`RemovesMany`).
        self._batch_sent: dict[ClusterName, float] = {}
        # Set while nothing is in flight: `_settle` waits on it, not on every task (an
        # `asyncio.wait` over thousands of tasks each tick was 5 % of the server's CPU).
        self._none_in_flight = asyncio.Event()
        self._none_in_flight.set()
        # The term (fence) the work in flight was started in: a new term cancels what is left of
        # the old one, whose commits its fence refuses anyway.
        self._term: Fence | None = None
        # Transitions committed since the last tick returned, by work of this tick or earlier ones.
        self._committed = 0
        # Errors of work that ended since the last tick returned: the next tick raises the first.
        self._failures: list[BaseException] = []
        # The revision this reconciler committed for a job, until the job cache shows it: a tick
        # that read the job before then would act on the attempt again (read an ended attempt's
        # logs once more, call the cluster) only to lose the compare-and-swap.
        self._ahead: dict[JobId, int] = {}

    @contextlib.asynccontextmanager
    async def _slots(self, cluster: ClusterName | None, *, dispatch: bool) -> AsyncIterator[None]:
        """A call's slots: one of its lane's CLUSTER_CONCURRENCY for `cluster` (none without one),
        then one of its lane's in all (RECONCILE_CONCURRENCY, RECORD_CONCURRENCY). The cluster's
        first: a job waiting for a busy cluster holds no slot that a job of another cluster could use."""
        lane = self._lanes[dispatch]
        if cluster is None:
            async with lane.all:
                yield
            return
        slot = lane.clusters.get(cluster)
        if slot is None:
            slot = lane.clusters[cluster] = asyncio.Semaphore(CLUSTER_CONCURRENCY)
        async with slot, lane.all:
            yield

    async def tick(self, fence: Fence | None) -> int:
        """Start the work of every job that may need action, and look again every TICK_WAIT_S while
        some is in flight, for TICK_HOLD_S at most; returns how many transitions were committed since
        the last tick returned. What is in flight then goes on by itself (its job is left alone by
        later ticks until it is done)."""
        if fence != self._term:
            await self.stop()
            self._term = fence
        loop = asyncio.get_running_loop()
        began = loop.time()
        while True:
            await self._look(fence)
            await self._settle()
            if self._none_in_flight.is_set() or loop.time() - began >= TICK_HOLD_S:
                break
        committed, self._committed = self._committed, 0
        return committed

    async def _look(self, fence: Fence | None) -> None:
        """One pass over every job that may need action, starting work for those with none in flight."""
        # Queued jobs are the scheduler's: skipping them here keeps a tick's cost proportional to the
        # work in flight, not to the length of the queue.
        # The cache's acting jobs, not every live one: a deep queue would cost each tick a walk.
        acting = self._cache.acting_jobs()
        statuses = await self._members.statuses()
        lost = self._lost_clusters(statuses)
        # Over every live job: most jobs a cluster refused are back in the queue.
        self._refusing = refusing_clusters((s.value for s in acting), self._clock())
        self._holding = holding_attempts(statuses)
        self._forget_seen_commits()
        for stored in acting:
            job = stored.value
            if job.phase is JobPhase.QUEUED and not job.cancel_requested:
                continue
            if job.job_id in self._in_flight or self._behind(stored):
                continue
            if self._runs_on(job, statuses) or self._waits_on(job, statuses):
                continue
            self._track(self._in_flight, job.job_id, self._one(stored, statuses, lost, fence))
        if self._staging is not None:
            await self._staging.tick(s.value for s in acting)
        await self._collect(statuses)

    async def stop(self) -> None:
        """Cancel the work still in flight (a term ended; its fence would refuse the commits anyway),
        and wait until it has stopped. Cluster calls are idempotent by name, so the next leader's
        dispatch of the same attempt makes no second gang."""
        tasks = [*self._in_flight.values(), *self._removing.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._in_flight.clear()
        self._removing.clear()
        self._removed.clear()
        self._none_in_flight.set()
        self._ahead.clear()
        self._failures.clear()

    async def _one(
        self,
        stored: Stored[JobRecord],
        statuses: dict[ClusterName, dict[GangKey, GangStatus] | None],
        lost: set[ClusterName],
        fence: Fence | None,
    ) -> bool:
        job = stored.value
        dispatch = (
            job.phase in (JobPhase.ADMITTED, JobPhase.STAGING)
            and not job.cancel_requested
            and job.preemption is None
        )
        cluster = job.placement.cluster if job.placement is not None else None
        async with self._slots(cluster, dispatch=dispatch):
            current = self._cache.get(job.job_id)
            if current is None or current.mod_revision != stored.mod_revision:
                # Changed while this waited for a slot (a burst's dispatch can wait many seconds):
                # a cancel, a preemption order. Acting on the old record would call the cluster for
                # nothing (its commit would lose the compare-and-swap); the next tick reads the new.
                return False
            committed = await self._reconcile(stored, statuses, lost, fence)
        self._committed += committed
        return committed

    def _track(
        self,
        registry: dict[_K, asyncio.Task[Any]],
        key: _K,
        work: Coroutine[Any, Any, Any] | asyncio.Task[Any],
    ) -> None:
        """Run `work` as a task filed under `key` until it ends; its error is kept for `_settle`.
        A task already running may be filed under several keys (one removal of many gangs): its
        error is then kept once a key."""
        task = work if isinstance(work, asyncio.Task) else asyncio.create_task(work)
        registry[key] = task
        self._none_in_flight.clear()

        def done(task: asyncio.Task[Any]) -> None:
            if registry.get(key) is task:
                del registry[key]
            if not self._in_flight and not self._removing:
                self._none_in_flight.set()
            if not task.cancelled() and (error := task.exception()) is not None:
                self._failures.append(error)

        task.add_done_callback(done)

    async def _settle(self) -> None:
        """Wait, TICK_WAIT_S at most, for the work in flight; then raise the first error of work
        that ended since the last tick (an etcd that does not answer is the leader's loop's to back
        off from, as when the tick waited for everything)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._none_in_flight.wait(), TICK_WAIT_S)
        if self._failures:
            first = self._failures[0]
            self._failures.clear()
            raise first

    def _behind(self, stored: Stored[JobRecord]) -> bool:
        """The job cache has not yet heard of this reconciler's last commit of the job."""
        ahead = self._ahead.get(stored.value.job_id)
        return ahead is not None and stored.mod_revision < ahead

    def _forget_seen_commits(self) -> None:
        """Forget the commits the job cache now shows (or whose job it no longer holds)."""
        for job_id, revision in list(self._ahead.items()):
            cached = self._cache.get(job_id)
            if cached is None or cached.mod_revision >= revision:
                del self._ahead[job_id]

    def _quiet_gang(
        self,
        job: JobRecord,
        phase: JobPhase,
        gang_phase: GangPhase,
        statuses: dict[ClusterName, dict[GangKey, GangStatus] | None],
    ) -> GangStatus | None:
        """The gang of a job in `phase` that nobody asked to stop (no cancel, no preemption), as its
        cluster reports it, if that is in `gang_phase` and not orphaned; else None."""
        if job.phase is not phase or job.cancel_requested or job.preemption is not None:
            return None
        if job.placement is None:
            return None
        gang = (statuses.get(job.placement.cluster) or {}).get((job.job_id, job.attempt))
        if gang is None or gang.phase is not gang_phase or gang.orphaned:
            return None
        return gang

    def _remember_start(self, job: JobRecord, gang: GangStatus) -> bool:
        """Keep the gang's start, the one thing `_reconcile` would have taken from a quiet gang."""
        if gang.started_at_s is not None:
            self._started_at.setdefault((job.job_id, job.attempt), gang.started_at_s)
        return True

    def _runs_on(self, job: JobRecord, statuses: dict[ClusterName, dict[GangKey, GangStatus] | None]) -> bool:
        """A running job whose gang runs on, on a cluster that answers: `_reconcile` would decide and
        write nothing for it (its gang's start aside, remembered here). Most live jobs of a real
        federation are such, for hours; each cost every tick a task, two slots and the keeper's
        hook, a walk of every running job (bench/scale.py), where these few lookups do."""
        gang = self._quiet_gang(job, JobPhase.RUNNING, GangPhase.RUNNING, statuses)
        return gang is not None and self._remember_start(job, gang)

    def _waits_on(
        self, job: JobRecord, statuses: dict[ClusterName, dict[GangKey, GangStatus] | None]
    ) -> bool:
        """A dispatched job whose gang is pending, with no probe of why due (`AttemptKeeper.probe_due`):
        `_reconcile` would decide and write nothing for it. A burst's thousands of dispatched gangs
        each cost a task and two slots a tick until they ran, the most of the ticks' work once the
        tick no longer waited for the dispatches (bench/scale.py)."""
        gang = self._quiet_gang(job, JobPhase.DISPATCHED, GangPhase.PENDING, statuses)
        if gang is None or pods_outlive(gang):
            return False
        if self._keeper is not None and self._keeper.probe_due(job):
            return False
        return self._remember_start(job, gang)

    def _lost_clusters(
        self, statuses: dict[ClusterName, dict[GangKey, GangStatus] | None]
    ) -> set[ClusterName]:
        """Clusters silent for longer than their grace period; their running jobs move elsewhere."""
        now = self._clock()
        for name, gangs in statuses.items():
            if gangs is None:
                self._silent_since.setdefault(name, now)
            elif self._silent_since.pop(name, None) is not None:
                log.info("cluster_answered_again", cluster=name)
        return {
            name
            for name, since in self._silent_since.items()
            if now - since >= self._members.unreachable_grace_s(name)
        }

    async def _collect(self, statuses: dict[ClusterName, dict[GangKey, GangStatus] | None]) -> None:
        """Cancel gangs that no current attempt needs (see federation.scheduling.collector)."""

        def job_of(job_id: JobId) -> JobRecord | None:
            stored = self._cache.get(job_id)
            return None if stored is None else stored.value

        archived = await self._archived_of(unknown_jobs(statuses, job_of))
        stale = stale_gangs(
            statuses,
            job_of,
            now_s=self._clock(),
            retention_s=self._finished_gang_retention_s,
            archived=archived,
            patience_s=CANCEL_GRACE_PERIOD_S,
        )
        # At once, a cluster's slots at a time: one after the other, a burst's finished gangs took
        # a tick a cancel call each (a second a hundred gangs), which every job waiting to be
        # dispatched or recorded as ended waited for (bench/scale.py). Each removal is left to
        # finish by itself (`_settle`), and not started again while it is in flight.
        now = self._clock()
        self._forget_removed(statuses)
        together: dict[ClusterName, list[StaleGang]] = {}
        for gang in stale:
            key = (gang.cluster, gang.job_id, gang.attempt)
            if key in self._removing or self._removal_sent(key, statuses, now):
                continue
            shown = (statuses.get(gang.cluster) or {}).get((gang.job_id, gang.attempt))
            # Answered by class (`conforms`): asked for each stale gang at each look.
            if not pods_outlive(shown) and conforms(self._members.get(gang.cluster), RemovesMany):  # type: ignore[type-abstract]
                together.setdefault(gang.cluster, []).append(gang)
                continue
            self._track(self._removing, key, self._remove_stale(gang, statuses))
        for cluster, gangs in together.items():
            due = (
                now - self._batch_sent.get(cluster, -COLLECT_HOLD_S) >= COLLECT_HOLD_S
                or len(gangs) >= COLLECT_BATCH
                or any(g.why not in COLLECT_CAN_WAIT for g in gangs)
            )
            if not due:
                continue
            self._batch_sent[cluster] = now
            removal = asyncio.create_task(self._remove_stale_together(cluster, gangs))
            for gang in gangs:
                self._track(self._removing, (cluster, gang.job_id, gang.attempt), removal)

    def _removal_sent(
        self,
        key: tuple[ClusterName, JobId, int],
        statuses: dict[ClusterName, dict[GangKey, GangStatus] | None],
        now: float,
    ) -> bool:
        """The cluster took this stale gang's removal less than CANCEL_GRACE_PERIOD_S ago, and
        nothing is left of it for this reconciler to delete itself (pods outliving a deleted gang
        are, once: `Leftovers`)."""
        sent = self._removed.get(key)
        if sent is None or now - sent >= CANCEL_GRACE_PERIOD_S:
            return False
        cluster, job_id, attempt = key
        return not pods_outlive((statuses.get(cluster) or {}).get((job_id, attempt)))

    def _forget_removed(self, statuses: dict[ClusterName, dict[GangKey, GangStatus] | None]) -> None:
        """Forget the removals whose gang its (answering) cluster no longer shows."""
        for key in list(self._removed):
            cluster, job_id, attempt = key
            shown = statuses.get(cluster)
            if shown is not None and (job_id, attempt) not in shown:
                del self._removed[key]

    async def _remove_stale(
        self,
        stale: StaleGang,
        statuses: dict[ClusterName, dict[GangKey, GangStatus] | None],
    ) -> None:
        backend = self._members.get(stale.cluster)
        if backend is None:
            return
        async with self._slots(stale.cluster, dispatch=False):
            gang = (statuses.get(stale.cluster) or {}).get((stale.job_id, stale.attempt))
            if gang is not None and pods_outlive(gang):
                # Only pods are left, already stopping or orphaned: delete them once, not every tick.
                await self._leftovers.remove(stale.cluster, gang)
                return
            try:
                await backend.cancel(stale.job_id, stale.attempt, CANCEL_GRACE_PERIOD_S)
            except ClusterError as error:
                log.warning(
                    "stale_gang_removal_failed", cluster=stale.cluster, job_id=stale.job_id, error=str(error)
                )
                return
            self._removed[(stale.cluster, stale.job_id, stale.attempt)] = self._clock()
        log.info(
            "stale_gang_removed",
            cluster=stale.cluster,
            job_id=stale.job_id,
            attempt=stale.attempt,
            why=stale.why.value,
        )

    async def _remove_stale_together(self, cluster: ClusterName, gangs: list[StaleGang]) -> None:
        """Remove a cluster's stale gangs with one `cancel_many` (see COLLECT_HOLD_S)."""
        backend = self._members.get(cluster)
        if not conforms(backend, RemovesMany):  # type: ignore[type-abstract]
            return
        async with self._slots(cluster, dispatch=False):
            try:
                await backend.cancel_many([(g.job_id, g.attempt) for g in gangs], CANCEL_GRACE_PERIOD_S)
            except ClusterError as error:
                log.warning("stale_gangs_removal_failed", cluster=cluster, count=len(gangs), error=str(error))
                return
            now = self._clock()
            for gang in gangs:
                self._removed[(cluster, gang.job_id, gang.attempt)] = now
        log.info(
            "stale_gangs_removed",
            cluster=cluster,
            count=len(gangs),
            gangs=[f"{g.job_id}/{g.attempt}:{g.why.value}" for g in gangs],
        )

    async def _archived_of(self, job_ids: list[JobId]) -> set[JobId]:
        """Which of these jobs (of gangs the cache does not know) the history store holds; none
        when there is no history or it does not answer (their gangs then wait for the next tick)."""
        if self._archived_ids is None or not job_ids:
            return set()
        now = self._clock()
        asked_before = self._not_archived
        # Filled in the order asked (an id is only added once forgotten), so the expired ones are
        # first: forget them and stop at the first that is not, rather than walk every remembered
        # id each tick (a shared cluster can carry thousands of another federation's gangs).
        expired = []
        for job_id, at in asked_before.items():
            if now - at < NOT_ARCHIVED_RECHECK_S:
                break
            expired.append(job_id)
        for job_id in expired:
            del asked_before[job_id]
        asking = [job_id for job_id in job_ids if job_id not in asked_before][:MAX_ARCHIVED_LOOKUPS]
        if not asking:
            return set()
        try:
            found = await asyncio.to_thread(self._archived_ids, asking)
        except StoreUnavailable as error:
            log.warning("archived_gang_lookup_failed", jobs=len(asking), error=str(error))
            return set()
        asked_before.update((job_id, now) for job_id in asking if job_id not in found)
        return found

    async def _reconcile(
        self,
        stored: Stored[JobRecord],
        statuses: dict[ClusterName, dict[GangKey, GangStatus] | None],
        lost: set[ClusterName],
        fence: Fence | None,
    ) -> bool:
        job = stored.value
        gang: GangStatus | None = None
        if job.placement is not None:
            on_cluster = statuses.get(job.placement.cluster)
            gang = None if on_cluster is None else on_cluster.get((job.job_id, job.attempt))
            if gang is not None and gang.started_at_s is not None:
                self._started_at.setdefault((job.job_id, job.attempt), gang.started_at_s)
        vanished = self._vanished(job, gang, statuses)
        if vanished is not None:
            self._started_at.setdefault((job.job_id, job.attempt), vanished.started_at_s)
        if self._keeper is not None and (job.cancel_requested or job.preemption is not None):
            # Copied while its pods are still there, from the tick that stops it: they are gone by
            # the time the attempt ends (federation.scheduling.logs_keep).
            await self._keeper.stopping(job, gang)
        if job.cancel_requested:
            nxt = await self._cancel(job, gang)
        elif job.preemption is not None and job.phase in (JobPhase.ADMITTED, JobPhase.STAGING):
            # Preempted before its gang was created: nothing to evict.
            nxt = self._requeue_preempted(job, Owner.DISPATCHER)
        elif job.phase in (JobPhase.ADMITTED, JobPhase.STAGING):
            nxt = await self._dispatch(job)
        elif job.phase in (JobPhase.DISPATCHED, JobPhase.RUNNING) and job.placement is not None:
            cluster = job.placement.cluster
            cluster_statuses = statuses.get(cluster)
            if cluster_statuses is None:
                # Silence within the grace period may be a blip: leave the job be until it is not.
                if cluster not in lost:
                    return False
                nxt = self._move_off_lost_cluster(job, cluster)
            elif job.preemption is not None:
                nxt = await self._preempt(job, cluster_statuses.get((job.job_id, job.attempt)))
            else:
                nxt = await self._mirror(job, cluster_statuses.get((job.job_id, job.attempt)))
        else:
            return False
        if self._keeper is not None and job.placement is not None:
            nxt = await self._keep(job, nxt, gang)
            # A gang can end before the pod watch showed any of its pods started (the gang's watch
            # ran ahead): its status then gives no start, but the pods the keeper just read do, and
            # without one the ledger charged the attempt nothing.
            kept_start = self._keeper.started_at_s(job.job_id, job.attempt)
            if kept_start is not None:
                self._started_at.setdefault((job.job_id, job.attempt), kept_start)
        if nxt is None:
            return False
        entry = None
        if job.placement is not None:
            entry = ledger_update(
                job,
                nxt,
                site=self._members.site(job.placement.cluster),
                started_at_s=self._started_at.get((job.job_id, job.attempt)),
                finished_at_s=vanished.ended_at_s
                if vanished is not None
                else _charged_until(
                    gang,
                    cancelled=nxt.phase is JobPhase.CANCELLED,
                    waited=self._leftovers.waited((job.job_id, job.attempt)),
                ),
                now_s=self._clock(),
            )
        revision = await self._store.commit(
            [(nxt, stored.mod_revision)], fence=fence, ledger=() if entry is None else (entry,)
        )
        if revision is None:
            return False
        self._ahead[job.job_id] = revision
        self._leftovers.forget((job.job_id, job.attempt))
        self._started_at.pop((job.job_id, job.attempt), None)
        self._cancels_sent.discard((job.job_id, job.attempt))
        self._metrics.transitions.labels(to_phase=nxt.phase.value).inc()
        log.info(
            "job_transitioned",
            job_id=nxt.job_id,
            tenant=nxt.tenant,
            cluster=nxt.placement.cluster if nxt.placement else None,
            from_phase=job.phase.value,
            to_phase=nxt.phase.value,
            attempt=nxt.attempt,
            reason=nxt.message,
        )
        attempt_ended = nxt.phase.is_terminal or nxt.attempt != job.attempt
        if attempt_ended and job.phase in (JobPhase.DISPATCHED, JobPhase.RUNNING):
            await self._release_secrets(job)
        return True

    async def _release_secrets(self, job: JobRecord) -> None:
        """An ended attempt's copy of its tenant's secrets goes now, though its gang is kept a while
        for its logs. A cluster that does not answer keeps it until the collector deletes the gang."""
        if job.placement is None or not uses_secrets(job.spec):
            return
        backend = self._members.get(job.placement.cluster)
        if backend is None:
            return
        try:
            await backend.release_secrets(job.tenant, job.job_id, job.attempt)
        except ClusterError as error:
            log.warning("secrets_release_failed", job_id=job.job_id, error=str(error))

    async def _keep(self, job: JobRecord, nxt: JobRecord | None, gang: GangStatus | None) -> JobRecord | None:
        """The hook where an attempt ends: its logs are kept and its failure named on `nxt`; while a
        dispatched gang waits, the reason it waits (ImagePullBackOff) is written on the job."""
        assert self._keeper is not None
        if nxt is None:
            return await self._keeper.waiting(job, gang) if job.phase is JobPhase.DISPATCHED else None
        if nxt.attempt != job.attempt or nxt.phase.is_terminal:
            return await self._keeper.ended(job, nxt, gang)
        if nxt.phase is JobPhase.RUNNING and job.reason:
            return replace(nxt, reason="")
        return nxt

    async def _cancel(self, job: JobRecord, gang: GangStatus | None) -> JobRecord | None:
        if job.placement is not None and job.phase is not JobPhase.QUEUED:
            key = (job.job_id, job.attempt)
            backend = self._members.get(job.placement.cluster)
            if backend is not None and key not in self._cancels_sent:
                try:
                    await backend.cancel(job.job_id, job.attempt, CANCEL_GRACE_PERIOD_S)
                except ClusterError as error:
                    # Do not record CANCELLED while the gang may still run: try again next tick.
                    log.warning(
                        "cancel_failed", job_id=job.job_id, cluster=job.placement.cluster, error=str(error)
                    )
                    return None
                # Once per leader; pods that outstay their grace are deleted again, without one.
                self._cancels_sent.add(key)
            if backend is not None and gang is not None and gang.live_pods > 0:
                # CANCELLED once the pods are gone: they hold their GPUs (and are billed) until then.
                self._leftovers.note_wait(key)
                if pods_outlive(gang):
                    await self._leftovers.remove(job.placement.cluster, gang)
                return None
        return job.transition(
            JobPhase.CANCELLED, by=Owner.DISPATCHER, at_s=self._clock(), reason=job.message or "cancelled"
        )

    async def _dispatch(self, job: JobRecord) -> JobRecord | None:
        assert job.placement is not None
        cluster = job.placement.cluster
        backend = self._members.get(cluster)
        now = self._clock()
        if backend is None:
            return self._requeue(job, f"cluster {cluster} is no longer a member", now)
        if self._staging is not None and job.spec.dataset is not None:
            # The gang starts only once its dataset is in its cluster's store
            # (see federation.datasets.staging).
            gate = await self._staging.check(job)
            if gate.kind is not GateKind.READY:
                return gate_transition(job, gate, now)
        refusing = self._refusing.get(cluster)
        until_s, own = wait_until_s(job, cluster, refusing)
        if until_s > now:
            # Backing off from a cluster that refused: no call. The record says why it waits (once,
            # in words that do not change during the backoff), for `get` and `list`.
            why = backoff_reason(cluster, until_s, own.error if own is not None else None, refusing)
            return None if job.reason == why else replace(job, reason=why)
        older = [(c, a) for c, a in self._holding.get(job.job_id, ()) if a < job.attempt]
        if older:
            # An earlier attempt still holds pods somewhere (a create that timed out but happened,
            # a gang the collector is removing): two copies of the job must never run at once.
            log.info("dispatch_held_for_older_attempt", job_id=job.job_id, attempt=job.attempt, older=older)
            return None
        try:
            workload = workload_for(job)
            if self._secrets is not None:
                workload = await self._secrets.attach(workload)
        except (SecretMissing, SecretUnreadable) as error:
            log.warning("dispatch_secret_failed", job_id=job.job_id, error=str(error))
            return job.transition(JobPhase.FAILED, by=Owner.DISPATCHER, at_s=now, reason=str(error))
        try:
            await backend.dispatch(workload)
        except GangRejected as error:
            return self._refused(job, cluster, f"{cluster} refused the gang: {error}", now)
        except ClusterError as error:
            return self._refused(job, cluster, f"{cluster} did not take the gang: {error}", now)
        dispatched = job.transition(
            JobPhase.DISPATCHED,
            by=Owner.DISPATCHER,
            at_s=now,
            reason=f"gang of {job.spec.replica_count} created on {cluster}",
            refusals=cleared(job, cluster),
        )
        return replace(dispatched, reason="") if job.reason.startswith(BACKOFF_PREFIX) else dispatched

    def _refused(self, job: JobRecord, cluster: ClusterName, reason: str, now: float) -> JobRecord:
        """Back to the queue, with the refusal on the record: that cluster backs off for this job."""
        refusals = refused(job, cluster, reason, now)
        entry = refusals[-1]
        log.info(
            "dispatch_refused",
            job_id=job.job_id,
            cluster=cluster,
            refusals=entry.count,
            retry_in_s=entry.retry_at_s - now,
            error=reason,
        )
        nxt = self._requeue(job, reason, now)
        return replace(nxt, refusals=refusals)

    @staticmethod
    def _requeue(job: JobRecord, reason: str, now: float) -> JobRecord:
        """Back to the queue as a new attempt that uses up no retry (the gang never started).

        A fresh attempt number gives the next dispatch fresh object names, so a gang that a timed-out
        create left behind can never be mistaken for the new one; the collector removes it.
        """
        return job.transition(
            JobPhase.QUEUED,
            by=Owner.DISPATCHER,
            at_s=now,
            reason=reason,
            attempt=job.attempt + 1,
            placement=None,
        )

    def _vanished(
        self,
        job: JobRecord,
        gang: GangStatus | None,
        statuses: dict[ClusterName, dict[GangKey, GangStatus] | None],
    ) -> VanishedAttempt | None:
        """When the pods of a placed attempt that its cluster no longer reports ran, if its backend
        saw them (clusters.api.RemembersVanished): a gang deleted between two looks is charged."""
        if (
            gang is not None
            or job.placement is None
            or job.phase not in (JobPhase.DISPATCHED, JobPhase.RUNNING)
        ):
            return None
        if statuses.get(job.placement.cluster) is None:
            return None  # the cluster is silent, not the gang gone
        backend = self._members.get(job.placement.cluster)
        if not isinstance(backend, RemembersVanished):
            return None
        return backend.vanished(job.job_id, job.attempt)

    async def _mirror(self, job: JobRecord, gang: GangStatus | None) -> JobRecord | None:
        now = self._clock()
        if gang is not None and pods_outlive(gang):
            # Over by its gang, but its pods still hold GPUs: remove them and wait for them to go.
            assert job.placement is not None
            self._leftovers.note_wait((job.job_id, job.attempt))
            await self._leftovers.remove(job.placement.cluster, gang)
            return None
        if gang is None:
            return self._after_loss(
                job, RestartAction.RESTART_JOB, "the gang disappeared from its cluster", now
            )
        if gang.orphaned:
            return self._after_loss(
                job, RestartAction.RESTART_JOB, "lost its gang object on the cluster (deleted)", now
            )
        if gang.phase.is_final and job.phase is JobPhase.DISPATCHED and gang.started_at_s is not None:
            # Over before any look saw it running (a short gang, or a busy leader's look a round
            # later): its history still says when it ran, as the ledger charges from that start
            # (`intervals.ledger_update`), rather than a success that never ran.
            job = job.transition(JobPhase.RUNNING, by=Owner.STATUS, at_s=gang.started_at_s)
        match gang.phase:
            case GangPhase.PENDING:
                return None
            case GangPhase.RUNNING:
                if job.phase is JobPhase.DISPATCHED:
                    return job.transition(JobPhase.RUNNING, by=Owner.STATUS, at_s=gang.started_at_s or now)
                return None
            case GangPhase.SUCCEEDED:
                return job.transition(
                    JobPhase.SUCCEEDED, by=Owner.STATUS, at_s=gang.finished_at_s or now, reason=gang.message
                )
            case GangPhase.FAILED:
                return self._after_loss(
                    job, job.spec.restart_policy.on_failure, f"failed: {gang.message}", now
                )
            case GangPhase.EVICTED:
                return self._after_loss(
                    job, job.spec.restart_policy.on_eviction, f"evicted: {gang.message}", now
                )
            case GangPhase.CANCELLED:
                return self._after_loss(job, RestartAction.ABORT_JOB, "cancelled on the cluster", now)
        return None

    async def _preempt(self, job: JobRecord, gang: GangStatus | None) -> JobRecord | None:
        """Evict the gang with its grace period; once the cluster says it is gone, requeue the job."""
        order = job.preemption
        assert order is not None
        assert job.placement is not None
        if gang is not None and gang.phase is GangPhase.SUCCEEDED:
            return await self._mirror(job, gang)
        if gang is not None and pods_outlive(gang):
            # Evicted, but not gone yet: the next attempt must not start beside these pods.
            self._leftovers.note_wait((job.job_id, job.attempt))
            await self._leftovers.remove(job.placement.cluster, gang)
            return None
        if gang is None or gang.phase.is_final:
            return self._requeue_preempted(job, Owner.STATUS)
        key = (job.job_id, job.attempt)
        if key in self._evictions_sent:
            return None
        backend = self._members.get(job.placement.cluster)
        if backend is None:
            return None
        why = (
            f"preempted for {order.for_job}: {order.reason}"
            if order.move_to is None
            else f"stopped at a checkpoint to resume on cluster {order.move_to}: {order.reason}"
        )
        try:
            await backend.evict(job.job_id, job.attempt, order.grace_period_s, why)
        except ClusterError as error:
            log.warning("evict_failed", job_id=job.job_id, cluster=job.placement.cluster, error=str(error))
            now = self._clock()
            if now >= order_deadline_s(order):
                return self._withdraw(job, str(error), now)
            return None
        # Remembered per process only: a new leader evicts again, which a backend treats as a no-op.
        self._evictions_sent.add(key)
        if order.move_to is None:
            self._metrics.preemptions.labels(tenant=job.tenant).inc()
        log.info(
            "gang_evicted",
            job_id=job.job_id,
            attempt=job.attempt,
            cluster=job.placement.cluster,
            for_job=order.for_job,
            grace_period_s=order.grace_period_s,
        )
        return None

    def _withdraw(self, job: JobRecord, error: str, now: float) -> JobRecord:
        """The cluster kept refusing to evict the gang until the order's deadline: the order is
        withdrawn, so the room it held for its beneficiary (or, for a move, the private room) is free
        again, and no new order names the gang for ORDER_HOLD_OFF_S. The gang runs on; its record
        says why it was not stopped."""
        order = job.preemption
        assert order is not None
        assert job.placement is not None
        self._evictions_sent.discard((job.job_id, job.attempt))
        self._members.hold_off_orders(job.job_id, now + ORDER_HOLD_OFF_S)
        # Not the job it was for: that may be another tenant's, and this field is not redacted.
        what = "move to cluster " + order.move_to if order.move_to is not None else "preemption"
        reason = (
            f"{what} withdrawn: cluster {job.placement.cluster} refused to evict the gang until the "
            f"order's deadline ({error[:200]})"
        )
        log.warning(
            "order_withdrawn",
            job_id=job.job_id,
            cluster=job.placement.cluster,
            for_job=order.for_job,
            move_to=order.move_to,
            requested_at_s=order.requested_at_s,
            error=error[:200],
        )
        return replace(job, preemption=None, reason=reason)

    def _requeue_preempted(self, job: JobRecord, by: Owner) -> JobRecord:
        """A new attempt at the job's original queue position; a preemption uses up no retry."""
        order = job.preemption
        assert order is not None
        self._evictions_sent.discard((job.job_id, job.attempt))
        reason = (
            f"attempt {job.attempt} preempted for {order.for_job} ({order.reason}); "
            "requeued at its original position"
            if order.move_to is None
            else f"attempt {job.attempt} stopped at a checkpoint to move to cluster {order.move_to} "
            f"({order.reason}); requeued at its original position to resume from the checkpoint"
        )
        return job.transition(
            JobPhase.QUEUED,
            by=by,
            at_s=self._clock(),
            reason=reason,
            attempt=job.attempt + 1,
            placement=None,
            queued_at_s=order.requeue_queued_at_s,
        )

    def _move_off_lost_cluster(self, job: JobRecord, cluster: ClusterName) -> JobRecord:
        """A new attempt, placed afresh; the copy left on the silent cluster is collected when it returns."""
        grace_s = self._members.unreachable_grace_s(cluster)
        return job.transition(
            JobPhase.QUEUED,
            by=Owner.STATUS,
            at_s=self._clock(),
            reason=f"attempt {job.attempt}: cluster {cluster} has not answered for over {grace_s:g}s; "
            "requeued to run elsewhere",
            attempt=job.attempt + 1,
            placement=None,
        )

    def _after_loss(self, job: JobRecord, action: RestartAction, what: str, now: float) -> JobRecord:
        """Restart the whole gang as a new attempt, or fail the job, as its restart policy says."""
        retries_used = job.retries_used
        if action is RestartAction.RESTART_JOB and retries_used < job.spec.restart_policy.max_retries:
            return job.transition(
                JobPhase.QUEUED,
                by=Owner.STATUS,
                at_s=now,
                reason=f"attempt {job.attempt} {what}; restarting the whole gang "
                f"(retry {retries_used + 1} of {job.spec.restart_policy.max_retries})",
                attempt=job.attempt + 1,
                retries_used=retries_used + 1,
                placement=None,
            )
        return job.transition(
            JobPhase.FAILED, by=Owner.STATUS, at_s=now, reason=f"attempt {job.attempt} {what}"
        )


# Past an order's grace period, how long the reconciler keeps asking a cluster that refuses to evict
# the gang before it withdraws the order; and how long no new order names that gang afterwards.
ORDER_DEADLINE_S = 120.0
ORDER_HOLD_OFF_S = 600.0


def order_deadline_s(order: PreemptionOrder) -> float:
    """When an order its cluster still refuses is withdrawn: its grace period, then ORDER_DEADLINE_S."""
    return order.requested_at_s + order.grace_period_s + ORDER_DEADLINE_S


def _charged_until(gang: GangStatus | None, *, cancelled: bool, waited: bool) -> float | None:
    """Where an attempt's ledger interval ends, by its cluster; None for "now".

    A cancel is recorded once the pods are gone, and so is an attempt whose pods the reconciler
    waited for: the GPUs count until then, as the cloud bills them. Then the pods' own end (their
    containers' finishedAt) is that moment where the cluster still shows every pod finished; the
    moment the reconciler noticed can be seconds later on a busy control plane. Otherwise the
    gang's own end (its object's condition) counts.
    """
    if gang is None:
        return None
    if cancelled or waited:
        return gang.pods_ended_at_s if gang.live_pods == 0 else None
    return gang.finished_at_s
