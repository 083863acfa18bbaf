"""The fair order's per-tenant lists carried from one cycle's plan to the next (issue 33).

Each plan grouped the queue by tenant and sorted each tenant's gangs by priority, then queue time and
job id (`fairshare.tenant_lists`): at a million queued, a pass that reads every gang (100 to 200 ns a
gang spread through memory) and a sort of each tenant's, about a fifth of a steady cycle. From one
cycle to the next the queue changes by a few gangs, and the scheduler's carried queue
(`federation.scheduling.snapshot.GangRequests.carry`) keeps its requests' objects and their order
but for those: a changed job's request moves to the end.

So `QueueCarry` keeps the last plan's queue and lists. The scheduler's carried queue says what
changed itself (`queue_chunks.ChunkedQueue`: the requests taken out and put in since the queue handed
before it), and when that queue is the one the last plan read, those edits are the changes, and no
gang of the queue is read to find them. Otherwise the next queue is compared with the last one gang by
gang, by identity, in a compiled loop (about 3 ns a gang, 14 to 18 ms at a million): the gangs of the
last queue not matched, in order, by the next are taken out of their tenants' lists, and the next
queue's gangs left past the end of the match are put in. Either way each is put in or taken out by
bisection. The result is the lists of the next queue
whatever it is (the gangs taken out and put in make the one queue from the other as collections);
only an edit of more than `1 / _EDIT_SHARE` of the queue, or a queue time that is not a number (no
order to bisect by), makes them afresh. A tenant whose gangs did not change keeps its list object, which
the stretches' carry (`stretch_carry`) then need not compare. Lists are never changed once handed out:
an edited tenant's list is a copy.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Final

from placement.fairshare import tenant_lists
from placement.model import GangRequest, TenantId
from placement.queue_chunks import ChunkedQueue

# At most this share of the queue (1 in `_EDIT_SHARE`) taken out or put in, or `_EDIT_LEAST`, is
# edited: each edit is a bisection and a move of its tenant's list.
_EDIT_SHARE: Final = 8
_EDIT_LEAST: Final = 64
# Places compared between two calls of the caller's `between` (`_changes`): a millisecond or two.
_BETWEEN_EVERY: Final = 1 << 16


def _fair_key(gang: GangRequest) -> tuple[int, float, str]:
    """A tenant's order (`fairshare.tenant_lists`): priority, highest first, then queue time and id."""
    return -gang.priority, gang.queued_at_s, gang.job_id


_FAIR_KEY: Final = _fair_key


class QueueCarry:
    """The last plan's queue, its per-tenant lists in the fair order's own order, and its gangs
    counted per decision key object (`plan._Cycle`'s kinds)."""

    __slots__ = (
        "_counts",
        "_counts_of",
        "_inserted",
        "_lists",
        "_lists_of",
        "_previous",
        "_queued",
        "_removed",
        "_samples",
        "compared",
        "counts_carried",
        "edited",
        "edits_taken",
        "made_afresh",
    )

    def __init__(self) -> None:
        # This plan's queue and the last one's, and the gangs of the last not in this one and of this
        # one not in the last (None: too many, or not looked for).
        self._queued: Sequence[GangRequest] = ()
        self._previous: Sequence[GangRequest] | None = None
        self._removed: list[GangRequest] | None = None
        self._inserted: list[GangRequest] | None = None
        # The lists, and the queue they are of (None: none kept, or a time that is not a number).
        self._lists: dict[TenantId, list[GangRequest]] = {}
        self._lists_of: Sequence[GangRequest] | None = None
        # The gangs per key object's id and a gang of each (which keeps the object, so no id is
        # reused while counted), and the queue they are of (None: none kept).
        self._samples: dict[int, GangRequest] = {}
        self._counts: dict[int, int] = {}
        self._counts_of: Sequence[GangRequest] | None = None
        # Plans whose lists were edited from the last, and made afresh, and whose counts were carried
        # (for tests and benchmarks).
        self.edited = 0
        # Plans whose changes were the scheduler's edits (`queue_chunks.ChunkedQueue`), and the
        # queues' gangs compared place by place to find them otherwise (`_changes`, the two queues'
        # lengths): a steady cycle over the scheduler's carried queue compares none (for tests and
        # benchmarks).
        self.edits_taken = 0
        self.compared = 0
        self.made_afresh = 0
        self.counts_carried = 0

    def begin(self, queued: Sequence[GangRequest], between: Callable[[], None] | None = None) -> None:
        """A plan over `queued` starts: what differs from the last plan's queue is found once: the
        scheduler's edits if `queued` was made from that queue by them (`ChunkedQueue`), else by
        comparing the two (`between` every `_BETWEEN_EVERY` gangs compared)."""
        self._previous, self._queued = self._queued, queued
        self._removed = self._inserted = None
        previous = self._previous
        if previous is not None and (self._lists_of is previous or self._counts_of is previous):
            edits = queued.edits_from(previous) if isinstance(queued, ChunkedQueue) else None
            if edits is not None:
                removed, inserted = edits
                self.edits_taken += 1
                if len(removed) + len(inserted) <= max(_EDIT_LEAST, len(queued) // _EDIT_SHARE):
                    self._removed, self._inserted = list(removed), list(inserted)
                return
            self.compared += len(previous) + len(queued)
            changes = _changes(_as_tuple(previous), _as_tuple(queued), between)
            if changes is not None:
                self._removed, self._inserted = changes

    def tenant_lists(self) -> dict[TenantId, list[GangRequest]]:
        """Each tenant's gangs of this plan's queue in order, as `fairshare.tenant_lists` makes them.
        The lists are the caller's to read, never to change."""
        queued, lists = self._queued, None
        kept, kept_of = self._lists, self._lists_of
        # Forgotten first: a plan that fails half-way leaves nothing half-edited.
        self._lists, self._lists_of = {}, None
        if kept_of is self._previous and self._removed is not None and self._inserted is not None:
            lists = _edited(kept, self._removed, self._inserted)
        if lists is None:
            lists, numbers = tenant_lists(queued)
            self.made_afresh += 1
            if numbers:
                self._lists, self._lists_of = lists, queued
        else:
            self.edited += 1
            self._lists, self._lists_of = lists, queued
        return lists

    def kind_counts(self) -> tuple[dict[int, GangRequest], dict[int, int]] | None:
        """This plan's queue counted per decision key object, from the last plan's counts (see
        `keep_kind_counts`): a gang of each object by its id, and the gangs of each; None if none
        are kept of the last plan's queue or too much changed. The caller reads them, and may keep
        them for the next plan (`keep_kind_counts`)."""
        samples, counts = self._samples, self._counts
        kept_of = self._counts_of
        self._samples, self._counts, self._counts_of = {}, {}, None
        if kept_of is not self._previous or self._removed is None or self._inserted is None:
            return None
        for gang in self._removed:
            key_id = id(gang.decision_key)
            left = counts.get(key_id, 0) - 1
            if left < 0:
                return None
            if left:
                counts[key_id] = left
            else:
                del counts[key_id]
                del samples[key_id]
        for gang in self._inserted:
            key_id = id(gang.decision_key)
            counts[key_id] = counts.get(key_id, 0) + 1
            if key_id not in samples:
                samples[key_id] = gang
        self.counts_carried += 1
        return samples, counts

    def keep_kind_counts(self, samples: dict[int, GangRequest], counts: dict[int, int]) -> None:
        """This plan's queue counted per decision key object (every object's count, each held by
        its gang in `samples`), for the next plan: the caller no longer changes them."""
        self._samples, self._counts, self._counts_of = samples, counts, self._queued


def _as_tuple(queued: Sequence[GangRequest]) -> tuple[GangRequest, ...]:
    if isinstance(queued, tuple):
        return queued
    if isinstance(queued, ChunkedQueue):
        return queued.as_tuple()
    return tuple(queued)


def _changes(
    last: tuple[GangRequest, ...],
    queued: tuple[GangRequest, ...],
    between: Callable[[], None] | None = None,
) -> tuple[list[GangRequest], list[GangRequest]] | None:
    """The gangs of `last` that `queued` does not match in order, and those of `queued` past the
    match; None if they are more than `1 / _EDIT_SHARE` of the queue. Taking the first out of `last`
    and putting the second in gives `queued` as a collection, whatever the two are. (Tuples, which
    the compiled loop reads directly: read as any sequence, each item was a generic call, 35 ns.)"""
    most = max(_EDIT_LEAST, len(queued) // _EDIT_SHARE)
    removed: list[GangRequest] = []
    i, j, size, count = 0, 0, len(last), len(queued)
    # A compiled loop holds the GIL to its end: at a million queued, 14 to 18 ms in which no API call
    # could run, so `between` is called every `_BETWEEN_EVERY` places (a turn for the event loop).
    pause = _BETWEEN_EVERY
    while i < size and j < count:
        if i >= pause:
            pause += _BETWEEN_EVERY
            if between is not None:
                between()
        if last[i] is queued[j]:
            i += 1
            j += 1
        else:
            removed.append(last[i])
            i += 1
            if len(removed) > most:
                return None
    if len(removed) + (size - i) + (count - j) > most:
        return None
    while i < size:
        removed.append(last[i])
        i += 1
    return removed, list(queued[j:])


def _edited(
    kept: dict[TenantId, list[GangRequest]], removed: list[GangRequest], inserted: list[GangRequest]
) -> dict[TenantId, list[GangRequest]] | None:
    """The kept lists with the removed gangs taken out and the inserted put in; None if a removed
    gang is not where the order puts it, or an inserted one has no place."""
    lists = dict(kept)
    copied: set[TenantId] = set()
    for gang in removed:
        tenant_gangs = _own(lists, copied, gang.tenant)
        key = _fair_key(gang)
        at = bisect_left(tenant_gangs, key, key=_FAIR_KEY)
        if at == len(tenant_gangs) or tenant_gangs[at] is not gang:
            return None
        del tenant_gangs[at]
    for gang in inserted:
        at_s = gang.queued_at_s
        if at_s != at_s:
            return None
        tenant_gangs = _own(lists, copied, gang.tenant)
        key = _fair_key(gang)
        at = bisect_left(tenant_gangs, key, key=_FAIR_KEY)
        if at < len(tenant_gangs) and _fair_key(tenant_gangs[at]) == key:
            return None  # the same job twice: no queue has that
        tenant_gangs.insert(at, gang)
    for tenant in copied:
        if not lists[tenant]:
            del lists[tenant]
    return lists


def _own(
    lists: dict[TenantId, list[GangRequest]], copied: set[TenantId], tenant: TenantId
) -> list[GangRequest]:
    """The tenant's list, copied once before its first edit (the kept one is another plan's)."""
    if tenant not in copied:
        copied.add(tenant)
        lists[tenant] = list(lists.get(tenant, ()))
    return lists[tenant]
