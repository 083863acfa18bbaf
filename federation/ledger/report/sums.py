"""A report's figures as sums that add: what `compute_report` needs, from any number of sources.

A finance report over both stores is computed in two halves that meet here: etcd's intervals (open
ones, and closed ones not archived yet) are summed in Python by `interval_sums`, and the archived
closed intervals are summed in SQL (`federation.ledger.report.archived`). Each half is a
`ReportSums`; `add` merges them and `compute.finish_report` turns the total into the `Report` (rows
in order, tenant roll-ups, budget and forecast, idle cost).

Sums are kept in GPU-seconds (divided by 3600 once in `compute.finish_report`: exact on whole-second
times) and in whole micro-dollars, each interval's part of each UTC day rounded once
(`federation.store.money`): integer sums are exact in any order, so the same ledger gives the same
costs digit by digit whether an interval was summed here or in SQL.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from federation.ledger.report.columns import Columns, Pieces, day_edges, split, split_by_days
from federation.ledger.report.idle import UsedEdges, used_edges
from federation.ledger.report.query import Bucket, ReportQuery, bucket_edges, month_start_s, next_month_s
from federation.store.intervals import LedgerInterval

if TYPE_CHECKING:  # imported where used, as in columns.py
    import numpy as np

WEEK_S = 7 * 86400.0

# (bucket start or None, group key) -> [GPU-seconds, micro-dollars, interval pieces]
RowSums = dict[tuple[float | None, tuple[str, ...]], list[float]]
# tenant -> [GPU-seconds, micro-dollars]
TenantSums = dict[str, list[float]]


@dataclass(slots=True)
class ReportSums:
    rows: RowSums = field(default_factory=dict)
    # (day start, tenant) -> micro-dollars, over the report's period.
    daily_cost: dict[tuple[float, str], float] = field(default_factory=dict)
    # GPU type -> GPU-seconds, over the report's period.
    by_type: dict[str, float] = field(default_factory=dict)
    # Per tenant over the report's period, this calendar month up to now, and the last seven days.
    period: TenantSums = field(default_factory=dict)
    month: TenantSums = field(default_factory=dict)
    week: TenantSums = field(default_factory=dict)
    # GPUs in use per site, for idle cost (only the sites with pools, in a report over every tenant).
    used: UsedEdges = field(default_factory=dict)

    def add(self, other: ReportSums) -> None:
        for key, values in other.rows.items():
            _add_list(self.rows, key, values)
        for day_key, cost in other.daily_cost.items():
            self.daily_cost[day_key] = self.daily_cost.get(day_key, 0.0) + cost
        for gpu, seconds in other.by_type.items():
            self.by_type[gpu] = self.by_type.get(gpu, 0.0) + seconds
        for mine, theirs in ((self.period, other.period), (self.month, other.month), (self.week, other.week)):
            for tenant, values in theirs.items():
                _add_list(mine, tenant, values)
        for site, moves in other.used.items():
            into = self.used.setdefault(site, {})
            for at, delta in moves.items():
                into[at] = into.get(at, 0) + delta


def _add_list(into: dict[Any, list[float]], key: Any, values: list[float]) -> None:
    got = into.get(key)
    if got is None:
        into[key] = list(values)
    else:
        for i, v in enumerate(values):
            got[i] += v


def _per_tenant(
    labels: Sequence[str], codes: np.ndarray, seconds: np.ndarray, cost: np.ndarray
) -> TenantSums:
    import numpy as np  # see columns.py's imports

    if codes.size == 0:
        return {}
    size = len(labels)
    s = np.bincount(codes, weights=seconds, minlength=size).tolist()
    c = np.bincount(codes, weights=cost, minlength=size).tolist()
    n = np.bincount(codes, minlength=size).tolist()
    return {labels[k]: [s[k], c[k]] for k in range(size) if n[k]}


def _row_sums(cols: Columns, query: ReportQuery, edges: list[float], got: Pieces) -> RowSums:
    import numpy as np  # see columns.py's imports

    if got.row.size == 0:
        return {}
    # One integer per (bucket, key...); compacted whenever the mixed radix would grow too large for
    # an int64.
    group = got.bucket.copy()
    coded = [cols.coded(d.value) for d in query.group_by]
    radix = len(edges)
    for c in coded:
        group = group * len(c.labels) + c.codes[got.row]
        radix *= len(c.labels)
        if radix > 2**40:
            _, group = np.unique(group, return_inverse=True)
            radix = int(group.max()) + 1
    keys, inverse = np.unique(group, return_inverse=True)
    seconds = np.bincount(inverse, weights=got.gpu_seconds).tolist()
    cost = np.bincount(inverse, weights=got.cost_micro_usd).tolist()
    count = np.bincount(inverse).tolist()
    # Decode each group back from any one of its pieces (all of a group's share its key and bucket).
    first = np.zeros(keys.size, dtype=np.int64)
    first[inverse] = np.arange(inverse.size)
    rows_of = got.row[first]
    bucket_of = got.bucket[first].tolist()
    # Built column-wise with zip and map (C loops): a five-dimension daily report has a row for
    # nearly every piece, and a Python loop per row doubled its time.
    labels = [list(map(c.labels.__getitem__, c.codes[rows_of].tolist())) for c in coded]
    keys_of: list[tuple[str, ...]] = list(zip(*labels, strict=True)) if labels else [()] * keys.size
    starts = list(map(edges.__getitem__, bucket_of)) if query.bucket is not None else [None] * keys.size
    return dict(
        zip(zip(starts, keys_of, strict=True), map(list, zip(seconds, cost, count, strict=True)), strict=True)
    )


def interval_sums(
    intervals: Iterable[LedgerInterval],
    query: ReportQuery,
    *,
    idle_sites: frozenset[tuple[str, str]] | None = None,
) -> ReportSums:
    """The report's sums over these intervals: clipped to the period (an open one runs to now),
    split at bucket edges, and only the tenants the query may see. `idle_sites`: also the GPUs in
    use on those sites, over every tenant's intervals (idle cost is an every-tenant figure)."""
    import numpy as np  # see columns.py's imports

    listed = list(intervals)
    out = ReportSums()
    q_start, q_end = query.start_s, query.until_s
    if idle_sites is not None:
        out.used = used_edges(listed, start_s=q_start, end_s=q_end, sites=idle_sites)
    if query.tenants is not None:
        listed = [iv for iv in listed if iv.tenant in query.tenants]
    now = query.now_s
    cols = Columns(listed, now_s=now)

    days = bucket_edges(q_start, q_end, Bucket.DAY)
    daily = split(cols, np.array(days), q_start, q_end)
    if query.bucket is Bucket.DAY:
        out.rows = _row_sums(cols, query, days, daily)
    else:
        # Cost per piece of a day, added up into the bucket, as SQL adds the days' rows.
        edges = bucket_edges(q_start, q_end, query.bucket)
        out.rows = _row_sums(cols, query, edges, split_by_days(cols, np.array(edges), q_start, q_end))

    tenant = cols.coded("tenant")
    n_tenants = max(1, len(tenant.labels))
    if daily.row.size:
        code = daily.bucket * n_tenants + tenant.codes[daily.row]
        per_day = np.bincount(code, weights=daily.cost_micro_usd)
        out.daily_cost = {
            (days[k // n_tenants], tenant.labels[k % n_tenants]): c
            for k, c in enumerate(per_day.tolist())
            if c != 0.0
        }
        gpu = cols.coded("gpu_type")
        by_type = np.bincount(gpu.codes[daily.row], weights=daily.gpu_seconds, minlength=len(gpu.labels))
        out.by_type = {label: s for label, s in zip(gpu.labels, by_type.tolist(), strict=True) if s != 0.0}
    out.period = _per_tenant(tenant.labels, tenant.codes[daily.row], daily.gpu_seconds, daily.cost_micro_usd)

    # This month's figures, for budgets and the forecast, whatever the report's period.
    for window, (since, until) in (
        ("month", (month_start_s(now), min(now, next_month_s(now)))),
        ("week", (now - WEEK_S, now)),
    ):
        # Cut at midnights too, for the cost of each day's piece (see `money`).
        got = split(cols, np.array(day_edges(since, until)), since, until)
        sums = _per_tenant(tenant.labels, tenant.codes[got.row], got.gpu_seconds, got.cost_micro_usd)
        if window == "month":
            out.month = sums
        else:
            out.week = sums
    return out
