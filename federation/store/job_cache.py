"""Every job in memory, kept current by list-then-watch, so that readers do not each go to etcd.

The scheduler snapshots from here and the API serves `get`/`watch` from here. The cache lists all jobs,
then watches from the revision after the list; when the watch breaks (etcd unavailable, or the revision
was compacted while it was away) it backs off, lists again and resumes from that list's revision, even
one below what it had reached (etcd came back without its last writes), and meanwhile reports itself
not synced. Changes found by a relist are announced to subscribers as if they had been watched, so that a
subscriber sees every job's latest state even across a gap.

Subscribers get bounded queues. One that falls more than `queue_size` events behind is dropped: its
queue is emptied and a single None put on it, which means "you missed events: resubscribe and read
`jobs()` again". None is also the last item each subscriber gets when the cache stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Iterable, Iterator

import structlog

from federation.errors import StoreUnavailable
from federation.store.job_cache_index import JobIndex, ListKey
from federation.store.job_store import JobEvent, JobEventType, JobStore, Stored, paused_gc
from federation.store.job_summary import JobSummaryIndex
from federation.store.jobs import JobRecord
from federation.store.kv import WatchCompacted
from placement.model import JobId, JobPhase, TenantId

log = structlog.get_logger(__name__)

# The phases of jobs not finished, and of ended ones: what `ordered` is asked for by readers that need
# only one kind (a tenant's live jobs, the archiver's ended ones) rather than a copy of every job.
LIVE_PHASES = tuple(p for p in JobPhase if not p.is_terminal)
ENDED_PHASES = tuple(p for p in JobPhase if p.is_terminal)

_BACKOFF_START_S = 0.2
_BACKOFF_MAX_S = 5.0
# The most job ids a change feed holds between two takes: past it the feed gives up, and its reader
# reads every job again, as after a relist (a feed nobody takes, a standby's, stays this small).
FEED_LIMIT = 262_144


class ChangeFeed:
    """The jobs changed since the reader last took them, for a reader that keeps a view of its own
    (the leader's queue, `federation.scheduling.snapshot.GangRequests`) and would otherwise copy and
    walk every live job each time it looks: a cycle over a million queued jobs passed over all of
    them to find the few that changed.

    `take` hands back the ids changed (once each, in the order first changed) and starts afresh, or
    None when the reader must read every job: at its first take, after a relist (which announces
    nothing to feeds: anything may have changed), and after more than `limit` changes."""

    __slots__ = ("_changed", "_limit", "_lost")

    def __init__(self, limit: int = FEED_LIMIT) -> None:
        self._changed: dict[JobId, None] = {}
        self._limit = limit
        self._lost = True

    def note(self, job_id: JobId) -> None:
        if self._lost:
            return
        self._changed[job_id] = None
        if len(self._changed) > self._limit:
            self.lose()

    def lose(self) -> None:
        """Everything may have changed: the next take says so (None)."""
        self._lost = True
        self._changed = {}

    def take(self) -> list[JobId] | None:
        if self._lost:
            self._lost = False
            return None
        changed, self._changed = self._changed, {}
        return list(changed)


class JobCache:
    def __init__(self, store: JobStore, *, queue_size: int = 10_000) -> None:
        self._store = store
        self._queue_size = queue_size
        self._jobs: dict[JobId, Stored[JobRecord]] = {}
        # Jobs not yet finished, kept apart so the leader's loops cost what is in flight, not
        # everything ever submitted.
        self._live: dict[JobId, Stored[JobRecord]] = {}
        # The live jobs the reconciler acts on (`acting`): a deep queue's waiting jobs are not among
        # them, so its ticks, on the event loop every API call shares, do not grow with the queue.
        self._acting: dict[JobId, Stored[JobRecord]] = {}
        # The same jobs in list order by tenant and phase, so that a listing costs what it shows.
        self._index = JobIndex()
        # The live jobs' sums SummarizeJobs answers, kept as jobs change once first asked for.
        self._summary = JobSummaryIndex()
        self._revision = 0
        self._synced = False
        self._task: asyncio.Task[None] | None = None
        self._subscribers: set[asyncio.Queue[JobEvent | None]] = set()
        # `wait_for_revision`'s waiters, soonest revision first: (revision, order, future). Woken
        # when the revision reaches theirs; an asyncio.Event made at every revision, for waiters
        # or none, was a tenth of what a watched write cost the cache.
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._waiter_order = itertools.count()
        # The readers' change feeds (`follow`), each told of every job changed.
        self._feeds: list[ChangeFeed] = []

    @property
    def revision(self) -> int:
        """The store revision the cache reflects: every job change up to it has been applied."""
        return self._revision

    @property
    def synced(self) -> bool:
        return self._synced

    async def start(self) -> None:
        """List all jobs (errors propagate), then follow changes in a background task."""
        if self._task is not None:
            return
        await self._relist()
        self._task = asyncio.create_task(self._follow(), name="job-cache-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._synced = False
        for q in list(self._subscribers):
            self._close_queue(q)
        self._subscribers.clear()

    def get(self, job_id: JobId) -> Stored[JobRecord] | None:
        return self._jobs.get(job_id)

    def jobs(self) -> list[Stored[JobRecord]]:
        return list(self._jobs.values())

    def count(self) -> int:
        """How many jobs the cache holds (etcd's), without copying them."""
        return len(self._jobs)

    def count_in(self, tenant: TenantId | None, phase: JobPhase) -> int:
        """How many jobs of `tenant` (None: every tenant) the cache holds in `phase`, without a walk."""
        return self._index.count(tenant, phase)

    def ordered(
        self,
        tenant: TenantId | None = None,
        phases: Iterable[JobPhase] = (),
        after: ListKey | None = None,
        *,
        newest_first: bool = False,
    ) -> Iterator[Stored[JobRecord]]:
        """Jobs of one tenant (None: all) in some phases (empty: any), in list order past `after` (or
        in reverse from before it), reading only their entries (`federation.store.job_cache_index`).
        Consume it before the next await."""
        return self._index.ordered(tenant, phases, after, newest_first=newest_first)

    def summary(self) -> JobSummaryIndex:
        """The live jobs' sums by tenant, GPU type and group, built at the first call (and after a
        fresh list) and kept as jobs change (`federation.store.job_summary`)."""
        if not self._summary.built:
            self._summary.build(s.value for s in self._live.values())
        return self._summary

    def follow(self, limit: int = FEED_LIMIT) -> ChangeFeed:
        """A feed of the ids of jobs changed from now on (`ChangeFeed`), for as long as the cache
        lives; its first take says to read every job. Read it and the jobs it names with no await
        between, and the jobs read are those of `revision`."""
        feed = ChangeFeed(limit)
        self._feeds.append(feed)
        return feed

    def unfollow(self, feed: ChangeFeed) -> None:
        if feed in self._feeds:
            self._feeds.remove(feed)

    def live_job(self, job_id: JobId) -> Stored[JobRecord] | None:
        """The job if it is live (not in a terminal phase), else None."""
        return self._live.get(job_id)

    def live_map(self) -> dict[JobId, Stored[JobRecord]]:
        """A copy of the live jobs by id, in the order of `live_jobs`."""
        return dict(self._live)

    def live_jobs(self) -> list[Stored[JobRecord]]:
        """Jobs in a phase that is not terminal (queued, admitted, staging, dispatched, running)."""
        return list(self._live.values())

    def acting_jobs(self) -> list[Stored[JobRecord]]:
        """Live jobs past the queue (admitted, staging, dispatched, running), and queued ones with a
        cancel request or a cluster's refusal on record: what the reconciler's tick reads. Every live
        job, with 20,000 of one tenant queued, was three walks of them per tick on the event loop,
        and every other tenant's reads waited behind them (issue 30, item 15)."""
        return list(self._acting.values())

    async def wait_for_revision(self, revision: int, timeout_s: float = 5.0) -> bool:
        """Wait until the cache reflects `revision`; False on timeout.

        Read-your-writes after create_job or commit: pass the revision they returned. The watch only sees
        job keys, so a revision of another write (a tenant, wait reasons) is reached only by a later job
        change or a relist.
        """
        if self._revision >= revision:
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._revision < revision:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            woken: asyncio.Future[None] = loop.create_future()
            heapq.heappush(self._waiters, (revision, next(self._waiter_order), woken))
            try:
                async with asyncio.timeout(remaining):
                    await woken
            except TimeoutError:
                return self._revision >= revision
            finally:
                # A timeout or a cancel cancels the future (awaited directly); else it is cancelled
                # here. Either way its entry is left for `_advance` or the sweep.
                if not woken.done():
                    woken.cancel()
                if woken.cancelled():
                    self._drop_gone_waiters()
        return True

    def subscribe(self) -> asyncio.Queue[JobEvent | None]:
        q: asyncio.Queue[JobEvent | None] = asyncio.Queue(maxsize=self._queue_size)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[JobEvent | None]) -> None:
        self._subscribers.discard(q)

    # ---- internals

    async def _follow(self) -> None:
        backoff_s = _BACKOFF_START_S
        while True:
            try:
                if not self._synced:
                    await self._relist()
                    backoff_s = _BACKOFF_START_S
                events = self._store.watch_jobs(start_revision=self._revision + 1)
                async with contextlib.aclosing(events):
                    async for ev in events:
                        self._apply(ev)
                        backoff_s = _BACKOFF_START_S
                # A watch that ends without an error: the kv was closed under us. List again.
                log.warning("job_cache_watch_ended", revision=self._revision)
            except (WatchCompacted, StoreUnavailable) as e:
                log.warning(
                    "job_cache_watch_broke", revision=self._revision, error=str(e), backoff_s=backoff_s
                )
            except Exception:
                # A bug, not an outage, but a cache that silently stops is worse than one that retries.
                log.exception("job_cache_watch_failed", revision=self._revision, backoff_s=backoff_s)
            self._synced = False
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, _BACKOFF_MAX_S)

    async def _relist(self) -> None:
        # Ended jobs' records are decoded when first read (`KvStore.list_job_entries`): filed by
        # their heads, they are in every map and listing as the others are.
        listed, revision = await self._store.list_job_entries()
        first = not self._synced and self._revision == 0
        old = self._jobs
        # The maps and the index of every job are as many objects again as the records: built, like
        # them, with the cyclic collector held off (`paused_gc`), else it walks the growing heap.
        with paused_gc():
            fresh = {head.job_id: stored for head, stored in listed}
            self._jobs = fresh
            self._live = {head.job_id: stored for head, stored in listed if not head.phase.is_terminal}
            self._acting = {job_id: stored for job_id, stored in self._live.items() if _acting(stored.value)}
            self._index.rebuild_filed(
                (((head.submitted_at_s, head.job_id), head.tenant, head.phase), stored)
                for head, stored in listed
            )
            self._summary.forget()
        for feed in self._feeds:
            feed.lose()
        if not first:
            for job_id, stored in fresh.items():
                was = old.get(job_id)
                if was is None or was.mod_revision != stored.mod_revision:
                    self._publish(JobEvent(JobEventType.PUT, job_id, stored.value, stored.mod_revision))
            for job_id in old.keys() - fresh.keys():
                self._publish(JobEvent(JobEventType.DELETE, job_id, None, revision))
        self._synced = True
        if revision < self._revision:
            # etcd's history went back: it lost writes it had acknowledged (a single-member etcd
            # before 3.5.5 may, when killed: etcd-io/etcd#14370) or was put back to an earlier copy.
            # The list is the truth now. Resuming from the revision this cache had reached would
            # skip every write the new history makes at the revisions it had already passed: a job
            # written there would stay stale here, and each commit from it would fail its compare.
            log.warning("etcd_revision_went_back", was=self._revision, now=revision)
            self._revision = revision
        self._advance(revision)

    def _apply(self, ev: JobEvent) -> None:
        if self._summary.built:
            was = self._live.get(ev.job_id)
            self._summary.change(
                None if was is None else was.value, ev.job if ev.type is JobEventType.PUT else None
            )
        if ev.type is JobEventType.PUT and ev.job is not None:
            stored = Stored(ev.job, ev.mod_revision)
            self._jobs[ev.job_id] = stored
            if ev.job.phase.is_terminal:
                self._live.pop(ev.job_id, None)
            else:
                self._live[ev.job_id] = stored
            if _acting(ev.job):
                self._acting[ev.job_id] = stored
            else:
                self._acting.pop(ev.job_id, None)
            self._index.put(stored)
        else:
            self._jobs.pop(ev.job_id, None)
            self._live.pop(ev.job_id, None)
            self._acting.pop(ev.job_id, None)
            self._index.remove(ev.job_id)
        for feed in self._feeds:
            feed.note(ev.job_id)
        self._publish(ev)
        self._advance(ev.mod_revision)

    def _advance(self, revision: int) -> None:
        if revision > self._revision:
            self._revision = revision
            waiters = self._waiters
            while waiters and waiters[0][0] <= revision:
                woken = heapq.heappop(waiters)[2]
                if not woken.done():
                    woken.set_result(None)

    def _drop_gone_waiters(self) -> None:
        """Forget the waiters that gave up (timed out, cancelled), once they are many: a wait for a
        revision no job write reaches (another key's) leaves its entry until a later one does."""
        if len(self._waiters) > 64:
            self._waiters = [w for w in self._waiters if not w[2].done()]
            heapq.heapify(self._waiters)

    def _publish(self, ev: JobEvent) -> None:
        if not self._subscribers:
            return
        for q in list(self._subscribers):
            try:
                q.put_nowait(ev)
            except asyncio.QueueFull:
                log.warning("job_cache_subscriber_dropped", queue_size=self._queue_size)
                self._subscribers.discard(q)
                self._close_queue(q)

    @staticmethod
    def _close_queue(q: asyncio.Queue[JobEvent | None]) -> None:
        while not q.empty():
            q.get_nowait()
        q.put_nowait(None)


def _acting(job: JobRecord) -> bool:
    """Whether the reconciler has anything to do with `job` (`JobCache.acting_jobs`)."""
    if job.phase.is_terminal:
        return False
    return job.phase is not JobPhase.QUEUED or job.cancel_requested or bool(job.refusals)
