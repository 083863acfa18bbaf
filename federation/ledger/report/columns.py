"""Ledger intervals as columns, and the split of clipped intervals into time-bucket pieces.

A report over a month of 100,000 intervals must answer in well under a second. A loop that clips,
splits and accumulates interval by interval in Python took 300 to 550 ms here; reading each field
once into a numpy array and doing the arithmetic on whole columns takes a fraction of that
(`bench/report.py`). Labels (tenant, GPU type, ...) are coded as small integers, sorted, so a group
is one integer and sums are `bincount`s.

The split is exact: a piece runs from max(interval start, bucket start) to min(interval end, bucket
end), so the pieces of an interval add up to its clipped length up to floating-point rounding.
Cost is whole micro-dollars per piece within one UTC day (`federation.store.money`): a piece of a
week or month bucket is the sum of its days' (`split_by_days`), as SQL sums the days' rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING

from federation.store.intervals import LedgerInterval, SetKind
from federation.store.money import MICRO_PER_USD, micro_per_gpu_hour

# numpy is imported by the functions that compute, not by the module: the report modules are
# imported by every server (the API and the console serve reports) and numpy's import was a tenth
# of a restart's CPU before its listing began, for reports that run on demand (issue 19).
if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    F64 = NDArray[np.float64]
    I64 = NDArray[np.int64]


_SWEEP = SetKind.SWEEP.value


@dataclass(frozen=True, slots=True, eq=False)
class Coded:
    """One label column: `labels[codes[i]]` is interval i's value; labels are sorted."""

    labels: tuple[str, ...]
    codes: I64


def encode(values: Sequence[object]) -> Coded:
    # dict.fromkeys and map over a bound method run in C: a generator with setdefault took 45 ms
    # per 100,000 values here, this takes a few.
    import numpy as np  # see the module's imports

    distinct = sorted(dict.fromkeys(values), key=str)
    index = {v: i for i, v in enumerate(distinct)}
    codes = np.array(list(map(index.__getitem__, values)), dtype=np.int64)
    # StrEnum members (the capacity kind) become their value; everything else is already a str.
    return Coded(tuple(str(v) for v in distinct), codes)


class Columns:
    """The fields of a list of intervals that reports read, each read once and kept as an array.

    Label columns are coded on first use only: a report by tenant never reads users.
    """

    def __init__(self, intervals: Sequence[LedgerInterval], *, now_s: float) -> None:
        import numpy as np  # see the module's imports

        self.intervals = intervals
        self.count = len(intervals)
        self.start_s: F64 = np.array([iv.start_s for iv in intervals], dtype=np.float64)
        # None (still open) reads as NaN, and an open interval runs until now.
        end = np.array([iv.end_s for iv in intervals], dtype=np.float64)
        self.end_s: F64 = np.minimum(np.where(np.isnan(end), now_s, end), now_s)
        self.gpu_count: F64 = np.array([iv.gpu_count for iv in intervals], dtype=np.float64)
        self.usd_per_gpu_hour: F64 = np.array([iv.usd_per_gpu_hour for iv in intervals], dtype=np.float64)
        # Whole micro-dollars per GPU-hour, as `money.micro_per_gpu_hour` rounds them.
        self.micro_per_gpu_hour: F64 = np.array(
            [micro_per_gpu_hour(iv.usd_per_gpu_hour) for iv in intervals], dtype=np.float64
        )
        self._coded: dict[str, Coded] = {}

    def coded(self, field: str) -> Coded:
        """A label column by the interval's field, or by a report dimension's name where it is not
        one: `set` (the interval's `job_set`) and `sweep` (its set if that is a sweep, else "")."""
        got = self._coded.get(field)
        if got is None:
            got = self._coded[field] = encode(_labels(self.intervals, field))
        return got


def _labels(intervals: Sequence[LedgerInterval], field: str) -> list[object]:
    if field == "set":
        return list(map(attrgetter("job_set"), intervals))
    if field == "sweep":
        return [iv.job_set if iv.set_kind == _SWEEP else "" for iv in intervals]
    return list(map(attrgetter(field), intervals))


@dataclass(frozen=True, slots=True, eq=False)
class Pieces:
    """Clipped intervals split at bucket edges: piece j belongs to interval `row[j]`, bucket `bucket[j]`."""

    row: I64
    bucket: I64
    gpu_hours: F64
    cost_usd: F64
    # GPUs x seconds (divided by 3600 once at the end: exact sums on whole-second times), and the
    # cost in whole micro-dollars (integers held as float64: exact sums below 2**53).
    gpu_seconds: F64
    cost_micro_usd: F64


def clip(cols: Columns, since_s: float, until_s: float) -> tuple[I64, F64, F64]:
    """Indices of the intervals that overlap [since, until), and their clipped starts and ends."""
    import numpy as np  # see the module's imports

    start = np.maximum(cols.start_s, since_s)
    end = np.minimum(cols.end_s, until_s)
    keep = np.flatnonzero(end > start)
    return keep, start[keep], end[keep]


def split(cols: Columns, edges: F64, since_s: float, until_s: float) -> Pieces:
    """Clip every interval to [since, until) and split it at `edges` (sorted, covering the range)."""
    import numpy as np  # see the module's imports

    keep, start, end = clip(cols, since_s, until_s)
    first = np.searchsorted(edges, start, side="right") - 1
    last = np.searchsorted(edges, end, side="left") - 1
    spans = last - first + 1
    if spans.size and int(spans.max()) == 1:
        row, bucket, a, b = keep, first, start, end
    else:
        # Most intervals sit in one bucket; the rest repeat once per bucket they touch.
        owner = np.repeat(np.arange(keep.size), spans)
        offset = np.arange(owner.size) - np.repeat(np.cumsum(spans) - spans, spans)
        bucket = first[owner] + offset
        a = np.maximum(start[owner], edges[bucket])
        b = np.minimum(end[owner], edges[bucket + 1])
        row = keep[owner]
    seconds = cols.gpu_count[row] * (b - a)
    # The order of `money.piece_micro_usd`: (gpus x seconds) x micro-price / 3600, half to even.
    micro = np.rint(seconds * cols.micro_per_gpu_hour[row] / 3600.0)
    return Pieces(row, bucket.astype(np.int64), seconds / 3600.0, micro / MICRO_PER_USD, seconds, micro)


def day_edges(since_s: float, until_s: float) -> list[float]:
    """UTC midnights from the one at or before `since_s` to the first at or after `until_s`."""
    first = (since_s // 86400.0) * 86400.0
    edges = [first]
    while edges[-1] < until_s:
        edges.append(edges[-1] + 86400.0)
    if len(edges) == 1:
        edges.append(first + 86400.0)
    return edges


def split_by_days(cols: Columns, edges: F64, since_s: float, until_s: float) -> Pieces:
    """As `split` at bucket `edges` (each a UTC midnight, or `since_s`/`until_s`), with each piece's
    cost the sum of its parts' within each UTC day: what SQL's sums of day rows give."""
    import numpy as np  # see the module's imports

    days = np.array(day_edges(since_s, until_s))
    daily = split(cols, days, since_s, until_s)
    if daily.row.size == 0:
        return daily
    bucket = np.searchsorted(edges, days[daily.bucket], side="right") - 1
    bucket = np.maximum(bucket, 0)
    # Day pieces come in (interval, day) order, so each (interval, bucket) is one run of them.
    new = np.ones(daily.row.size, dtype=bool)
    new[1:] = (daily.row[1:] != daily.row[:-1]) | (bucket[1:] != bucket[:-1])
    group = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    seconds: F64 = np.bincount(group, weights=daily.gpu_seconds).astype(np.float64)
    micro: F64 = np.bincount(group, weights=daily.cost_micro_usd).astype(np.float64)
    return Pieces(
        daily.row[first],
        bucket[first].astype(np.int64),
        seconds / 3600.0,
        micro / MICRO_PER_USD,
        seconds,
        micro,
    )
