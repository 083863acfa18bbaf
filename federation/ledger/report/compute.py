"""GPU-hours and cost from the usage ledger, grouped, bucketed, with quota share, budget and forecast.

Each interval is clipped to the report's period (an open one runs to min(now, end)) and, with time
buckets, split exactly at their boundaries; GPU-hours are GPUs x hours held, cost is GPU-hours x the
price in force when the attempt started. The arithmetic runs on columns (`columns.py`), so a month
of 100,000 intervals takes tens of milliseconds (`bench/report.py`).

Per tenant (an organisation's figures include its teams', as quotas and budgets roll up the tenant
tree in `placement.quota`):
- share of quota used: GPU-hours used / (guaranteed GPUs, summed over types, x hours in the period);
- budget: this calendar month's GPU-hours against `monthly_budget_gpu_hours`, and what is left;
- forecast: this month so far plus the rest of the month at a rate, the month-to-date rate or the
  last seven days' (`ReportQuery.forecast` says which, and the summary repeats it).

The tenant filter is strict: intervals of tenants outside it are dropped before anything is summed,
so neither rows, totals, charts nor roll-ups can carry another tenant's usage.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from federation.ledger.report.columns import I64, Columns, Pieces, clip, split
from federation.ledger.report.idle import IdleCost, ProvisionedInterval, idle_cost
from federation.ledger.report.query import (
    Bucket,
    ForecastBasis,
    ReportQuery,
    bucket_edges,
    month_start_s,
    next_month_s,
)
from federation.store.intervals import LedgerInterval
from federation.store.records import TenantRecord
from placement.model import TenantId

WEEK_S = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class Row:
    # One value per grouping dimension, in the query's order.
    key: tuple[str, ...]
    # Start of the time bucket (None without buckets).
    bucket_start_s: float | None
    gpu_hours: float
    cost_usd: float
    # Interval pieces summed into the row (an interval split across two buckets counts in each).
    intervals: int


@dataclass(frozen=True, slots=True)
class TenantSummary:
    tenant: TenantId
    gpu_hours: float
    cost_usd: float
    # None where the tenant has no guarantee.
    quota_share: float | None
    monthly_budget_gpu_hours: float | None
    month_gpu_hours: float
    month_cost_usd: float
    forecast_month_gpu_hours: float
    forecast_month_cost_usd: float
    forecast_basis: ForecastBasis = ForecastBasis.MONTH_TO_DATE

    @property
    def budget_left_gpu_hours(self) -> float | None:
        if self.monthly_budget_gpu_hours is None:
            return None
        return self.monthly_budget_gpu_hours - self.month_gpu_hours

    @property
    def budget_spent_share(self) -> float | None:
        if not self.monthly_budget_gpu_hours:
            return None
        return self.month_gpu_hours / self.monthly_budget_gpu_hours


@dataclass(frozen=True, slots=True)
class Report:
    query: ReportQuery
    rows: tuple[Row, ...]
    total_gpu_hours: float
    total_cost_usd: float
    tenants: tuple[TenantSummary, ...]
    # Extra series for charts, whatever the grouping: cost by (day, tenant), GPU-hours by GPU type.
    daily_cost_by_tenant: tuple[tuple[float, str, float], ...]
    gpu_hours_by_type: tuple[tuple[str, float], ...]
    # Idle provisioned capacity per pool, in a report over every tenant only: what a pool left
    # idle says what the other tenants used, so a member's report has none.
    idle: tuple[IdleCost, ...] = ()


def pieces(start: float, end: float, bucket: Bucket) -> list[tuple[float, float, float]]:
    """(bucket start, piece start, piece end) for [start, end) split at the bucket's boundaries."""
    edges = bucket_edges(start, end, bucket)
    return [(a, max(a, start), min(b, end)) for a, b in pairwise(edges)]


def _ancestors(tenants: Mapping[TenantId, TenantRecord], tenant: TenantId) -> list[TenantId]:
    """The tenant and its ancestors, nearest first; a cycle or an unknown parent ends the chain."""
    out, seen = [tenant], {tenant}
    record = tenants.get(tenant)
    while record is not None and record.parent is not None and record.parent not in seen:
        out.append(record.parent)
        seen.add(record.parent)
        record = tenants.get(record.parent)
    return out


def _sums(codes: I64, size: int, *weights: np.ndarray) -> list[list[float]]:
    """Per code, the sum of each weight column: `out[code][k]`."""
    if codes.size == 0:
        return [[0.0] * len(weights) for _ in range(size)]
    columns = [np.bincount(codes, weights=w, minlength=size).tolist() for w in weights]
    return [list(values) for values in zip(*columns, strict=True)]


def _group_rows(cols: Columns, query: ReportQuery, edges: list[float], got: Pieces) -> list[Row]:
    if got.row.size == 0:
        return []
    # One integer per (bucket, key...), bucket most significant so rows come out in time order;
    # compacted whenever the mixed radix would grow too large for an int64.
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
    hours = np.bincount(inverse, weights=got.gpu_hours).tolist()
    cost = np.bincount(inverse, weights=got.cost_usd).tolist()
    count = np.bincount(inverse).tolist()
    # Decode each group back from any one of its pieces (all of a group's share its key and bucket).
    first = np.zeros(keys.size, dtype=np.int64)
    first[inverse] = np.arange(inverse.size)
    rows_of = got.row[first]
    bucket_of = got.bucket[first].tolist()
    # Built column-wise with zip and map (C loops): a five-dimension daily report has a row for
    # nearly every piece, and a Python loop per row doubled its time.
    labels = [list(map(c.labels.__getitem__, c.codes[rows_of].tolist())) for c in coded]
    keys_of = list(zip(*labels, strict=True)) if labels else [()] * keys.size
    starts = list(map(edges.__getitem__, bucket_of)) if query.bucket is not None else [None] * keys.size
    return list(map(Row, keys_of, starts, hours, cost, count))


def compute_report(
    intervals: Iterable[LedgerInterval],
    tenants: Sequence[TenantRecord],
    query: ReportQuery,
    *,
    provisioned: Iterable[ProvisionedInterval] = (),
) -> Report:
    """The report `query` asks for; `provisioned` pool intervals add idle cost (every-tenant view)."""
    allowed = query.tenants
    listed = list(intervals)
    idle = (
        ()
        if allowed is not None
        else tuple(idle_cost(provisioned, listed, start_s=query.start_s, end_s=query.until_s))
    )
    if allowed is not None:
        listed = [iv for iv in listed if iv.tenant in allowed]
    now = query.now_s
    cols = Columns(listed, now_s=now)
    by_name = {t.name: t for t in tenants}
    q_start, q_end = query.start_s, query.until_s

    day_edges = bucket_edges(q_start, q_end, Bucket.DAY)
    daily = split(cols, np.array(day_edges), q_start, q_end)
    if query.bucket is Bucket.DAY:
        rows = _group_rows(cols, query, day_edges, daily)
    else:
        edges = bucket_edges(q_start, q_end, query.bucket)
        rows = _group_rows(cols, query, edges, split(cols, np.array(edges), q_start, q_end))

    tenant = cols.coded("tenant")
    n_tenants = len(tenant.labels)
    per_day = np.bincount(daily.bucket * n_tenants + tenant.codes[daily.row], weights=daily.cost_usd)
    daily_cost = tuple(
        (day_edges[k // n_tenants], tenant.labels[k % n_tenants], c)
        for k, c in enumerate(per_day.tolist())
        if c > 0.0
    )
    gpu = cols.coded("gpu_type")
    by_type = np.bincount(gpu.codes[daily.row], weights=daily.gpu_hours, minlength=len(gpu.labels))
    period = _sums(tenant.codes[daily.row], n_tenants, daily.gpu_hours, daily.cost_usd)

    # This month's figures, for budgets and the forecast, whatever the report's period.
    month0, month1 = month_start_s(now), next_month_s(now)
    keep, a, b = clip(cols, month0, min(now, month1))
    hours = cols.gpu_count[keep] * (b - a) / 3600.0
    month = _sums(tenant.codes[keep], n_tenants, hours, hours * cols.usd_per_gpu_hour[keep])
    keep, a, b = clip(cols, now - WEEK_S, now)
    hours = cols.gpu_count[keep] * (b - a) / 3600.0
    week = _sums(tenant.codes[keep], n_tenants, hours, hours * cols.usd_per_gpu_hour[keep])

    # Roll each tenant's figures up its chain of ancestors: [period h, $, month h, $, week h, $].
    totals: dict[TenantId, list[float]] = {}
    for code, name in enumerate(tenant.labels):
        figures = [*period[code], *month[code], *week[code]]
        for who in _ancestors(by_name, TenantId(name)):
            acc = totals.setdefault(who, [0.0] * 6)
            for i, v in enumerate(figures):
                acc[i] += v

    shown = sorted(set(totals) | set(by_name) if allowed is None else set(allowed))
    period_h = (q_end - q_start) / 3600.0
    left_s = max(0.0, month1 - max(now, month0))
    elapsed_s = max(0.0, min(now, month1) - month0)
    summaries = []
    for name in shown:
        record = by_name.get(name)
        f = totals.get(name, [0.0] * 6)
        guaranteed = sum(q.guaranteed_gpus for q in record.quotas) if record is not None else 0
        if query.forecast is ForecastBasis.LAST_7_DAYS:
            rate_h, rate_usd = f[4] / WEEK_S, f[5] / WEEK_S
        else:
            rate_h = f[2] / elapsed_s if elapsed_s > 0 else 0.0
            rate_usd = f[3] / elapsed_s if elapsed_s > 0 else 0.0
        summaries.append(
            TenantSummary(
                tenant=name,
                gpu_hours=f[0],
                cost_usd=f[1],
                quota_share=f[0] / (guaranteed * period_h) if guaranteed and period_h > 0 else None,
                monthly_budget_gpu_hours=None if record is None else record.monthly_budget_gpu_hours,
                month_gpu_hours=f[2],
                month_cost_usd=f[3],
                forecast_month_gpu_hours=f[2] + rate_h * left_s,
                forecast_month_cost_usd=f[3] + rate_usd * left_s,
                forecast_basis=query.forecast,
            )
        )
    return Report(
        query=query,
        rows=tuple(rows),
        total_gpu_hours=math.fsum(r.gpu_hours for r in rows),
        total_cost_usd=math.fsum(r.cost_usd for r in rows),
        tenants=tuple(summaries),
        daily_cost_by_tenant=daily_cost,
        gpu_hours_by_type=tuple(
            (label, h) for label, h in zip(gpu.labels, by_type.tolist(), strict=True) if h > 0.0
        ),
        idle=idle,
    )
