"""GPU-hours and cost from the usage ledger, grouped, bucketed, with quota share, budget and forecast.

Each interval is clipped to the report's period (an open one runs to min(now, end)) and, with time
buckets, split exactly at their boundaries; GPU-hours are GPUs x hours held, cost is GPU-hours x the
price in force when the attempt started. A month of 100,000 intervals is one pass of plain arithmetic
(`bench/report.py` measures it).

Per tenant (an organisation's figures include its teams'):
- share of quota used: GPU-hours used / (guaranteed GPUs, summed over types, x hours in the period);
- budget: this calendar month's GPU-hours against `monthlyBudgetGpuHours`, and what is left;
- forecast: this month so far, extrapolated to the month's end at the month-to-date rate.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from federation.ledger import LedgerInterval
from federation.records import TenantRecord
from federation.report.query import (
    Bucket,
    Dim,
    ReportQuery,
    bucket_end_s,
    bucket_start_s,
    month_start_s,
    next_month_s,
)
from placement.model import TenantId


@dataclass(frozen=True, slots=True)
class Row:
    # One value per grouping dimension, in the query's order.
    key: tuple[str, ...]
    # Start of the time bucket (None without buckets).
    bucket_start_s: float | None
    gpu_hours: float
    cost_usd: float
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

    @property
    def budget_left_gpu_hours(self) -> float | None:
        if self.monthly_budget_gpu_hours is None:
            return None
        return self.monthly_budget_gpu_hours - self.month_gpu_hours


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


def _key_of(dims: tuple[Dim, ...]) -> Callable[[LedgerInterval], tuple[str, ...]]:
    """A function from an interval to its row key, built once per report rather than per interval."""
    fields = [("kind" if d is Dim.KIND else d.value) for d in dims]
    get = attrgetter(*fields)
    kind_at = fields.index("kind") if "kind" in fields else None

    def key(iv: LedgerInterval) -> tuple[str, ...]:
        got = get(iv)
        values: list[Any] = list(got) if len(fields) > 1 else [got]
        if kind_at is not None:
            values[kind_at] = values[kind_at].value
        return tuple(values)

    return key


_DAY = Bucket.DAY


def pieces(start: float, end: float, bucket: Bucket) -> list[tuple[float, float, float]]:
    """(bucket start, piece start, piece end) for [start, end) split at the bucket's boundaries."""
    b = bucket_start_s(start, bucket)
    b_end = bucket_end_s(b, bucket)
    if end <= b_end:
        # Most intervals fit in one bucket: no loop, no list growth.
        return [(b, start, end)]
    out = []
    while start < end:
        piece_end = min(end, b_end)
        out.append((b, start, piece_end))
        start, b = piece_end, b_end
        b_end = bucket_end_s(b, bucket)
    return out


def _ancestors(tenants: Mapping[TenantId, TenantRecord], tenant: TenantId) -> list[TenantId]:
    out, seen = [tenant], {tenant}
    record = tenants.get(tenant)
    while record is not None and record.parent is not None and record.parent not in seen:
        out.append(record.parent)
        seen.add(record.parent)
        record = tenants.get(record.parent)
    return out


def compute_report(
    intervals: Iterable[LedgerInterval], tenants: Sequence[TenantRecord], query: ReportQuery
) -> Report:
    q_start, q_end = query.start_s, min(query.end_s, max(query.now_s, query.start_s))
    month0, month1 = month_start_s(query.now_s), next_month_s(query.now_s)
    allowed = query.tenants
    by_name = {t.name: t for t in tenants}
    dims = query.group_by
    bucket = query.bucket

    rows: dict[tuple[tuple[str, ...], float | None], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    tenant_hours: dict[TenantId, list[float]] = defaultdict(lambda: [0.0, 0.0])
    month_hours: dict[TenantId, list[float]] = defaultdict(lambda: [0.0, 0.0])
    daily: dict[tuple[float, str], float] = defaultdict(float)
    by_type: dict[str, float] = defaultdict(float)

    key_of = _key_of(dims)
    lineage: dict[TenantId, list[TenantId]] = {}
    for iv in intervals:
        if allowed is not None and iv.tenant not in allowed:
            continue
        chain = lineage.get(iv.tenant)
        if chain is None:
            chain = lineage[iv.tenant] = _ancestors(by_name, iv.tenant)
        start = iv.start_s
        end = query.now_s if iv.end_s is None else min(iv.end_s, query.now_s)
        if end <= start:
            continue
        gpus, price = iv.gpu_count, iv.usd_per_gpu_hour
        # This month's figures, for budgets and the forecast, whatever the report's period.
        m_start, m_end = max(start, month0), min(end, month1)
        if m_end > m_start:
            hours = gpus * (m_end - m_start) / 3600.0
            for who in chain:
                acc = month_hours[who]
                acc[0] += hours
                acc[1] += hours * price
        p_start, p_end = max(start, q_start), min(end, q_end)
        if p_end <= p_start:
            continue
        key = key_of(iv)
        hours = gpus * (p_end - p_start) / 3600.0
        cost = hours * price
        for who in chain:
            acc = tenant_hours[who]
            acc[0] += hours
            acc[1] += cost
        by_type[iv.gpu_type] += hours
        for day, a, b in pieces(p_start, p_end, _DAY):
            daily[(day, iv.tenant)] += gpus * (b - a) / 3600.0 * price
        if bucket is None:
            row = rows[(key, None)]
            row[0] += hours
            row[1] += cost
            row[2] += 1
        else:
            for b_start, a, b in pieces(p_start, p_end, bucket):
                piece = gpus * (b - a) / 3600.0
                row = rows[(key, b_start)]
                row[0] += piece
                row[1] += piece * price
                row[2] += 1

    period_h = (q_end - q_start) / 3600.0
    elapsed = max(0.0, min(query.now_s, month1) - month0)
    scale = (month1 - month0) / elapsed if elapsed > 0 else 0.0
    shown_tenants = sorted(
        (set(tenant_hours) | set(month_hours) | {t.name for t in tenants})
        if allowed is None
        else set(allowed)
    )
    summaries = []
    for name in shown_tenants:
        record = by_name.get(name)
        used = tenant_hours.get(name, [0.0, 0.0])
        month = month_hours.get(name, [0.0, 0.0])
        guaranteed = sum(q.guaranteed_gpus for q in record.quotas) if record is not None else 0
        summaries.append(
            TenantSummary(
                tenant=name,
                gpu_hours=used[0],
                cost_usd=used[1],
                quota_share=used[0] / (guaranteed * period_h) if guaranteed and period_h > 0 else None,
                monthly_budget_gpu_hours=None if record is None else record.monthly_budget_gpu_hours,
                month_gpu_hours=month[0],
                month_cost_usd=month[1],
                forecast_month_gpu_hours=month[0] * scale,
                forecast_month_cost_usd=month[1] * scale,
            )
        )
    ordered = sorted(rows.items(), key=lambda item: (item[0][1] or 0.0, item[0][0]))
    out_rows = tuple(Row(key, b, v[0], v[1], int(v[2])) for (key, b), v in ordered)
    return Report(
        query=query,
        rows=out_rows,
        total_gpu_hours=sum(r.gpu_hours for r in out_rows),
        total_cost_usd=sum(r.cost_usd for r in out_rows),
        tenants=tuple(summaries),
        daily_cost_by_tenant=tuple(sorted((d, t, c) for (d, t), c in daily.items())),
        gpu_hours_by_type=tuple(sorted(by_type.items())),
    )
