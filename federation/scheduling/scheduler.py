"""The scheduling cycle, run only by the leader.

1. Snapshot (`federation.scheduling.snapshot`): queued and running jobs from the cache (running ones with the
   nodes their cluster reports), tenants with their usage, priority classes, approvals, settings,
   each cluster's free GPUs (less what is admitted but not yet dispatched).
2. Plan: `placement.plan(snapshot, now=...)`, a pure function.
3. Commit: each admission, and each preemption order on a victim, is its own compare-and-swap on
   the job's revision, fenced by the leader lease. A lost race writes nothing; the job is simply
   tried again next cycle. The reconciler carries out preemption orders (evict, then requeue).
4. Explain: wait reasons are written for jobs whose reasons changed, so any server can answer
   `explain` without re-planning.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Collection, Container, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import compress, count, repeat
from operator import add, attrgetter, is_, is_not, itemgetter
from typing import Protocol, TypeVar

import structlog

from clusters.api import GangStatus
from federation.datasets.registry import DatasetLocations, with_registry_locations
from federation.ledger.cache import LedgerCache
from federation.ledger.usage import TenantUsage, tenant_usage
from federation.metrics import Metrics
from federation.scheduling.archived_usage import ArchivedUsage
from federation.scheduling.burst_offer import burst_offer_for, needs_burst_offer
from federation.scheduling.idle import IdleGate
from federation.scheduling.members import GangKey, MemberClusters
from federation.scheduling.snapshot import GangRequests, PlacerInputs, snapshot_from
from federation.scheduling.yielding import StepAside
from federation.store.job_cache import JobCache
from federation.store.job_store import (
    Fence,
    JobStore,
    Stored,
    cut_wait_writes,
    encode_wait_reasons,
    paused_gc,
)
from federation.store.jobs import JobPlacement, JobRecord, Owner, PreemptionOrder
from placement.chunks import Chunks, same_chunks
from placement.explain import admitted, move_reason
from placement.model import (
    Admission,
    Alternative,
    CapacityRequest,
    ClusterName,
    ClusterState,
    JobId,
    JobPhase,
    Move,
    Plan,
    Preemption,
    TenantId,
    Waiting,
    WaitReason,
)
from placement.plan import plan

_JOB_ID = attrgetter("job_id")
# Places of the waiting jobs per C-level pass in `Scheduler._reasons_to_write`: such a pass holds the
# GIL to its end (no bytecode runs), so it is cut into runs with the event loop's turn between.
_RUN = 65_536
_KEY = attrgetter("key")
# `_aligned`: places looked at around a difference, and the differences it steps past at most (a
# few C-level calls each, 2 to 3 µs) before the waits are read as they were before the placer handed
# them on: 64, and one per 1,024 waits (a deep queue's steady cycle decides a few hundred gangs
# anew, waits made anew in their places, a step per 64; a queue of 10,000 whose waits are all new
# gives up in a fifth of a millisecond).
_ALIGN_WINDOW = 64
_ALIGN_MISSES = 64
_ALIGN_MISS_SHARE = 1024
# Between the chunks two plans share (`_aligned_by_chunks`), a step per 64 waits: the places there are
# the few that changed (a stretch's edits spread over its chunks, the gangs decided one by one), and
# giving up on them reads every wait of the queue.
_ALIGN_CHUNKED_MISS_SHARE = 64
# More canonical key objects than this and the cycle's comparison reads every wait (and forgets the
# keys no wait has): the comparison by alignment reads only the waits that differ, not which keys all
# the waits have.
_CANONICAL_MOST = 65_536
_VALUE = attrgetter("value")
_FIRST = itemgetter(0)
T = TypeVar("T")

# The wait key of reasons read from the store: equal to no `Waiting.key`, so they are compared
# by their worded reasons.
_READ_FROM_STORE = object()
# What a waiting job without reasons written reads as its written ones (`_reasons_to_write`).
_NOT_WRITTEN = object()
_UNWRITTEN: tuple[Hashable, tuple[WaitReason, ...]] = (_NOT_WRITTEN, ())

log = structlog.get_logger("gpufed.scheduler")

# Bounded so that a cycle with thousands of admissions does not open thousands of etcd calls at once.
COMMIT_CONCURRENCY = 64
# The most jobs whose wait reasons one cycle writes (or deletes): a new leader over a million
# queued jobs, none of them with reasons yet, wrote them all in its first cycle, minutes of etcd
# requests of 1 MiB during which its keepalives came too late and it lost its lease, again and
# again (bench/scale_depth.py). 256 transactions; the next cycles write the rest, in the order the
# placer left the jobs waiting.
WAIT_WRITES_PER_CYCLE = 16_384
# And at most this many of their transactions in flight (of 64 jobs each): etcd applies requests one
# after another, and a lease's renewal waited behind 2 MiB of them.
WAIT_WRITES_IN_FLIGHT = 8
# How often the placer's inputs (settings, tenants, users, approvals) are re-read from etcd, and
# how often usage is re-added from the job records: admin changes apply within this, at a cycle.
INPUTS_REFRESH_S = 2.0
USAGE_REFRESH_S = 10.0


@dataclass(frozen=True, slots=True)
class CycleResult:
    admitted: int
    conflicts: int
    waiting: int
    seconds: float


@dataclass(frozen=True, slots=True)
class _Planned:
    """One cycle's plan, with what the event loop needs of it worked out beside it on the thread."""

    plan: Plan
    # The jobs the plan names, by id, with the revisions the snapshot was built from.
    stored: Mapping[JobId, Stored[JobRecord]]
    # Queued jobs by tenant, for the queue-depth gauge.
    queue_depth: Mapping[str, int]
    cpu_s: float
    # The jobs that left the queue since the last cycle (None: every job was read, so unknown), and
    # the queue's ids (valid until the next cycle's snapshot): where `_reasons_to_write` looks for
    # the jobs whose written reasons are to be deleted.
    departed: set[JobId] | None = None
    queued_ids: Container[JobId] = ()


def _snapshot_and_plan(
    live: Mapping[JobId, Stored[JobRecord]],
    changed: Mapping[JobId, Stored[JobRecord] | None] | None,
    inputs: PlacerInputs,
    inventories: Sequence[ClusterState],
    statuses: Mapping[ClusterName, Mapping[GangKey, GangStatus] | None],
    usage: Mapping[TenantId, TenantUsage],
    preempted_gpus: int,
    now: float,
    requests: GangRequests,
    held_off: frozenset[JobId] = frozenset(),
    between: Callable[[], None] | None = None,
) -> _Planned:
    # On the worker thread, not the event loop, where 20,000 queued jobs made each walk of them a pause
    # of every API call in flight (issue 30, item 15): the plan still passes over the whole queue, and
    # a carry that reads every job (a new term, a relist, new inputs) walks them all.
    # `live`: every live job as the cycle read it; `changed`: those changed since the last call (None:
    # any may have), from which `requests` carries the queue (`GangRequests.carry`).
    # With the cyclic collector held off, and what the cycle made frozen if it made many objects
    # (`paused_gc`): a new leader's first cycle over a million queued jobs builds their requests,
    # millions of long-lived objects the heap's freezer had not seen, and each full collection
    # that followed walked them all, holding the GIL for seconds, until the leader's keepalives
    # came too late and its lease expired (bench/scale_depth.py, every 20 to 40 s). None of it is
    # cyclic: reference counting frees it as before.
    with paused_gc():
        cpu_started = time.thread_time()
        records = None if changed is None else {j: None if s is None else s.value for j, s in changed.items()}
        queue = requests.carry(records, lambda: map(_VALUE, live.values()), inputs, between)
        snapshot = snapshot_from(
            queue.requests,
            queue.placed,
            inputs,
            inventories,
            statuses=statuses,
            usage=usage,
            preempted_gpus_this_interval=preempted_gpus,
            held_off=held_off,
        )
        result = plan(snapshot, now=now, between=between, carry=requests.plan_carry)
        return _Planned(
            result,
            _named(result, live),
            queue.depth,
            time.thread_time() - cpu_started,
            queue.departed,
            queue.ids,
        )


def _aligned(
    waits: Sequence[Waiting], last: Sequence[Waiting], between: Callable[[], None]
) -> tuple[list[tuple[int, int, int]] | None, int]:
    """The runs of places where `waits` holds the very objects `last` held, in order: (start, stop,
    start in `last`); None if finding them took more than `_ALIGN_MISSES` steps past places that
    differ (each a few C-level calls on short slices). Places differ where waits were made anew (gangs
    decided again: a stretch of places in step), put in or taken out; the runs between are compared
    by C-level passes. Whatever the lists, each run holds the same objects in both. With the runs, the
    places of `waits` compared one by one.

    Plans whose waits are chunks (`placement.chunks.Chunks`: a deep queue's stretches, kept by the
    placer and shared with the last plan's waits where unchanged) are aligned by their chunks first
    (`_aligned_by_chunks`), reading no wait of a chunk the two share."""
    if isinstance(waits, Chunks) and isinstance(last, Chunks):
        return _aligned_by_chunks(waits, last, between)
    return _aligned_items(waits, last, between), len(waits)


def _aligned_by_chunks(
    waits: Chunks[Waiting], last: Chunks[Waiting], between: Callable[[], None]
) -> tuple[list[tuple[int, int, int]], int]:
    """`_aligned` of two plans' chunked waits: the chunks that are the very objects of the last
    plan's (`same_chunks`, a look-up per chunk: a thousand at a million) are runs as they stand, and
    only the places between them (the chunks made anew: the gangs decided one by one, the chunks a
    stretch's edits copied) are aligned wait by wait (`_aligned_items`); a stretch of those that does
    not align is left out of the runs (read as differing)."""
    runs: list[tuple[int, int, int]] = []
    j = i = compared = 0
    for start, stop, from_last in [*same_chunks(waits, last), (len(waits), len(waits), len(last))]:
        if start > j and from_last > i:
            compared += start - j
            these, those = waits.span(j, start), last.span(i, from_last)
            between_runs = _aligned_items(these, those, between, _ALIGN_CHUNKED_MISS_SHARE)
            for sub_start, sub_stop, sub_from in between_runs or ():
                _add_run(runs, j + sub_start, j + sub_stop, i + sub_from)
        if stop > start:
            _add_run(runs, start, stop, from_last)
        j, i = stop, from_last + (stop - start)
    return runs, compared


def _add_run(runs: list[tuple[int, int, int]], start: int, stop: int, from_last: int) -> None:
    """The run appended, or joined to the last one if it goes on from it in both lists."""
    if runs and runs[-1][1] == start and runs[-1][2] + (start - runs[-1][0]) == from_last:
        runs[-1] = (runs[-1][0], stop, runs[-1][2])
    else:
        runs.append((start, stop, from_last))


def _aligned_items(
    waits: Sequence[Waiting],
    last: Sequence[Waiting],
    between: Callable[[], None],
    miss_share: int = _ALIGN_MISS_SHARE,
) -> list[tuple[int, int, int]] | None:
    """`_aligned`, wait by wait, with a step past a difference allowed per `miss_share` waits."""
    runs: list[tuple[int, int, int]] = []
    size, before = len(waits), len(last)
    misses = _ALIGN_MISSES + size // miss_share
    i = j = 0
    while j < size and i < before:
        same = _same_from(waits, j, last, i, between)
        if same:
            runs.append((j, j + same, i))
            i += same
            j += same
            continue
        misses -= 1
        if misses < 0:
            return None
        # Made anew in place (a gang decided again): both lists hold one object again a few places on.
        found = _find_in_step(waits, j, last, i)
        if found is not None:
            i += found
            j += found
            continue
        # Put in, or taken out: the other list's wait is a few places on.
        found = _find(last, i + 1, waits[j])
        if found is not None:
            i = found
            continue
        found = _find(waits, j + 1, last[i])
        if found is not None:
            j = found
            continue
        i += _ALIGN_WINDOW
        j += _ALIGN_WINDOW
    return runs


def _same_from(a: Sequence[T], j: int, b: Sequence[T], i: int, between: Callable[[], None]) -> int:
    """How many places from a[j] and b[i] on hold the same objects: compared in slices that grow from
    `_ALIGN_WINDOW` to `_RUN` (most comparisons after a difference end at once), `between` after each
    `_RUN`."""
    same, step = 0, _ALIGN_WINDOW
    while True:
        these = a[j + same : j + same + step]
        those = b[i + same : i + same + step]
        unlike = next(compress(count(), map(is_not, these, those)), None)
        if unlike is not None:
            return same + unlike
        if len(these) < step or len(those) < step:
            return same + min(len(these), len(those))
        same += step
        if step == _RUN:
            between()
        step = min(_RUN, 2 * step)


def _find_in_step(a: Sequence[T], j: int, b: Sequence[T], i: int) -> int | None:
    """How many places on from a[j] and b[i], within `_ALIGN_WINDOW`, both hold one object, or None."""
    these, those = a[j : j + _ALIGN_WINDOW], b[i : i + _ALIGN_WINDOW]
    return next(compress(count(), map(is_, these, those)), None)


def _find(items: Sequence[T], start: int, wanted: T) -> int | None:
    """The place of `wanted` (the object) within `_ALIGN_WINDOW` places of `start`, or None."""
    window = items[start : start + _ALIGN_WINDOW]
    return next(compress(count(start), map(is_, window, repeat(wanted))), None)


def _spans(start: int, stop: int, between: Callable[[], None]) -> Iterator[tuple[int, int]]:
    """[start, stop) in spans of `_RUN`, `between` called before each."""
    for at in range(start, stop, _RUN):
        between()
        yield at, min(stop, at + _RUN)


def _same_for(
    ids: list[JobId], last: list[JobId], most: int, between: Callable[[], None], *, from_end: bool = False
) -> int:
    """How many places from the start (or the end) hold the same job in both lists, at most `most`."""
    size, before = len(ids), len(last)
    for start, stop in _spans(0, most, between):
        if from_end:
            these, those = ids[size - stop : size - start][::-1], last[before - stop : before - start][::-1]
        else:
            these, those = ids[start:stop], last[start:stop]
        unlike = next(compress(count(start), map(is_not, these, those)), None)
        if unlike is not None:
            return unlike
    return most


def _runs(items: Sequence[T], size: int, between: Callable[[], None]) -> Iterator[Sequence[T]]:
    """`items` in runs of `size`, `between` called before each."""
    for start in range(0, len(items), size):
        between()
        yield items[start : start + size]


def _through_runs(places: Sequence[int], runs: Sequence[tuple[int, int, int]]) -> list[int]:
    """The `places` (ascending, of the last cycle's waits) that `runs` (start, stop, start in the
    last) carry, as places of this cycle's, ascending: a bisection per run and C-level shifts."""
    out: list[int] = []
    for start, stop, from_last in runs:
        low = bisect_left(places, from_last)
        high = bisect_left(places, from_last + stop - start, low)
        if high > low:
            out += map(add, places[low:high], repeat(start - from_last))
    return out


def _not_written(
    written: Mapping[JobId, tuple[Hashable, tuple[WaitReason, ...]]], ids: list[JobId], places: list[int]
) -> int:
    """How many of the jobs at `places` have no reasons written (C-level)."""
    olds = map(written.get, map(ids.__getitem__, places), repeat(_UNWRITTEN))
    return sum(map(is_, olds, repeat(_UNWRITTEN)))


def _named(result: Plan, live: Mapping[JobId, Stored[JobRecord]]) -> dict[JobId, Stored[JobRecord]]:
    """The jobs the plan acts on (admitted, evicted, moved, given a burst offer), by id, as the
    snapshot read them."""
    named = {a.job_id for a in result.admissions}
    named.update(p.victim for p in result.preemptions)
    named.update(m.job_id for m in result.moves)
    named.update(result.bursts)
    return {job_id: stored for job_id in named if (stored := live.get(job_id)) is not None}


def _warm_requests(jobs: Sequence[Stored[JobRecord]], inputs: PlacerInputs, requests: GangRequests) -> int:
    """Each queued job's request built (or kept), as a cycle's snapshot would ask for it."""
    queued = [s.value for s in jobs if s.value.phase is JobPhase.QUEUED and not s.value.cancel_requested]
    with paused_gc():  # long-lived, as in `_snapshot_and_plan`
        for job in queued:
            requests.get(job, inputs)
    requests.keep_only({job.job_id for job in queued})
    return len(queued)


class CapacityHook(Protocol):
    """What the scheduler asks of the capacity reconciler, if there is one.

    That is `federation.capacity.reconciler`, in a sibling room the scheduler does not import.
    """

    def with_scalable_pools(self, states: Sequence[ClusterState]) -> list[ClusterState]: ...

    def offer(self, requests: Sequence[CapacityRequest], starts_at_s: Mapping[JobId, float]) -> None: ...

    def annotate(self, waiting: Sequence[Waiting]) -> Sequence[Waiting]: ...


class InputsReader:
    """The placer's inputs from etcd, re-read at most every INPUTS_REFRESH_S; a new version on change."""

    def __init__(
        self,
        store: JobStore,
        clock: Callable[[], float] = time.monotonic,
        dataset_locations: DatasetLocations | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._dataset_locations = dataset_locations
        self._inputs: PlacerInputs | None = None
        self._read_at = float("-inf")

    async def read(self) -> PlacerInputs:
        if self._inputs is not None and self._clock() - self._read_at < INPUTS_REFRESH_S:
            return self._inputs
        settings = await self._store.get_settings()
        if self._dataset_locations is not None:
            # The registry says where each version is (home and cached copies); the config's list
            # still answers for datasets the registry does not know.
            settings = with_registry_locations(settings, await self._dataset_locations())
        tenants = tuple(await self._store.list_tenants())
        users = {u.name: u for u in await self._store.list_users()}
        approvals = tuple(await self._store.list_approvals())
        previous = self._inputs
        fresh = PlacerInputs(settings=settings, tenants=tenants, users=users, approvals=approvals)
        if previous is None or (previous.settings, previous.tenants, previous.users, previous.approvals) != (
            settings,
            tenants,
            users,
            approvals,
        ):
            version = 0 if previous is None else previous.version + 1
            self._inputs = replace(fresh, version=version)
        self._read_at = self._clock()
        assert self._inputs is not None
        return self._inputs


class Scheduler:
    def __init__(
        self,
        *,
        store: JobStore,
        cache: JobCache,
        ledger: LedgerCache,
        members: MemberClusters,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        dataset_locations: DatasetLocations | None = None,
        capacity: CapacityHook | None = None,
        archived_usage: ArchivedUsage | None = None,
    ) -> None:
        self._capacity = capacity
        # What the archiver moved to SQL still counts against budgets and in fair share.
        self._archived_usage = archived_usage
        self._archived_read = False
        self._store = store
        self._cache = cache
        self._ledger = ledger
        self._members = members
        self._metrics = metrics
        self._clock = clock
        # Per job, the reasons last written and the key of the wait they came from (`Waiting.key`).
        self._written_reasons: dict[JobId, tuple[Hashable, tuple[WaitReason, ...]]] = {}
        # Whether `_written_reasons` was read from the store, and under which leader term (fence).
        self._reasons_read = False
        self._reasons_fence: Fence | None = None
        self._requests = GangRequests()
        # The live jobs as the last cycle read them, kept current from the cache's changes (`_read_live`),
        # and those changed since the last snapshot took them (None: any may have): a cycle over a deep
        # queue copied every live job and the snapshot walked them all to find the few that changed.
        self._feed = cache.follow()
        self._live: dict[JobId, Stored[JobRecord]] = {}
        self._changed: dict[JobId, Stored[JobRecord] | None] | None = None
        # The term the live copy and the carried queue were last read under: a new one reads all.
        self._live_fence: Fence | object | None = _NOT_WRITTEN
        # Jobs that may have reasons written but wait no more (`_reasons_to_write`): those that left
        # the queue or were admitted, and those left over by a cycle's bound on writes.
        self._maybe_left: set[JobId] = set()
        # One object per value of the wait keys written (`_reasons_to_write`).
        self._canonical_keys: dict[Hashable, Hashable] = {}
        # The last cycle's waiting jobs and their keys' objects, in the placer's order, once every one
        # of them has those written (`_WaitsWritten`); and this cycle's, until its writes are done.
        self._last_waits: _WaitsWritten | None = None
        self._these_waits: _WaitsWritten | None = None
        # Waits read one by one by the reasons' comparison (`_reasons_to_write`): all of them when the
        # last cycle's are not kept, else those compared place by place with the last cycle's, which
        # for chunked waits are only the places between the chunks the two plans share (for tests and
        # benchmarks: a steady cycle reads what changed, not the queue).
        self.waits_compared = 0
        # The waits the last comparison did not look at, past its bound on writes (`_reasons_to_write`),
        # and their places in its waits (ascending).
        self.reasons_unread = 0
        self._unread_places: list[int] = []
        self._inputs = InputsReader(store, clock, dataset_locations)
        self._usage: dict[TenantId, TenantUsage] = {}
        self._usage_at = float("-inf")
        # (when, GPUs) of the preemptions this leader ordered, for the per-interval limit.
        self._preempted: deque[tuple[float, int]] = deque()
        # Skips cycles that would read exactly what the last one read (`federation.scheduling.idle`).
        self._idle = IdleGate()
        self._last_waiting = 0
        # Cycles begun, idle ones included: each `job_admitted` line names its cycle's number, which a
        # client compares with `gpufed_scheduling_cycles_started_total` to count a wait in cycles.
        self.cycles = 0

    @property
    def idle_gate(self) -> IdleGate:
        """When the scheduler may skip a cycle in which nothing changed (`federation.scheduling.idle`)."""
        return self._idle

    def _tenant_usage(self, now: float, inputs: PlacerInputs) -> dict[TenantId, TenantUsage]:
        if now - self._usage_at >= USAGE_REFRESH_S:
            parents = {t.name: t.parent for t in inputs.tenants}
            half_life_h = inputs.settings.usage_half_life_h
            usage = tenant_usage(
                self._ledger.intervals(), now_s=now, half_life_h=half_life_h, parents=parents
            )
            if self._archived_usage is not None:
                self._archived_usage.refresh_if_due(now, half_life_h)
                usage = self._archived_usage.add_to(
                    usage, now_s=now, half_life_h=half_life_h, parents=parents
                )
            self._usage = usage
            self._usage_at = now
        return self._usage

    def _read_live(self, fence: Fence | None) -> None:
        """Bring the copy of the live jobs up to the cache's revision from its changes, noting them for
        the snapshot; on a new term, or when the feed lost track (a relist), copy them all. On the event
        loop, with no await: the copy is the jobs of the revision read beside it."""
        ids = self._feed.take()
        if ids is None or fence != self._live_fence:
            self._live = self._cache.live_map()
            self._changed = None
            self._live_fence = fence
            return
        live, get, changed = self._live, self._cache.live_job, self._changed
        for job_id in ids:
            stored = get(job_id)
            if stored is None:
                live.pop(job_id, None)
            else:
                live[job_id] = stored
            if changed is not None:
                changed[job_id] = stored

    def _preempted_gpus(self, now: float, interval_s: float) -> int:
        while self._preempted and self._preempted[0][0] <= now - interval_s:
            self._preempted.popleft()
        return sum(gpus for _, gpus in self._preempted)

    async def stand_by(self) -> int:
        """On a server that does not lead: build each queued job's request now, as a cycle would
        (kept until the job's record or the inputs change), so that a takeover's first cycle finds
        them built. A standby's first cycle built them all (a third of its 1-2 s at 10,000 queued
        jobs, bench/scale_failover.py). Reads the caches and the inputs; writes nothing, and must
        not run beside a cycle. Returns the queued jobs it looked at."""
        inputs = await self._inputs.read()
        return await asyncio.to_thread(_warm_requests, self._cache.live_jobs(), inputs, self._requests)

    async def run_cycle(self, fence: Fence | None) -> CycleResult:
        # Counted before anything is read: a cycle numbered above a count read at some moment saw
        # every job change made before it (tests/e2e/test_set_fairness.py).
        self.cycles += 1
        self._metrics.cycles_started.inc()
        started = time.perf_counter()
        # The live jobs as of one revision, read together with no await between: the event loop
        # applies the cache's watch events during this cycle's awaits and while the worker thread
        # plans, so the cycle works on a copy (the scheduler's own, brought up to date from the jobs
        # the cache says changed: a copy of a million live jobs was 9 to 12 ms of every cycle), and
        # the revision it says it read is the copy's. The revision read after the awaits, as before,
        # could name a job the copy lacks: the idle gate then skipped the cycles that would have
        # planned it, for up to its replan interval.
        self._read_live(fence)
        live, revision = self._live, self._cache.revision
        inputs = await self._inputs.read()
        # Statuses read with the inventory, from the same look at each cluster, not the reconciler's
        # from up to a tick ago: the snapshot holds back the GPUs of live gangs whose pods the
        # inventory does not show yet, and a status older than the inventory counted a pod bound
        # since then twice (less free capacity: under burst-now a gang went to a cloud while private
        # GPUs stood free).
        statuses, inventories = await self._members.observe()
        if self._capacity is not None:
            inventories = self._capacity.with_scalable_pools(inventories)
        now = self._clock()
        if self._archived_usage is not None and not self._archived_read:
            # A new leader's first cycle must not forget what the archive holds: read it once first
            # (or wait for the read the server started while it listed etcd).
            await self._archived_usage.read_once(now, inputs.settings.usage_half_life_h)
            self._archived_read = True
            self._usage_at = float("-inf")
        usage = self._tenant_usage(now, inputs)
        preempted = self._preempted_gpus(now, inputs.settings.preemption_interval_s)
        read = (revision, inputs.version, tuple(inventories), statuses, usage, preempted)
        if self._idle.may_skip(read, now):
            return CycleResult(admitted=0, conflicts=0, waiting=self._last_waiting, seconds=0.0)
        # Building the snapshot and planning are pure and CPU-bound, and grow with the queue. On a
        # worker thread the event loop still gets the GIL every switch interval, so API calls wait
        # milliseconds behind a long cycle instead of its whole length.
        planned = await asyncio.to_thread(
            _snapshot_and_plan,
            live,
            self._changed,
            inputs,
            inventories,
            statuses,
            usage,
            preempted,
            now,
            self._requests,
            # Gangs whose cluster refused the last order to evict them: none is ordered again yet.
            self._members.held_off(now),
            StepAside(self._metrics),
        )
        # Taken: the queue carried is as of `live` (an exception above leaves them for the next cycle,
        # and a carry half-way carries nothing).
        self._changed = {}
        result, stored_jobs = planned.plan, planned.stored

        semaphore = asyncio.Semaphore(COMMIT_CONCURRENCY)
        evictions = await asyncio.gather(
            *(
                self._order_preemption(stored_jobs[p.victim], p, now, fence, semaphore)
                for p in result.preemptions
                if p.victim in stored_jobs
            )
        )
        outcomes = await asyncio.gather(
            *(
                self._admit(stored_jobs[a.job_id], a, now, fence, semaphore, result.bursts.get(a.job_id))
                for a in result.admissions
            )
        )
        admitted = sum(outcomes)
        conflicts = len(outcomes) - admitted
        moved = await asyncio.gather(
            *(
                self._order_move(stored_jobs[m.job_id], m, now, fence, semaphore)
                for m in result.moves
                if m.job_id in stored_jobs
            )
        )

        waiting: Sequence[Waiting] = result.waiting
        if self._capacity is not None:
            # The capacity reconciler acts on the requests after this cycle; its word on earlier
            # ones (refused, failing, on the way) goes into the waiting jobs' reasons.
            starts = {r.job_id: r.start_at_s for r in result.reservations}
            self._capacity.offer(result.capacity_requests, starts)
            waiting = self._capacity.annotate(result.waiting)
        reasons_left = await self._write_reasons(waiting, fence, semaphore, planned)
        await self._record_bursts(result, stored_jobs, now, fence, semaphore)
        self._metrics.set_queue_depth(planned.queue_depth)
        seconds = time.perf_counter() - started
        self._metrics.cycle_seconds.observe(seconds)
        self._metrics.cycle_cpu_seconds.inc(planned.cpu_s)
        self._last_waiting = len(result.waiting)
        if admitted or conflicts or result.preemptions or result.moves or reasons_left:
            # What it wrote changes the jobs; a conflict, an order or reasons not written must be
            # tried again.
            self._idle.forget()
        else:
            self._idle.planned(read, now, seconds)
        if admitted or conflicts or any(evictions) or any(moved):
            log.info(
                "cycle_completed",
                admitted=admitted,
                conflicts=conflicts,
                preemptions=sum(evictions),
                moves=sum(moved),
                waiting=len(result.waiting),
            )
        for request in result.capacity_requests if self._capacity is None else ():
            # Without a provisioner nothing acts on these: they are logged, and the waiting job's
            # reasons say which pool would have to grow.
            log.info(
                "capacity_requested",
                cluster=request.cluster,
                pool=request.pool,
                gpu_type=request.gpu_type,
                nodes=request.nodes,
                jobs=list(request.job_ids),
            )
        return CycleResult(
            admitted=admitted, conflicts=conflicts, waiting=len(result.waiting), seconds=seconds
        )

    async def _order_preemption(
        self,
        stored: Stored[JobRecord],
        preemption: Preemption,
        now: float,
        fence: Fence | None,
        semaphore: asyncio.Semaphore,
    ) -> bool:
        """Mark the victim for eviction; the reconciler evicts it and requeues it when it is gone."""
        victim = stored.value
        order = PreemptionOrder(
            for_job=preemption.for_job,
            reason=preemption.reason.value,
            grace_period_s=preemption.grace_period_s,
            requested_at_s=now,
            requeue_queued_at_s=preemption.requeue_queued_at_s,
        )
        if not await self._write_order(stored, order, fence, semaphore):
            return False
        self._preempted.append((now, preemption.gpu_count))
        log.info(
            "preemption_ordered",
            victim=victim.job_id,
            tenant=victim.tenant,
            cluster=preemption.cluster,
            gpus=preemption.gpu_count,
            for_job=preemption.for_job,
            reason=preemption.reason.value,
        )
        return True

    async def _write_order(
        self,
        stored: Stored[JobRecord],
        order: PreemptionOrder,
        fence: Fence | None,
        semaphore: asyncio.Semaphore,
    ) -> bool:
        """Put an order on a running job's record (a compare-and-swap on its revision, fenced). False
        when the job carries an order already or the write lost a race: nothing was written."""
        if stored.value.preemption is not None:
            return False
        async with semaphore:
            revision = await self._store.commit(
                [(replace(stored.value, preemption=order), stored.mod_revision)], fence=fence
            )
        return revision is not None

    async def _order_move(
        self,
        stored: Stored[JobRecord],
        move: Move,
        now: float,
        fence: Fence | None,
        semaphore: asyncio.Semaphore,
    ) -> bool:
        """Stop a cloud gang at a checkpoint so that it resumes on idle private GPUs (`placement.repatriate`).

        The order is a preemption order of the job for itself, with `move_to`: the reconciler evicts
        the gang with the grace period (the time to write the checkpoint), and once the cluster says
        it is gone requeues the job at its original queue position, charging no retry. The next
        cycle places it as any queued job, on the private room, which the snapshot holds for it until
        then (`snapshot.move_hold`). It does not count against the preemption limit: it evicts no
        one but the job itself, which said it may be moved. The placer moves only running gangs that
        are not leaving (`repatriate.is_candidate`), read from these same records.
        """
        job = stored.value
        order = PreemptionOrder(
            for_job=job.job_id,
            reason=move_reason(move),
            grace_period_s=move.grace_period_s,
            requested_at_s=now,
            requeue_queued_at_s=job.queued_at_s,
            move_to=move.to_cluster,
            move_gpu_type=move.to_gpu_type,
        )
        if not await self._write_order(stored, order, fence, semaphore):
            return False
        self._metrics.moves.labels(tenant=job.tenant).inc()
        log.info(
            "move_ordered",
            job_id=job.job_id,
            tenant=job.tenant,
            from_cluster=move.from_cluster,
            to_cluster=move.to_cluster,
            gpus=move.gpu_count,
            saving_usd=round(move.saving_usd, 2),
        )
        return True

    async def _admit(
        self,
        stored: Stored[JobRecord],
        admission: Admission,
        now: float,
        fence: Fence | None,
        semaphore: asyncio.Semaphore,
        burst: Alternative | None = None,
    ) -> bool:
        offer = burst_offer_for(stored.value, burst, admission, now)
        job = stored.value.transition(
            JobPhase.ADMITTED,
            by=Owner.SCHEDULER,
            at_s=now,
            # Why there (price, type, data, what it beat): `explain` of the running job reads it back.
            reason=f"admitted to {admission.cluster} ({admission.gpu_type}, {admission.kind.value}); "
            f"{admitted(admission)}",
            placement=JobPlacement(
                cluster=admission.cluster,
                gpu_type=admission.gpu_type,
                kind=admission.kind,
                usd_per_gpu_hour=admission.usd_per_gpu_hour,
            ),
            # The attempt's burst-at-once alternative, in this same write (`burst_offer`).
            **({} if offer is None else {"burst_offer": offer}),
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
            cycle=self.cycles,
            tenant=job.tenant,
            cluster=admission.cluster,
            gpu_type=admission.gpu_type,
            usd_per_gpu_hour=admission.usd_per_gpu_hour,
        )
        return True

    async def _record_bursts(
        self,
        result: Plan,
        stored_jobs: Mapping[JobId, Stored[JobRecord]],
        now: float,
        fence: Fence | None,
        semaphore: asyncio.Semaphore,
    ) -> None:
        """Record the burst-at-once alternative of each waiting job whose attempt has none yet: one
        compare-and-swap per attempt (admitted jobs got theirs in the admission's write). A lost race
        writes nothing; the next cycle tries again."""
        admitted_ids = {a.job_id for a in result.admissions}

        async def record(stored: Stored[JobRecord], alternative: Alternative) -> None:
            offer = burst_offer_for(stored.value, alternative, None, now)
            if offer is None:
                return
            async with semaphore:
                await self._store.commit(
                    [(replace(stored.value, burst_offer=offer), stored.mod_revision)], fence=fence
                )

        await asyncio.gather(
            *(
                record(stored, alternative)
                for job_id, alternative in result.bursts.items()
                if job_id not in admitted_ids
                and (stored := stored_jobs.get(job_id)) is not None
                and stored.value.phase is JobPhase.QUEUED
                and needs_burst_offer(stored.value)
            )
        )

    async def _read_written_reasons(self, fence: Fence | None) -> None:
        """What the store holds, as this term's starting point: a new leader (or this one back in
        office after another wrote) knew nothing of what was written, and rewrote every waiting
        job's reasons on its first cycle: 8,000 fenced writes, most of its first pass after a
        restart (issue 19). Read here, the stored ones that are still right are not written again,
        and those of jobs no longer waiting are deleted."""
        if self._reasons_read and fence == self._reasons_fence:
            return
        stored = await self._store.list_wait_reasons()
        self._written_reasons = {job_id: (_READ_FROM_STORE, reasons) for job_id, reasons in stored.items()}
        self._reasons_read, self._reasons_fence = True, fence
        self._last_waits = None

    def _reasons_to_write(
        self,
        waiting: Sequence[Waiting],
        between: Callable[[], None],
        maybe_left: Collection[JobId] | None = None,
        queued: Container[JobId] = (),
        admitted: Container[JobId] = (),
        most: int | None = None,
    ) -> tuple[list[_ReasonsWrite], list[JobId]]:
        """The waits whose reasons differ from those written, each with its stored bytes, and the
        jobs no longer waiting; at most `most` waits (None: no bound): the waits past them that may
        differ are not looked at, and their number is left in `reasons_unread` (the next cycles look
        at them again).

        Waits with equal keys have equal reasons (`Waiting.key`), whoever waits: each key's reasons
        are worded and encoded once, and that one tuple is what every such job keeps as written
        (a deep queue waits for a handful of reasons: a tuple of 50 reasons a job, and its JSON,
        was most of a first pass's CPU and a third of the memory per queued job).

        Each key value has one object kept as written (`_canonical_keys`): a job whose written key is
        the one object of its wait's key value waits as written, which is found for every waiting job
        by C-level calls (the placer makes new keys and waits each cycle: a job-by-job comparison of
        keys cost 0.4 µs a waiting job). Only the others are compared, as before.

        The jobs no longer waiting are looked for among `maybe_left` (with those that left the queue
        since the last cycle, and those `admitted`: a job in `queued` and not admitted waits), not by
        a walk of every written entry; a walk is the fallback when they do not account for every
        written job that does not wait (after a new term's read of the store, or without
        `maybe_left`)."""
        written = self._written_reasons
        found = self._aligned_with_last(waiting, between)
        if found is None:
            self.waits_compared += len(waiting)
            ids, canonical, uniform = self._canonical_of(waiting, between)
            self._these_waits = _WaitsWritten(ids, canonical, uniform, waiting)
            todo, with_written = self._unlike_written(ids, canonical, uniform, between)
        else:
            ids, canonical, todo, with_written = found
        # Keyed by the key objects' identities, each entry holding its objects (so no id is reused
        # during the walk): a key is a tuple of the figures of every cluster, whose comparison and
        # hash cost more, job by job, than the rest of the walk.
        same_keys: dict[tuple[int, int], tuple[Hashable, Hashable, bool]] = {}
        # Each key's reasons, worded once, and their stored bytes (keys are the canonical objects).
        by_key_id: dict[int, _Worded] = {}
        # Whether a tuple written (by identity: the store's reads share them) equals a key's reasons.
        equal: dict[tuple[int, int], tuple[tuple[WaitReason, ...], _Worded, bool]] = {}
        changed: list[_ReasonsWrite] = []
        self.reasons_unread = 0
        self._unread_places = []
        for index, at in enumerate(todo):
            if most is not None and len(changed) >= most:
                # A cycle writes at most `most` (`WAIT_WRITES_PER_CYCLE`): the rest would be made into
                # writes only to be dropped. A new leader over a million queued jobs, none with
                # reasons written, made a million a cycle for about 60 cycles. Their places are kept
                # with this cycle's waits (`_waits_written`): the next cycle compares them again.
                self.reasons_unread = len(todo) - index
                self._unread_places = todo[index:]
                break
            w, key = waiting[at], canonical[at]
            old = written.get(ids[at], _UNWRITTEN)
            if old is not _UNWRITTEN:
                old_key = old[0]
                pair = (id(old_key), id(key))
                hit = same_keys.get(pair)
                if hit is None:
                    hit = same_keys[pair] = (old_key, key, old_key == key)
                if hit[2]:
                    # Equal keys, equal reasons: not even worded; the one object kept from now on.
                    written[w.job_id] = (key, old[1])
                    continue
            words = by_key_id.get(id(key))
            if words is None:
                words = by_key_id[id(key)] = _Worded(w.reasons)
            if old is not _UNWRITTEN:
                pair = (id(old[1]), id(words))
                same = equal.get(pair)
                if same is None:
                    same = equal[pair] = (old[1], words, old[1] == words.reasons)
                if same[2]:
                    written[w.job_id] = (key, old[1])
                    continue
            if words.value is None:
                words.value = encode_wait_reasons(words.reasons, compressed=self._store.compress_wait_reasons)
            changed.append(_ReasonsWrite(w.job_id, key, words.reasons, words.value))
        # A job that stopped waiting (admitted or cancelled) has no reasons any more: they are deleted, so
        # that etcd does not keep one stale key per job ever queued. (Entries are replaced above, never
        # added, so `with_written` counts distinct written jobs while the waits name each job once.)
        not_waiting = len(written) - with_written
        if not not_waiting:
            return changed, []
        if maybe_left is not None:
            left = [
                job_id
                for job_id in maybe_left
                if job_id in written and (job_id not in queued or job_id in admitted)
            ]
            # A waiting job is queued and not admitted, so each found does not wait: as many as there
            # are is all of them.
            if len(left) == not_waiting:
                return changed, left
        still_waiting = set(ids)
        left = [job_id for job_id in written if job_id not in still_waiting]
        return changed, left

    def _canonical_of(
        self, waiting: Sequence[Waiting], between: Callable[[], None]
    ) -> tuple[list[JobId], list[Hashable], Hashable | None]:
        """The waiting jobs' ids, each wait's key as its value's one object (`_canonical_keys`), and
        that object if every wait has it."""
        ids: list[JobId] = []
        keys: list[Hashable] = []
        for run in _runs(waiting, _RUN, between):
            ids += map(_JOB_ID, run)
            keys += map(_KEY, run)
        # Each distinct key object (a deep queue's waits share a few hundred) to its value's one object.
        key_ids: list[int] = []
        distinct: dict[int, Hashable] = {}
        for start, stop in _spans(0, len(keys), between):
            some = list(map(id, keys[start:stop]))
            key_ids += some
            distinct.update(zip(some, keys[start:stop], strict=True))
        canonical_keys = self._canonical_keys
        to_canonical = {key_id: canonical_keys.setdefault(key, key) for key_id, key in distinct.items()}
        if len(canonical_keys) > 4 * len(to_canonical) + 1024:
            # Values no wait has now: forgotten (an entry written with one is compared as before).
            self._canonical_keys = {key: key for key in to_canonical.values()}
        uniform: Hashable | None = None
        if len(to_canonical) == 1:
            uniform = next(iter(to_canonical.values()))
            canonical = [uniform] * len(ids)
        else:
            canonical = []
            for start, stop in _spans(0, len(keys), between):
                canonical += map(to_canonical.__getitem__, key_ids[start:stop])
        return ids, canonical, uniform

    def _aligned_with_last(
        self, waiting: Sequence[Waiting], between: Callable[[], None]
    ) -> tuple[list[JobId], list[Hashable], list[int], int] | None:
        """`_canonical_of` and `_unlike_written` together, by the waits' identity with the last
        cycle's (None: too few of them are, or no last cycle's are kept).

        The placer hands the waits of a deep queue's unchanged stretches on from plan to plan
        (`placement.stretch_carry`): a wait that is the very object the last cycle wrote is for
        the same job with the same key, so its reasons are written as they are. Runs of such waits
        are found by C-level comparisons of the two lists (`_aligned`), and only the places between
        them are read: each wait's id and key (the key a Python-level property, 0.1 µs a wait read
        for every waiting job, half of this comparison) and the written map. The ids and keys of the
        runs are the last cycle's, kept in place for the next cycle's comparison."""
        last = self._last_waits
        if last is None or not last.waits or len(self._canonical_keys) > _CANONICAL_MOST:
            return None
        runs, compared = _aligned(waiting, last.waits, between)
        self.waits_compared += compared
        if runs is None or 2 * sum(stop - start for start, stop, _ in runs) < len(waiting):
            return None
        self._last_waits = None
        loose: list[int] = []
        loose_waits: list[Waiting] = []
        at = 0
        for start, stop in [*((start, stop) for start, stop, _ in runs), (len(waiting), len(waiting))]:
            if start > at:
                # Read span by span: chunked waits are read from the chunks that hold them.
                loose += range(at, start)
                loose_waits += waiting[at:start]
            at = stop
        loose_ids = [w.job_id for w in loose_waits]
        loose_keys = [w.key for w in loose_waits]
        canonical_keys = self._canonical_keys
        to_canonical = {id(key): canonical_keys.setdefault(key, key) for key in loose_keys}
        loose_canonical = [to_canonical[id(key)] for key in loose_keys]
        # The last cycle's lists, each stretch between two runs replaced by this cycle's places there,
        # from the last stretch back (a move of the lists' tails each, where a copy of the runs touched
        # every job's id, 10 to 20 ms at a million). They are the last cycle's, which no one else holds.
        ids, canonical = last.ids, last.canonical
        stretches: list[tuple[int, int, int, int]] = []
        taken = at = from_at = 0
        for start, stop, from_last in runs:
            stretches.append((from_at, from_last, taken, taken + start - at))
            taken += start - at
            at, from_at = stop, from_last + stop - start
        stretches.append((from_at, len(ids), taken, len(loose)))
        for from_start, from_stop, loose_start, loose_stop in reversed(stretches):
            ids[from_start:from_stop] = loose_ids[loose_start:loose_stop]
            canonical[from_start:from_stop] = loose_canonical[loose_start:loose_stop]
        uniform = last.uniform
        if uniform is not None and any(key is not uniform for key in to_canonical.values()):
            uniform = None
        self._these_waits = _WaitsWritten(ids, canonical, uniform, waiting)
        # As `_unlike_written` does for the stretch it looks up: the runs' reasons are written.
        written = self._written_reasons
        todo: list[int] = []
        with_written = len(waiting) - len(loose)
        for place, job_id, key in zip(loose, loose_ids, loose_canonical, strict=True):
            old_key = written.get(job_id, _UNWRITTEN)[0]
            if old_key is not _NOT_WRITTEN:
                with_written += 1
            if old_key is not key:
                todo.append(place)
        if last.unwritten:
            # The last cycle's places left unwritten that the runs carry: compared as those between
            # the runs are (the loose places are not in a run, so none is twice).
            unwritten = _through_runs(last.unwritten, runs)
            with_written -= _not_written(written, ids, unwritten)
            todo = sorted(todo + unwritten)
        return ids, canonical, todo, with_written

    def _unlike_written(
        self,
        ids: list[JobId],
        canonical: list[Hashable],
        uniform: Hashable | None,
        between: Callable[[], None],
    ) -> tuple[list[int], int]:
        """The places of the waits whose written key is not their key's one object (or with none
        written), and how many waits have reasons written.

        Where the waiting jobs are the last cycle's in the same places (the placer's order moves
        little between cycles: a submission is a wait put in, an admission one taken out), what is
        written for them is the last cycle's keys, place by place, so the two lists are compared by
        C-level calls; only the stretch between the first and the last place where the jobs differ
        is looked up job by job (a lookup in the written map of a million cost 0.1 µs a job). In
        runs of `_RUN` places with `between` before each: a C-level pass holds the GIL throughout."""
        written = self._written_reasons
        last, self._last_waits = self._last_waits, None
        size = len(ids)
        head = tail = 0
        todo: list[int] = []
        if last is not None:
            # The jobs in the same places from the start, and from the end (within what is left).
            both = min(size, len(last.ids))
            head = _same_for(ids, last.ids, both, between)
            tail = _same_for(ids, last.ids, both - head, between, from_end=True)
            if uniform is None or uniform is not last.uniform:
                for start, stop in _spans(0, head, between):
                    unlike = map(is_not, canonical[start:stop], last.canonical[start:stop])
                    todo += compress(range(start, stop), unlike)
        middle = size - tail
        with_written = head + tail
        for start, stop in _spans(head, middle, between):
            olds = list(map(written.get, ids[start:stop], repeat(_UNWRITTEN)))
            old_keys = list(map(_FIRST, olds))
            todo += compress(range(start, stop), map(is_not, old_keys, canonical[start:stop]))
            with_written += len(old_keys) - old_keys.count(_NOT_WRITTEN)
        if tail and last is not None and (uniform is None or uniform is not last.uniform):
            shift = len(last.ids) - size
            for start, stop in _spans(middle, size, between):
                unlike = map(is_not, canonical[start:stop], last.canonical[start + shift : stop + shift])
                todo += compress(range(start, stop), unlike)
        if last is not None and last.unwritten:
            # The last cycle's places left unwritten in the head and the tail matched (the middle is
            # looked up): compared too, once each.
            runs = [(0, head, 0), (size - tail, size, len(last.ids) - tail)]
            unwritten = _through_runs(last.unwritten, runs)
            with_written -= _not_written(written, ids, unwritten)
            todo = sorted(set(todo).union(unwritten))
        return todo, with_written

    def _waits_written(self, unwritten: Sequence[int] = ()) -> None:
        """This cycle's reasons are written but at the places `unwritten` (ascending): the next cycle
        compares its waits with these, and those places again."""
        these, self._these_waits = self._these_waits, None
        self._last_waits = these if these is None or not unwritten else replace(these, unwritten=unwritten)

    async def _write_reasons(
        self,
        waiting: Sequence[Waiting],
        fence: Fence | None,
        semaphore: asyncio.Semaphore,
        planned: _Planned | None = None,
    ) -> int:
        """Write the reasons that changed, at most WAIT_WRITES_PER_CYCLE jobs' (in the placer's
        order of the waiting jobs); returns how many are left for the next cycles."""
        await self._read_written_reasons(fence)
        maybe_left: set[JobId] | None = None
        admitted: set[JobId] = set()
        if planned is not None and planned.departed is not None:
            maybe_left = self._maybe_left
            maybe_left |= planned.departed
            admitted = {a.job_id for a in planned.plan.admissions}
            maybe_left |= admitted
        # Comparing every waiting job's reasons walks the whole queue: on the worker thread, so that
        # API calls are not held up behind it. Only this cycle touches `_written_reasons`.
        changed, left = await asyncio.to_thread(
            self._reasons_to_write,
            waiting,
            StepAside(self._metrics),
            maybe_left,
            () if planned is None else planned.queued_ids,
            admitted,
            WAIT_WRITES_PER_CYCLE,
        )
        # At most WAIT_WRITES_PER_CYCLE jobs: the rest are found changed again by the next cycle,
        # which the idle gate does not skip. Many jobs to a fenced transaction
        # (`put_encoded_wait_reasons`), not one each.
        later = max(0, len(changed) + len(left) - WAIT_WRITES_PER_CYCLE) + self.reasons_unread
        changed = changed[:WAIT_WRITES_PER_CYCLE]
        # Those not deleted this cycle are looked for again in the next.
        self._maybe_left = set(left[WAIT_WRITES_PER_CYCLE - len(changed) :])
        left = left[: WAIT_WRITES_PER_CYCLE - len(changed)]
        values: list[tuple[JobId, bytes | None]] = [(c.job_id, c.value) for c in changed]
        values += [(job_id, None) for job_id in left]
        done = {c.job_id: (c.key, c.reasons) for c in changed}

        in_flight = asyncio.Semaphore(WAIT_WRITES_IN_FLIGHT)

        async def write(run: list[tuple[JobId, bytes | None]]) -> None:
            async with in_flight, semaphore:
                await self._store.put_encoded_wait_reasons(run, fence=fence)
            for job_id, value in run:
                if value is None:
                    del self._written_reasons[job_id]
                else:
                    self._written_reasons[job_id] = done[job_id]

        await asyncio.gather(*(write(run) for run in cut_wait_writes(values)))
        if not later:
            self._waits_written()
        elif self._unread_places:
            # Every write made was sent (a cycle makes no more than it sends); the waits past the bound
            # are left: kept with their places, so that the next cycle compares those and the waits
            # that changed, not every wait (a new leader's first writing, about 60 cycles at a million).
            self._waits_written(self._unread_places)
        return later


@dataclass(frozen=True, slots=True)
class _WaitsWritten:
    """A cycle's waiting jobs in the placer's order, and the one object of each one's wait key: what
    is written for each once the cycle's writes are done (`Scheduler._unlike_written`)."""

    ids: list[JobId]
    canonical: list[Hashable]
    # The one key object of every wait, if they share one.
    uniform: Hashable | None
    # The waits themselves: a wait of the next cycle that is one of these objects is for the same job
    # with the same key (the placer hands a deep queue's unchanged waits on, `placement.stretch_carry`).
    waits: Sequence[Waiting] = ()
    # The places (ascending) whose reasons were left unwritten past the cycle's bound on writes: what
    # is written for those jobs is not `canonical`'s, and the next cycle compares them again.
    unwritten: Sequence[int] = ()


@dataclass(slots=True)
class _Worded:
    """One wait's reasons, worded once for every job that waits for them, and their stored bytes."""

    reasons: tuple[WaitReason, ...]
    value: bytes | None = None


@dataclass(frozen=True, slots=True)
class _ReasonsWrite:
    """A waiting job's reasons to write: the wait's key, its reasons and their stored bytes."""

    job_id: JobId
    key: Hashable
    reasons: tuple[WaitReason, ...]
    value: bytes
