"""The waits of a stretch of the queue carried from one cycle's plan to the next (issue 33).

A deep queue that fits nowhere is decided mostly in stretches (`plan._Cycle.take_in_bulk`): gangs of
kinds already decided on the cycle's state, from tenants that all stand alike, each handed its kind's
wait, in queue order. Made afresh, a stretch of a million gangs cost a merge of the tenants' lists by
queue time (a sort of the million), and a `Waiting` per gang: most of a steady cycle's plan.

From one cycle to the next such a stretch barely changes: a submission puts a gang in, an admission
or a cancel takes one out, and the kinds' decisions are those of the last cycle. So the plan keeps
each stretch it made (`_Stretch`: the tenants' lists and bounds it was read from, the gangs merged in
queue order and their waits, and each kind's decision) in a `PlanCarry` that the caller hands to the
next `plan` over the same queue. The next cycle's stretch of the same standing is then the kept one
with the gangs that differ taken out and put in, if

* its tenants' gangs differ from the kept ones' in few gangs, found by walking the two in queue order
  side by side (a compiled loop that compares the gangs by identity, about 3 ns a gang, where the
  merge read each gang's time, 100 to 200 ns a gang spread through memory), and
* every kind of its tenants that the kept stretch knew was decided with an equal key (`Waiting.key`:
  equal keys, equal reasons), so each kept wait is the wait the cycle would make for its gang.

Nothing is taken on trust: whatever the snapshot, a stretch comes out as the merge would make it
(`tests/unit/test_stretch_carry.py` compares plans made with a carry with plans made afresh, cycle
after cycle). Otherwise the stretch is made afresh and kept for the next cycle.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable, Iterable, Sequence
from itertools import accumulate, islice
from operator import attrgetter, eq, ne
from typing import Final

from placement.model import GangRequest, TenantId, Waiting
from placement.model_plan import wait_for_job
from placement.queue_carry import QueueCarry

# The queue order within a stretch: queue time, then job id (unique in the queue).
_QUEUE_ORDER: Final = attrgetter("queued_at_s", "job_id")
_QUEUED_AT: Final = attrgetter("queued_at_s")
# Gangs compared between two calls of the caller's `between` (`_diff`): about a millisecond each.
_BETWEEN_EVERY: Final = 1 << 16
# Waits made between two calls of `between` (`_afresh`): well under a µs each.
_BETWEEN_EVERY_WAITS: Final = 4096
# A stretch's waits are kept in chunks of this many (tuples, handed on as the plan's waits,
# `placement.chunks`): an edit copies its chunk, and a chunk that grows past twice this is split.
WAIT_CHUNK: Final = 1024
# A kept stretch is edited, rather than made afresh, for at most this share of its gangs changed
# (1 in `_EDIT_SHARE`), or `_EDIT_LEAST`: each edit costs a bisection, the copy of the lists once for
# all.
_EDIT_SHARE: Final = 8
_EDIT_LEAST: Final = 32
# Up to this many edits are made in place (a move of the lists' tails each), more by a copy.
_IN_PLACE_MOST: Final = 32

# A stretch's standing (`plan._Cycle.take_in_bulk`): guaranteed, minus the priority, the share.
Standing = tuple[bool, int, float]
# One tenant's part of a stretch: its gangs in the fair order and the bounds of those taken.
Slice = tuple[list[GangRequest], int, int]


class _WaitOf:
    """A stretch's gang's wait: its kind's decision (`plan._Cycle`), for the gang's job."""

    __slots__ = ("decided", "kind_by_object")

    def __init__(self, decided: list[Waiting | None], kind_by_object: dict[int, int]) -> None:
        self.decided = decided
        self.kind_by_object = kind_by_object

    def __call__(self, gang: GangRequest) -> Waiting:
        return wait_for_job(self.decided[self.kind_by_object[id(gang.decision_key)]], gang.job_id)  # type: ignore[arg-type]


class _Stretch:
    """A stretch as made: what it was read from, and what it gave."""

    __slots__ = ("kinds", "merged", "slices", "waits")

    def __init__(
        self,
        slices: dict[TenantId, Slice],
        kinds: dict[Hashable, Waiting],
        merged: list[GangRequest],
        waits: list[tuple[Waiting, ...]],
    ) -> None:
        # Per tenant, its gangs' list and the bounds taken (the lists are the fair order's, which no
        # one changes once made).
        self.slices = slices
        # Each kind's decision (by its decision key's value) for every kind of the stretch's tenants.
        self.kinds = kinds
        # The stretch's gangs in queue order, and the wait of each, in chunks (`WAIT_CHUNK`): the
        # plan's waits hold the chunks, so an edit replaces the chunks it changes, never changes one.
        self.merged = merged
        self.waits = waits


class PlanCarry:
    """What a plan keeps for the next plan over the same queue: its stretches, by standing, in the
    order made. Any plan may be given it: it is only ever read through the checks above."""

    __slots__ = ("_kept", "_made", "carried", "in_bulk", "made_afresh", "one_by_one", "queue")

    def __init__(self) -> None:
        # The fair order's per-tenant lists (`queue_carry`).
        self.queue = QueueCarry()
        self._kept: dict[Standing, list[_Stretch]] = {}
        self._made: dict[Standing, list[_Stretch]] = {}
        # Stretches edited from a kept one, and made afresh, since the carry was made (for the tests
        # and benchmarks: the figures say whether the carry is used).
        self.carried = 0
        self.made_afresh = 0
        # Gangs decided one by one and taken in stretches (`plan._Cycle.take_in_bulk`) by the plans
        # given this carry: a steady cycle over a deep queue that fits nowhere decides a few hundred
        # one by one, whatever the depth (the tests and bench/depth_cycle.py read them).
        self.one_by_one = 0
        self.in_bulk = 0

    def begin(self, queued: Sequence[GangRequest], between: Callable[[], None] | None = None) -> None:
        """A plan over `queued` starts: what the last one made is what this one may edit."""
        self._kept, self._made = self._made, {}
        self.queue.begin(queued, between)

    def stretch_waits(
        self,
        standing: Standing,
        slices: dict[TenantId, Slice],
        kinds: dict[Hashable, Waiting],
        decided: list[Waiting | None],
        kind_by_object: dict[int, int],
        between: Callable[[], None] | None,
    ) -> list[tuple[Waiting, ...]]:
        """The waits of the stretch read from `slices`, in queue order, in chunks; `kinds` holds each
        kind's decision (by decision key) for every kind of the slices' tenants, and a gang's wait is
        that of its kind (`kind_by_object`, by its key object) in `decided`, for another job. The list
        returned is kept (the next plan's edits replace its chunks): the caller copies it, and may keep
        the chunks, which no one changes."""
        wait_of = _WaitOf(decided, kind_by_object)
        kept = self._kept.get(standing)
        stretch = None
        if kept:
            # Taken out before it is edited: a plan that fails half-way leaves nothing half-edited.
            stretch = _edited(kept.pop(0), slices, kinds, wait_of, between)
        if stretch is None:
            stretch = _afresh(slices, kinds, wait_of, between)
            self.made_afresh += 1
        else:
            self.carried += 1
        self._made.setdefault(standing, []).append(stretch)
        return stretch.waits


def _afresh(
    slices: dict[TenantId, Slice],
    kinds: dict[Hashable, Waiting],
    wait_of: _WaitOf,
    between: Callable[[], None] | None,
) -> _Stretch:
    gangs: list[GangRequest] = []
    for tenant_gangs, start, stop in slices.values():
        gangs.extend(tenant_gangs[start:stop])
    merged, ordered = by_queue_order(gangs)
    waits: list[tuple[Waiting, ...]] = []
    decided, kind_by_object = wait_of.decided, wait_of.kind_by_object
    for at in range(0, len(merged), WAIT_CHUNK):
        if between is not None and at % _BETWEEN_EVERY_WAITS == 0:
            between()
        waits.append(
            tuple(
                [
                    wait_for_job(decided[kind_by_object[id(g.decision_key)]], g.job_id)  # type: ignore[arg-type]
                    for g in merged[at : at + WAIT_CHUNK]
                ]
            )
        )
    if not ordered:
        # No order to edit by (a time that is not a number): the next cycle makes it afresh.
        return _Stretch({}, {}, merged, waits)
    return _Stretch(slices, kinds, merged, waits)


def _edited(
    stretch: _Stretch,
    slices: dict[TenantId, Slice],
    kinds: dict[Hashable, Waiting],
    wait_of: _WaitOf,
    between: Callable[[], None] | None,
) -> _Stretch | None:
    """The kept stretch edited into the one `slices` read now, or None if it cannot be."""
    if not stretch.slices:
        return None
    for key, wait in kinds.items():
        old = stretch.kinds.get(key)
        if old is not None and old is not wait and not _same_reasons(old, wait):
            return None
    merged = stretch.merged
    most = max(_EDIT_LEAST, len(merged) // _EDIT_SHARE)
    removed: list[GangRequest] = []
    inserted: list[GangRequest] = []
    walked = 0
    for tenant in stretch.slices.keys() | slices.keys():
        old_gangs, old_start, old_stop = stretch.slices.get(tenant, _EMPTY)
        new_gangs, new_start, new_stop = slices.get(tenant, _EMPTY)
        if old_gangs is new_gangs and old_start == new_start and old_stop == new_stop:
            continue
        if not _diff(old_gangs, old_start, old_stop, new_gangs, new_start, new_stop, removed, inserted, most):
            return None
        walked += (old_stop - old_start) + (new_stop - new_start)
        if between is not None and walked >= _BETWEEN_EVERY:
            between()
            walked = 0
    if len(removed) + len(inserted) > most:
        return None
    if removed or inserted:
        edited = _apply(merged, stretch.waits, removed, inserted, wait_of)
        if edited is None:
            return None
        merged, waits = edited
    else:
        waits = stretch.waits
    return _Stretch(slices, kinds, merged, waits)


_EMPTY: Final[Slice] = ([], 0, 0)


def _same_reasons(old: Waiting, new: Waiting) -> bool:
    """Whether two waits give equal reasons, known from their keys (`Waiting.key`), each made by the
    same kind of explanation (or both none) so that the two keys mean the same thing."""
    return type(old._explanation) is type(new._explanation) and old.key == new.key


def _diff(
    old: list[GangRequest],
    old_start: int,
    old_stop: int,
    new: list[GangRequest],
    new_start: int,
    new_stop: int,
    removed: list[GangRequest],
    inserted: list[GangRequest],
    most: int,
) -> bool:
    """The gangs of old[old_start:old_stop] not in new[new_start:new_stop] into `removed`, those
    of the new not in the old into `inserted`: the two are walked side by side in queue order (each a
    tenant's gangs of one priority, in queue order). False if they are not in order (a time that is
    not a number) or differ in more than `most` gangs."""
    i, j = old_start, new_start
    while i < old_stop and j < new_stop:
        a = old[i]
        b = new[j]
        if a is b:
            i += 1
            j += 1
            continue
        a_at, b_at = a.queued_at_s, b.queued_at_s
        if a_at == b_at and a.job_id == b.job_id:
            if a != b:  # the same job with another request: out and in at one place
                removed.append(a)
                inserted.append(b)
            i += 1
            j += 1
        elif a_at < b_at or (a_at == b_at and a.job_id < b.job_id):
            removed.append(a)
            i += 1
        elif b_at < a_at or (a_at == b_at and b.job_id < a.job_id):
            inserted.append(b)
            j += 1
        else:
            return False
        if len(removed) + len(inserted) > most:
            return False
    while i < old_stop:
        removed.append(old[i])
        i += 1
    while j < new_stop:
        inserted.append(new[j])
        j += 1
    return len(removed) + len(inserted) <= most


def _apply(
    merged: list[GangRequest],
    waits: list[tuple[Waiting, ...]],
    removed: list[GangRequest],
    inserted: list[GangRequest],
    wait_of: _WaitOf,
) -> tuple[list[GangRequest], list[tuple[Waiting, ...]]] | None:
    """`merged` and its `waits` (in chunks) without the removed gangs and with the inserted ones in
    their places (found by bisection): the gangs edited in place if the edits are few, else copied
    once, and the waits' chunks that the edits touch replaced by edited copies (`_edited_chunks`);
    None if a gang is not where the order puts it."""
    size = len(merged)
    # (place in `merged`, 0 to put in before it or 1 to take it out, the gang's order, the gang).
    edits: list[tuple[int, int, tuple[float, str], GangRequest]] = []
    taken_out = {id(gang) for gang in removed}
    for gang in removed:
        order = (gang.queued_at_s, gang.job_id)
        at = bisect_left(merged, order, key=_QUEUE_ORDER)
        if at == size or merged[at] is not gang:
            return None
        edits.append((at, 1, order, gang))
    for gang in inserted:
        order = (gang.queued_at_s, gang.job_id)
        at = bisect_left(merged, order, key=_QUEUE_ORDER)
        # Between its neighbours in order (an equal one is taken out: the same job's old request).
        if at > 0 and not _QUEUE_ORDER(merged[at - 1]) < order:
            return None
        if at < size:
            following = _QUEUE_ORDER(merged[at])
            if not (order < following or (order == following and id(merged[at]) in taken_out)):
                return None
        edits.append((at, 0, order, gang))
    edits.sort(key=_EDIT_ORDER)
    if _duplicates(edits):
        return None
    if len(edits) <= _IN_PLACE_MOST:
        # In place, from the last edit back: each a move of the gangs' tail, where a copy touched
        # every gang (a reference count each, 10 to 20 ms a copy of a million). Taken back in that
        # order, a place's removal comes before the gangs put in before it, each put in before the one
        # after it. The list is the kept stretch's, which no one else holds.
        for at, kind, _, gang in reversed(edits):
            if kind == 1:
                del merged[at]
            else:
                merged.insert(at, gang)
    else:
        out_merged: list[GangRequest] = []
        done = 0
        for at, kind, _, gang in edits:
            if at > done:
                out_merged += merged[done:at]
                done = at
            if kind == 1:
                done = at + 1
            else:
                out_merged.append(gang)
        out_merged += merged[done:]
        merged = out_merged
    return merged, _edited_chunks(waits, edits, wait_of)


def _edited_chunks(
    waits: list[tuple[Waiting, ...]],
    edits: list[tuple[int, int, tuple[float, str], GangRequest]],
    wait_of: _WaitOf,
) -> list[tuple[Waiting, ...]]:
    """The waits' chunks with the edits made (places before any edit, in order): each chunk an edit
    touches is replaced by an edited copy, the others kept as they are. The chunks are tuples that the
    last plan's waits hold, and a reader finds what changed by them (`placement.chunks.same_chunks`):
    a copy of every chunk for a few dozen edits made all the waits look new to it."""
    if not waits:
        new = tuple(wait_of(gang) for _, kind, _, gang in edits if kind == 0)
        return [new] if new else []
    starts = [0, *accumulate(map(len, waits))][:-1]
    by_chunk: dict[int, list[tuple[int, int, GangRequest]]] = {}
    for at, kind, _, gang in edits:
        chunk_at = max(0, bisect_right(starts, at) - 1)
        by_chunk.setdefault(chunk_at, []).append((at - starts[chunk_at], kind, gang))
    oversized = emptied = False
    for chunk_at, chunk_edits in by_chunk.items():
        chunk = list(waits[chunk_at])
        # From the last edit back, as the gangs are edited.
        for at, kind, gang in reversed(chunk_edits):
            if kind == 1:
                del chunk[at]
            else:
                chunk.insert(at, wait_of(gang))
        waits[chunk_at] = tuple(chunk)
        oversized = oversized or len(chunk) > 2 * WAIT_CHUNK
        emptied = emptied or not chunk
    if oversized or emptied:
        waits[:] = [piece for chunk in waits if chunk for piece in _split(chunk)]
    return waits


def _split(chunk: tuple[Waiting, ...]) -> list[tuple[Waiting, ...]]:
    """A chunk grown past twice `WAIT_CHUNK` in pieces of `WAIT_CHUNK`; else the chunk itself."""
    if len(chunk) <= 2 * WAIT_CHUNK:
        return [chunk]
    return [chunk[at : at + WAIT_CHUNK] for at in range(0, len(chunk), WAIT_CHUNK)]


def _edit_order(edit: tuple[int, int, tuple[float, str], GangRequest]) -> tuple[int, int, tuple[float, str]]:
    return edit[0], edit[1], edit[2]


_EDIT_ORDER: Final = _edit_order


def _duplicates(edits: Iterable[tuple[int, int, tuple[float, str], GangRequest]]) -> bool:
    """Whether two gangs put in share a place and an order (the same job twice: no queue has that)."""
    seen: set[tuple[float, str]] = set()
    for _, kind, order, _ in edits:
        if kind == 0:
            if order in seen:
                return True
            seen.add(order)
    return False


def by_queue_order(gangs: list[GangRequest]) -> tuple[list[GangRequest], bool]:
    """The gangs by queue time, then job id, and whether every time is a number (else the order is
    the sort's of the gangs as given, and no bisection can find a gang in it).

    When no two gangs share a queue time the order is that of the times alone: the positions are
    sorted on the list of times (floats, which the sort compares fastest, a third of the time of the
    pair), and the gangs are not read again. A stretch of a deep queue is hundreds of thousands of
    gangs spread through memory, where each pass that reads them costs 100 to 200 ns a gang in
    reading alone (sorting on the gangs' times was a second such pass, and a set of the times to find
    ties cost as much again)."""
    times = list(map(_QUEUED_AT, gangs))
    order = sorted(range(len(times)), key=times.__getitem__)
    in_order = [times[i] for i in order]
    numbers = not any(map(ne, in_order, in_order))
    if any(map(eq, in_order, islice(in_order, 1, None))):
        return sorted(gangs, key=_QUEUE_ORDER), numbers
    return [gangs[i] for i in order], numbers
