"""What a finance report asks the history store for, and what it answers: sums, never rows.

A report (`federation.ledger.report`) needs, for the archived closed intervals, the same figures it
computes for etcd's intervals: GPU-seconds, cost and the count of interval pieces per grouping and
time bucket, per tenant over a few windows, and (for idle cost) how many GPUs were in use on each
cluster and GPU type from moment to moment. `ReportRead` asks for all of them at once, so that the
store answers them from one snapshot together with which of etcd's closed intervals it already
holds: the caller leaves those out of etcd's side, and an interval the archiver is moving counts once.

Sums are kept in GPU-seconds (not hours: exact on whole-second times) and in whole micro-dollars,
each interval's part of each UTC day rounded once (`federation.store.money`): integers add exactly
in any order, so adding the store's sums to etcd's gives the same costs digit by digit whichever
store holds an interval.
"""

from __future__ import annotations

from dataclasses import dataclass

from federation.errors import InvalidArgument
from federation.history.model import GroupBy, IntervalKey, Period
from placement.model import TenantId


@dataclass(frozen=True, slots=True)
class SumsQuery:
    """Closed intervals clipped to [since_s, until_s), grouped by `group_by` and a time bucket:
    `period` (UTC day or month), or `starts`: buckets that begin on these UTC days (sorted,
    'YYYY-MM-DD'; ISO weeks, say), each running to the next. Neither: one bucket, the whole range."""

    since_s: float
    until_s: float
    group_by: tuple[GroupBy, ...] = ()
    period: Period | None = None
    starts: tuple[str, ...] = ()
    tenants: frozenset[TenantId] | None = None
    # Count each group's distinct intervals (COUNT DISTINCT, the costliest part of the query);
    # False: `SumsRow.intervals` is 0.
    count_intervals: bool = True

    def __post_init__(self) -> None:
        if not self.until_s > self.since_s:
            raise InvalidArgument(f"until_s: must be after since_s ({self.until_s} <= {self.since_s})")
        if len(set(self.group_by)) != len(self.group_by):
            raise InvalidArgument(f"group_by: names a dimension twice ({', '.join(self.group_by)})")
        if self.starts and self.period is not None:
            raise InvalidArgument("starts: give either a period or bucket starts, not both")
        if list(self.starts) != sorted(set(self.starts)):
            raise InvalidArgument("starts: must be distinct days in order")


@dataclass(frozen=True, slots=True)
class SumsRow:
    # The values of the query's `group_by`, in its order.
    keys: tuple[str, ...]
    # The bucket: 'YYYY-MM-DD' (a day, or the start day of a `starts` bucket), 'YYYY-MM', or None.
    bucket: str | None
    gpu_seconds: float
    # Whole micro-dollars: divide by 1,000,000 for dollars.
    cost_micro_usd: int
    # Distinct intervals in the group: an interval split across two buckets counts in each.
    intervals: int


@dataclass(frozen=True, slots=True)
class EdgesQuery:
    """GPUs in use over [since_s, until_s) on the given (cluster, GPU type) sites, every tenant."""

    since_s: float
    until_s: float
    sites: frozenset[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class UsageEdge:
    """At `at_s` the GPUs in use on (cluster, gpu_type) changed by `delta` (never 0)."""

    cluster: str
    gpu_type: str
    at_s: float
    delta: int


@dataclass(frozen=True, slots=True)
class ReportRead:
    sums: tuple[SumsQuery, ...]
    edges: EdgesQuery | None = None
    # etcd's closed intervals: the answer says which of them the store holds already.
    check: tuple[IntervalKey, ...] = ()


@dataclass(frozen=True, slots=True)
class ReportAnswer:
    # One tuple of rows per query in `ReportRead.sums`, in its order.
    sums: tuple[tuple[SumsRow, ...], ...]
    edges: tuple[UsageEdge, ...]
    held: frozenset[IntervalKey]
