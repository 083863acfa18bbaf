"""The placer's queue as the scheduler carries it from cycle to cycle: in chunks, with its edits
(issue 33).

A deep queue's steady cycle changes a few of its gangs: a submission puts one in, an admission takes
one out. The scheduler's carried queue (`federation.scheduling.snapshot.GangRequests.carry`) knows
which, yet it handed the placer one tuple of every queued request each cycle (24 ms at a million: a
reference count written per request, each a cache miss), and the placer found the changes again by
comparing that tuple with the last one place by place (`queue_carry._changes`, 14 to 18 ms).

`QueueChunks` keeps the queue as tuples of at most `CHUNK` requests. A cycle's edits copy the chunks
they touch and nothing else, and the queue handed to the placer (`ChunkedQueue`) is a new tuple of
the chunks (a pointer per chunk, a thousand at a million) with the edits since the queue handed
before it: the requests taken out and put in. The placer's queue carry (`queue_carry.QueueCarry`)
takes those as its changes when the queue it planned last is the one these edits were made from, so
a steady cycle reads none of the queue's other requests. A `ChunkedQueue` is immutable, as the tuple
was: a later edit copies the chunks it changes, so an older queue (a snapshot kept by a test, the last
plan's) stays what it was.

The order is that of the scheduler's map of requests (a request put in goes last, one replaced keeps
its place), which no plan depends on (`tests/unit/test_placement_properties.py`).

Interpreted, not compiled (`_compiled.COMPILED`): a `Sequence` of the standard library's, read by the
compiled placer through its protocol (iteration, `len`, a head slice), never request by request in a
steady cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from itertools import chain, islice
from operator import is_not
from typing import Final

from placement.chunks import Chunks
from placement.model import GangRequest, JobId

# Requests per chunk: an edit copies its chunk (about 20 ns a request), the queue a pointer per chunk.
CHUNK: Final = 1024
_NOT_NONE: Final = partial(is_not, None)


class ChunkedQueue(Chunks[GangRequest]):
    """A queue of requests held in chunks (`QueueChunks`), and the edits that made it from the queue
    handed before it (`edits_from`)."""

    __slots__ = ("based_on", "inserted", "removed", "token")

    def __init__(
        self,
        chunks: tuple[tuple[GangRequest, ...], ...],
        size: int,
        based_on: object | None = None,
        removed: Sequence[GangRequest] = (),
        inserted: Sequence[GangRequest] = (),
    ) -> None:
        super().__init__(chunks, size)
        # This queue's identity for the next one's edits, and the one this was edited from (None:
        # made from every request, no edits known).
        self.token = object()
        self.based_on = based_on
        self.removed = removed
        self.inserted = inserted

    def edits_from(self, last: object) -> tuple[Sequence[GangRequest], Sequence[GangRequest]] | None:
        """The requests taken out of `last` and put in to make this queue, if it was made from `last`
        by its edits (taking the first out and putting the second in gives this queue as a collection);
        else None."""
        if self.based_on is None or not isinstance(last, ChunkedQueue) or self.based_on is not last.token:
            return None
        return self.removed, self.inserted


class QueueChunks:
    """The scheduler's side: the queue's chunks, edited a request at a time (`edit`), and handed to
    the placer as a `ChunkedQueue` (`queue`) with the edits since the last one handed."""

    __slots__ = ("_chunks", "_last", "_pending", "_size", "_slot", "copied", "made_afresh")

    def __init__(self) -> None:
        self._chunks: list[tuple[GangRequest, ...]] = []
        # The chunk each queued job's request is in.
        self._slot: dict[JobId, int] = {}
        self._size = 0
        # Per job edited since the last queue handed: its request then (None: not queued) and now.
        self._pending: dict[JobId, tuple[GangRequest | None, GangRequest | None]] = {}
        # The token of the last queue handed (None: none, or the chunks were made afresh since).
        self._last: object | None = None
        # Requests copied into chunks (by edits and by `reset`), and the chunks made afresh: a steady
        # cycle copies the chunks its changes touch, not the queue (for tests and benchmarks).
        self.copied = 0
        self.made_afresh = 0

    def reset(self, requests: Iterable[GangRequest]) -> None:
        """The chunks made afresh from `requests`, in order (one request per job): the next queue
        handed has no edits."""
        self._chunks, self._slot = [], {}
        self._append(requests)
        self._size = sum(map(len, self._chunks))
        self._pending = {}
        self._last = None
        self.made_afresh += 1

    def edit(self, job_id: JobId, old: GangRequest | None, new: GangRequest | None) -> None:
        """The job's request in the queue goes from `old` (None: not queued) to `new` (None: out)."""
        pending = self._pending.get(job_id)
        self._pending[job_id] = (old if pending is None else pending[0], new)

    def queue(self) -> ChunkedQueue:
        """The queue as edited, with the edits since the last queue handed."""
        removed: list[GangRequest] = []
        inserted: list[GangRequest] = []
        # Per chunk, each request's replacement by its object's id (None: taken out).
        changes: dict[int, dict[int, GangRequest | None]] = {}
        appended: list[GangRequest] = []
        slot = self._slot
        for job_id, (old, new) in self._pending.items():
            if old is new:
                continue
            if old is not None:
                removed.append(old)
                number = slot[job_id] if new is not None else slot.pop(job_id)
                changes.setdefault(number, {})[id(old)] = new
            elif new is not None:
                appended.append(new)
            if new is not None:
                inserted.append(new)
        self._pending = {}
        chunks = self._chunks
        for number, replaced in changes.items():
            chunk = chunks[number]
            # C-level: each request's replacement (itself if none), the ones taken out dropped.
            kept: Iterator[GangRequest | None] = map(replaced.get, map(id, chunk), chunk)
            chunks[number] = tuple(filter(_NOT_NONE, kept))  # type: ignore[arg-type]
            self.copied += len(chunk)
        self._size += len(inserted) - len(removed)
        if appended:
            self._append(appended)
        last = self._last
        if len(chunks) > 2 * (self._size // CHUNK) + 16:
            # Chunks emptied by many removals: made afresh (a pass over the queue). The edits still
            # make this queue from the last as collections, whatever the chunks.
            self.reset(list(chain.from_iterable(chunks)))
        queue = ChunkedQueue(tuple(self._chunks), self._size, last, removed, inserted)
        self._last = queue.token
        return queue

    def _append(self, requests: Iterable[GangRequest]) -> None:
        """`requests` put in after the last, the last chunk filled first (copied), then new chunks."""
        chunks, slot = self._chunks, self._slot
        it = iter(requests)
        if chunks and len(chunks[-1]) < CHUNK:
            number = len(chunks) - 1
            more = tuple(islice(it, CHUNK - len(chunks[number])))
            chunks[number] += more
            self.copied += len(chunks[number])
            slot.update(dict.fromkeys([g.job_id for g in more], number))
        while chunk := tuple(islice(it, CHUNK)):
            number = len(chunks)
            chunks.append(chunk)
            slot.update(dict.fromkeys([g.job_id for g in chunk], number))
            self.copied += len(chunk)
