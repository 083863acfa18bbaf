"""GPU-hours and cost from the usage ledger, grouped, bucketed, with quota share, budget and forecast.

Each interval is clipped to the report's period (an open one runs to min(now, end)) and, with time
buckets, split exactly at their boundaries; GPU-hours are GPUs x hours held, cost is GPU-hours x the
price in force when the attempt started. The arithmetic runs on columns (`columns.py`), so a month
of 100,000 intervals takes tens of milliseconds (`bench/report.py`).

A report is computed in two steps: its sums (`sums.ReportSums`: per group and bucket, per tenant and
window, per day), which add, then `finish_report`. `compute_report` sums intervals held in memory;
the API adds to etcd's sums the archived intervals' sums, computed in SQL by the history store
(`archived.py`), so a report over years never reads the archived intervals one by one.

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

from federation.ledger.report.idle import (
    IdleCost,
    ProvisionedInterval,
    idle_cost_from_edges,
    provisioned_sites,
)
from federation.ledger.report.query import (
    Bucket,
    ForecastBasis,
    ReportQuery,
    bucket_edges,
    month_start_s,
    next_month_s,
)
from federation.ledger.report.sums import WEEK_S, ReportSums, interval_sums
from federation.store.intervals import LedgerInterval
from federation.store.money import MICRO_PER_USD
from federation.store.records import TenantRecord
from placement.model import TenantId


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


def compute_report(
    intervals: Iterable[LedgerInterval],
    tenants: Sequence[TenantRecord],
    query: ReportQuery,
    *,
    provisioned: Iterable[ProvisionedInterval] = (),
) -> Report:
    """The report `query` asks for; `provisioned` pool intervals add idle cost (every-tenant view)."""
    pools = list(provisioned)
    sites = idle_sites(pools, query)
    return finish_report(interval_sums(intervals, query, idle_sites=sites), tenants, query, provisioned=pools)


def idle_sites(pools: Sequence[ProvisionedInterval], query: ReportQuery) -> frozenset[tuple[str, str]] | None:
    """The sites whose usage idle cost needs, or None in a report that shows no idle cost (a member's:
    what a pool left idle says what the other tenants used)."""
    if query.tenants is not None:
        return None
    return provisioned_sites(pools, start_s=query.start_s, end_s=query.until_s)


def _hours(figures: list[float]) -> list[float]:
    # [GPU-seconds, micro-dollars, ...] pairs -> [GPU-hours, dollars, ...].
    return [v / (3600.0 if i % 2 == 0 else MICRO_PER_USD) for i, v in enumerate(figures)]


def finish_report(
    sums: ReportSums,
    tenants: Sequence[TenantRecord],
    query: ReportQuery,
    *,
    provisioned: Iterable[ProvisionedInterval] = (),
) -> Report:
    """The report from its sums (`interval_sums` of etcd's intervals, plus SQL's of archived ones)."""
    allowed = query.tenants
    idle = (
        ()
        if allowed is not None
        else tuple(idle_cost_from_edges(provisioned, sums.used, start_s=query.start_s, end_s=query.until_s))
    )
    # Rows in time order, then by key (labels sort as strings), as `interval_sums` groups them.
    ordered = sorted(sums.rows.items(), key=lambda kv: (kv[0][0] or 0.0, kv[0][1]))
    rows = [
        Row(key=key, bucket_start_s=start, gpu_hours=s / 3600.0, cost_usd=c / MICRO_PER_USD, intervals=int(n))
        for (start, key), (s, c, n) in ordered
    ]
    by_name = {t.name: t for t in tenants}
    now = query.now_s
    month0, month1 = month_start_s(now), next_month_s(now)

    # Roll each tenant's figures up its chain of ancestors: [period h, $, month h, $, week h, $].
    totals: dict[TenantId, list[float]] = {}
    zero = [0.0, 0.0]
    for name in sorted(set(sums.period) | set(sums.month) | set(sums.week)):
        # Summed up the tree in GPU-seconds and micro-dollars (exact), converted once below.
        figures = [*sums.period.get(name, zero), *sums.month.get(name, zero), *sums.week.get(name, zero)]
        for who in _ancestors(by_name, TenantId(name)):
            acc = totals.setdefault(who, [0.0] * 6)
            for i, v in enumerate(figures):
                acc[i] += v

    shown = sorted(set(totals) | set(by_name) if allowed is None else set(allowed))
    period_h = (query.until_s - query.start_s) / 3600.0
    left_s = max(0.0, month1 - max(now, month0))
    elapsed_s = max(0.0, min(now, month1) - month0)
    summaries = []
    for name in shown:
        record = by_name.get(name)
        f = _hours(totals.get(name, [0.0] * 6))
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
        # From the integer micro-dollars: exact, whatever the rows' order.
        total_cost_usd=sum(c for (_, c, _) in sums.rows.values()) / MICRO_PER_USD,
        tenants=tuple(summaries),
        daily_cost_by_tenant=tuple(
            (day, tenant, c / MICRO_PER_USD)
            for (day, tenant), c in sorted(sums.daily_cost.items())
            if c > 0.0
        ),
        gpu_hours_by_type=tuple((gpu, s / 3600.0) for gpu, s in sorted(sums.by_type.items()) if s > 0.0),
        idle=idle,
    )
