"""Jobs in list order by tenant and by phase, so that a read costs what its caller may see.

`ListJobs` and `WatchJobs(include_initial)` used to scan and sort every job of every tenant before
filtering: once bob had submitted 20,000 jobs, alice's list of her 83 fell from 474 to 168 calls a
second and its p99 rose from 162 ms to 1.1 s. The job cache keeps this index current through every
watch event and relist; a read walks only the entries of the caller's tenant (and phases), in list
order from where its page starts.

The list order is (submitted_at_s, job_id): fixed for a job's whole life, so a job changing phase
moves between phase entries but never within the order.
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from collections.abc import Iterable, Iterator

from federation.store.job_store import Stored
from federation.store.jobs import JobRecord
from placement.model import JobId, JobPhase, TenantId

ListKey = tuple[float, str]


def list_key(job: JobRecord) -> ListKey:
    """Where a job sorts in a listing: oldest submission first, job id to break ties."""
    return (job.submitted_at_s, job.job_id)


# Where a job is filed: its list key, tenant and phase.
Filing = tuple[ListKey, TenantId, JobPhase]


def _filed_job_id(entry: tuple[Filing, Stored[JobRecord]]) -> str:
    return entry[0][0][1]


def _filed_submitted_at(entry: tuple[Filing, Stored[JobRecord]]) -> float:
    return entry[0][0][0]


# Keys per chunk of a view: a chunk is split at twice this. An insert or remove moves at most a
# chunk's keys, not the view's: a flat list of a million queued jobs moved 8 MB of pointers for each
# job leaving the queue, a millisecond of the event loop each, four views a change.
CHUNK_KEYS = 1000


class _Ordered:
    """List keys in order: insert and remove by bisection, read forward or back from a key. The
    records are looked up by job id in the index's one map (`items`), shared by every view: a map
    per view was four maps of every job, a quarter of the index's rebuild at a restart.

    The keys are kept in sorted chunks of about `CHUNK_KEYS` (as `sortedcontainers.SortedList`
    does), each with its last key in `_lasts`: a change costs two bisections and moving one chunk's
    keys, whatever the view's length."""

    __slots__ = ("_chunks", "_items", "_lasts", "_len")

    def __init__(self, items: dict[JobId, Stored[JobRecord]], keys: list[ListKey] | None = None) -> None:
        """`keys`, if given, sorted and distinct."""
        self._items = items
        ordered = [] if keys is None else keys
        self._chunks: list[list[ListKey]] = [
            ordered[i : i + CHUNK_KEYS] for i in range(0, len(ordered), CHUNK_KEYS)
        ]
        self._lasts: list[ListKey] = [chunk[-1] for chunk in self._chunks]
        self._len = len(ordered)

    def __len__(self) -> int:
        return self._len

    def keys(self) -> list[ListKey]:
        """Every key in order (tests)."""
        return [key for chunk in self._chunks for key in chunk]

    def put(self, key: ListKey) -> None:
        chunks, lasts = self._chunks, self._lasts
        if not chunks:
            chunks.append([key])
            lasts.append(key)
            self._len = 1
            return
        if key > lasts[-1]:
            # Past every key, as most new jobs are (the list key is the submission time): the
            # last chunk's end, without the two bisections.
            c = len(chunks) - 1
            chunk = chunks[c]
            chunk.append(key)
        else:
            c = bisect.bisect_left(lasts, key)
            chunk = chunks[c]
            i = bisect.bisect_left(chunk, key)
            if chunk[i] == key:
                return
            chunk.insert(i, key)
        self._len += 1
        if len(chunk) > 2 * CHUNK_KEYS:
            chunks[c : c + 1] = [chunk[:CHUNK_KEYS], chunk[CHUNK_KEYS:]]
            lasts[c : c + 1] = [chunk[CHUNK_KEYS - 1], chunk[-1]]
        else:
            lasts[c] = chunk[-1]

    def remove(self, key: ListKey) -> None:
        chunks, lasts = self._chunks, self._lasts
        c = bisect.bisect_left(lasts, key)
        if c == len(chunks):
            return
        chunk = chunks[c]
        i = bisect.bisect_left(chunk, key)
        if i == len(chunk) or chunk[i] != key:
            return
        del chunk[i]
        self._len -= 1
        if not chunk:
            del chunks[c]
            del lasts[c]
            return
        lasts[c] = chunk[-1]
        if len(chunk) < CHUNK_KEYS // 4 and len(chunks) > 1:
            # A chunk emptied by removals joins a neighbour, so that a view that shrank is not
            # many tiny chunks (split again if the two are over the bound).
            left = c - 1 if c > 0 else c
            joined = chunks[left] + chunks[left + 1]
            if len(joined) > 2 * CHUNK_KEYS:
                half = len(joined) // 2
                chunks[left : left + 2] = [joined[:half], joined[half:]]
                lasts[left : left + 2] = [joined[half - 1], joined[-1]]
            else:
                chunks[left : left + 2] = [joined]
                lasts[left : left + 2] = [joined[-1]]

    def after(self, start: ListKey | None) -> Iterator[tuple[ListKey, Stored[JobRecord]]]:
        """Entries past `start` (all when None), in order. Read it to the end before the index changes."""
        chunks, items = self._chunks, self._items
        if start is None:
            c, i = 0, 0
        else:
            c = bisect.bisect_right(self._lasts, start)
            i = bisect.bisect_right(chunks[c], start) if c < len(chunks) else 0
        while c < len(chunks):
            chunk = chunks[c]
            while i < len(chunk):
                key = chunk[i]
                yield key, items[JobId(key[1])]
                i += 1
            c += 1
            i = 0

    def before(self, start: ListKey | None) -> Iterator[tuple[ListKey, Stored[JobRecord]]]:
        """Entries before `start` (all when None), latest first. Read it to the end before the index
        changes."""
        chunks, items = self._chunks, self._items
        if start is None or (c := bisect.bisect_left(self._lasts, start)) == len(chunks):
            c = len(chunks) - 1
            i = len(chunks[c]) if chunks else 0
        else:
            i = bisect.bisect_left(chunks[c], start)
        while c >= 0:
            chunk = chunks[c]
            while i > 0:
                i -= 1
                key = chunk[i]
                yield key, items[JobId(key[1])]
            c -= 1
            if c >= 0:
                i = len(chunks[c])


class JobIndex:
    """Every job, ordered, under four views: all, by tenant, by phase, by tenant and phase."""

    def __init__(self) -> None:
        # Every job by id: the one map the views read their records from.
        self._items: dict[JobId, Stored[JobRecord]] = {}
        self._all = _Ordered(self._items)
        self._by_tenant: dict[TenantId, _Ordered] = {}
        self._by_phase: dict[JobPhase, _Ordered] = {}
        self._by_tenant_phase: dict[tuple[TenantId, JobPhase], _Ordered] = {}
        # Where each job is filed, to take it out of the right entries when it changes or goes.
        self._filed: dict[JobId, Filing] = {}

    def __len__(self) -> int:
        return len(self._all)

    def count(self, tenant: TenantId | None, phase: JobPhase) -> int:
        """How many jobs of `tenant` (None: every tenant) are in `phase`: the length of one view, kept
        as it changes, so a submission's queue limit costs no walk of the queue."""
        view = self._by_phase.get(phase) if tenant is None else self._by_tenant_phase.get((tenant, phase))
        return 0 if view is None else len(view)

    def rebuild(self, jobs: Iterable[Stored[JobRecord]]) -> None:
        """The index of `jobs` (distinct jobs, as a list gives them)."""
        self.rebuild_filed(((list_key(s.value), s.value.tenant, s.value.phase), s) for s in jobs)

    def rebuild_filed(self, entries: Iterable[tuple[Filing, Stored[JobRecord]]]) -> None:
        """The index of distinct jobs, each with where it is filed (its list key, tenant and phase,
        as `list_key` and its record say), so that a job whose record is decoded only when read
        (`Stored.decoded_on_read`) is filed without being decoded.

        Sorted once, all of them, then dealt out to the views in that order, so each view is born
        sorted: sorting each view on its own sorted every job four times (a quarter of a restart's
        listing, at 100,000 jobs).

        The sort is by the list key, (submission time, job id), done as two stable sorts: by job id,
        then by submission time alone, a float, which `list.sort` compares several times faster than
        a tuple (a fifth of the rebuild at 100,000 jobs). A list from etcd comes in key order, which
        is job id order, so the first sort finds it sorted at one comparison per job."""
        every = list(entries)
        every.sort(key=_filed_job_id)
        every.sort(key=_filed_submitted_at)
        items: dict[JobId, Stored[JobRecord]] = {}
        by_tenant: dict[TenantId, list[ListKey]] = defaultdict(list)
        by_phase: dict[JobPhase, list[ListKey]] = defaultdict(list)
        by_both: dict[tuple[TenantId, JobPhase], list[ListKey]] = defaultdict(list)
        filed: dict[JobId, Filing] = {}
        for filing, stored in every:
            key, tenant, phase = filing
            job_id = JobId(key[1])
            items[job_id] = stored
            filed[job_id] = filing
            by_tenant[tenant].append(key)
            by_phase[phase].append(key)
            by_both[(tenant, phase)].append(key)
        self._items = items
        self._all = _Ordered(items, [filing[0] for filing, _ in every])
        self._by_tenant = {tenant: _Ordered(items, keys) for tenant, keys in by_tenant.items()}
        self._by_phase = {phase: _Ordered(items, keys) for phase, keys in by_phase.items()}
        self._by_tenant_phase = {both: _Ordered(items, keys) for both, keys in by_both.items()}
        self._filed = filed

    def put(self, stored: Stored[JobRecord]) -> None:
        """File a new job, or a job's new record. Most of a job's writes keep where it is filed
        (its list key and tenant never change, its phase only now and then): such a record only
        replaces the old one in the map. A phase change moves the job between its two phase views;
        its place in the views of all jobs and of its tenant stays. Every view was taken out and put
        back at each write: about 40 % of a job cache's CPU for a watched write (issue 33)."""
        job = stored.value
        job_id = job.job_id
        tenant, phase = job.tenant, job.phase
        filed = self._filed.get(job_id)
        self._items[job_id] = stored
        if filed is not None:
            key, was_tenant, was_phase = filed
            if was_tenant == tenant and key == list_key(job):
                if was_phase == phase:
                    return
                self._filed[job_id] = (key, tenant, phase)
                self._leave_phase(key, tenant, was_phase)
                self._phase_views(tenant, phase, key)
                return
            self._unfile(job_id)
        key = list_key(job)
        self._filed[job_id] = (key, tenant, phase)
        by_tenant = self._by_tenant.get(tenant)
        if by_tenant is None:
            by_tenant = self._by_tenant[tenant] = _Ordered(self._items)
        self._all.put(key)
        by_tenant.put(key)
        self._phase_views(tenant, phase, key)

    def remove(self, job_id: JobId) -> None:
        if self._unfile(job_id):
            del self._items[job_id]

    def _unfile(self, job_id: JobId) -> bool:
        """The job out of every view it is filed in (its record stays in the map); False if it
        was not filed."""
        filed = self._filed.pop(job_id, None)
        if filed is None:
            return False
        key, tenant, phase = filed
        self._all.remove(key)
        by_tenant = self._by_tenant[tenant]
        by_tenant.remove(key)
        # Drop emptied entries: tenants and phases come and go, the index should not keep them all.
        if not by_tenant:
            del self._by_tenant[tenant]
        self._leave_phase(key, tenant, phase)
        return True

    def _phase_views(self, tenant: TenantId, phase: JobPhase, key: ListKey) -> None:
        """`key` into the views of `phase` and of `tenant` in `phase`, made when missing."""
        by_phase = self._by_phase.get(phase)
        if by_phase is None:
            by_phase = self._by_phase[phase] = _Ordered(self._items)
        both = self._by_tenant_phase.get((tenant, phase))
        if both is None:
            both = self._by_tenant_phase[(tenant, phase)] = _Ordered(self._items)
        by_phase.put(key)
        both.put(key)

    def _leave_phase(self, key: ListKey, tenant: TenantId, phase: JobPhase) -> None:
        """`key` out of the views of `phase` and of `tenant` in `phase`, emptied views dropped."""
        by_phase = self._by_phase[phase]
        by_phase.remove(key)
        if not by_phase:
            del self._by_phase[phase]
        both = self._by_tenant_phase[(tenant, phase)]
        both.remove(key)
        if not both:
            del self._by_tenant_phase[(tenant, phase)]

    def ordered(
        self,
        tenant: TenantId | None = None,
        phases: Iterable[JobPhase] = (),
        after: ListKey | None = None,
        *,
        newest_first: bool = False,
    ) -> Iterator[Stored[JobRecord]]:
        """Jobs of `tenant` (None: every tenant) in `phases` (empty: any), in list order past `after`
        (`newest_first`: in reverse order, from before `after`).

        Costs the entries walked: a page of a tenant's jobs reads that tenant's entries, not others'.
        Consume it before the index next changes (no await in between).
        """
        wanted = sorted(set(phases))
        sources: list[_Ordered] = []
        if not wanted:
            found = self._all if tenant is None else self._by_tenant.get(tenant)
            if found is not None:
                sources.append(found)
        else:
            for phase in wanted:
                found = (
                    self._by_phase.get(phase)
                    if tenant is None
                    else self._by_tenant_phase.get((tenant, phase))
                )
                if found is not None:
                    sources.append(found)
        walks = [s.before(after) if newest_first else s.after(after) for s in sources]
        if len(walks) == 1:
            for _, stored in walks[0]:
                yield stored
            return
        for _, stored in heapq.merge(*walks, key=lambda item: item[0], reverse=newest_first):
            yield stored
