"""A sequence held in chunks: tuples that successive values share (issue 33).

A deep queue's cycle handed a million requests from the scheduler to the placer, and a million waits
back, each as one tuple made afresh (a reference count written per item, a cache miss each: 6 to 24 ms
a tuple at a million), though from one cycle to the next a few items change. Held as chunks, a value
edited from the last copies the chunks its edits touch, and is a new tuple of the chunks otherwise
shared (a pointer per chunk). A reader that kept the last value finds what changed by comparing the
two values' chunks by identity (`same_chunks`): a chunk that is the very object it held is the same
items in the same order.

Immutable, as the tuples were; compares, hashes, copies and pickles as the tuple of its items.
Interpreted, not compiled (`_compiled.COMPILED`): the compiled placer reads it through the sequence
protocol, never item by item in a steady cycle.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate, chain, islice
from typing import TypeVar, overload

T = TypeVar("T")


class Chunks(Sequence[T]):
    """The items of `chunks`, in order."""

    __slots__ = ("_flat", "_size", "_starts", "chunks")

    def __init__(self, chunks: tuple[tuple[T, ...], ...], size: int | None = None) -> None:
        self.chunks = chunks
        self._size = sum(map(len, chunks)) if size is None else size
        self._flat: tuple[T, ...] | None = None
        self._starts: list[int] | None = None

    def as_tuple(self) -> tuple[T, ...]:
        """Every item in one tuple, made once (a pass over them all: for readers that need one)."""
        if self._flat is None:
            self._flat = tuple(chain.from_iterable(self.chunks))
        return self._flat

    def starts(self) -> list[int]:
        """Where each chunk starts."""
        if self._starts is None:
            self._starts = [0, *accumulate(map(len, self.chunks))][:-1] if self.chunks else []
        return self._starts

    def span(self, start: int, stop: int) -> tuple[T, ...]:
        """The items from `start` to `stop`, read from the chunks that hold them."""
        if stop <= start:
            return ()
        if self._flat is not None:
            return self._flat[start:stop]
        starts = self.starts()
        at = max(0, bisect_right(starts, start) - 1)
        items = chain.from_iterable(islice(self.chunks, at, None))
        return tuple(islice(items, start - starts[at], stop - starts[at]))

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[T]:
        return chain.from_iterable(self.chunks)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        if isinstance(index, slice):
            if self._flat is None and index.step in (None, 1):
                # A span (the placer probes the head, the scheduler reads the places that changed):
                # read from the chunks it covers only.
                start, stop, _ = index.indices(self._size)
                return self.span(start, stop)
            return self.as_tuple()[index]
        if self._flat is not None:
            return self._flat[index]
        place = index + self._size if index < 0 else index
        if not 0 <= place < self._size:
            raise IndexError("Chunks index out of range")
        starts = self.starts()
        at = bisect_right(starts, place) - 1
        # Empty chunks share their start with the next: the last chunk starting there holds it.
        return self.chunks[at][place - starts[at]]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Chunks):
            return self._size == other._size and self.as_tuple() == other.as_tuple()
        if isinstance(other, tuple):
            return self.as_tuple() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.as_tuple())

    def __reduce__(self) -> tuple[type[tuple[T, ...]], tuple[tuple[T, ...]]]:
        # Copied and pickled as the tuple of its items (the chunks are this process's bookkeeping).
        return tuple, (self.as_tuple(),)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._size} items in {len(self.chunks)} chunks)"


def same_chunks(these: Chunks[T], those: Chunks[T]) -> list[tuple[int, int, int]]:
    """The runs of items that `these` holds in chunks that are the very objects `those` holds, in
    order in both: (start, stop, start in `those`), ascending. Empty chunks are passed over (the empty
    tuple is one object). Reads the chunks, not the items."""
    where = {id(chunk): at for at, chunk in enumerate(those.chunks) if chunk}
    their_starts = those.starts()
    runs: list[tuple[int, int, int]] = []
    last_at = -1
    start = 0
    for chunk in these.chunks:
        size = len(chunk)
        at = where.get(id(chunk), -1) if size else -1
        if at > last_at:
            from_those = their_starts[at]
            if runs and runs[-1][1] == start and runs[-1][2] + (start - runs[-1][0]) == from_those:
                runs[-1] = (runs[-1][0], start + size, runs[-1][2])
            else:
                runs.append((start, start + size, from_those))
            last_at = at
        start += size
    return runs
