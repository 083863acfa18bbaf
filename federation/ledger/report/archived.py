"""A report's sums over archived closed intervals: what to ask the history store, and its answer as
`ReportSums` to add to etcd's (`sums.interval_sums`).

The store sums in SQL (`HistoryStore.read_report`); this module
only says which sums a report needs and reads them back:

0. the report's rows: its grouping and bucket over its period (ISO weeks as bucket start days);
1. tenant x day over the period: the daily cost chart, and each tenant's period figures (summed
   here over the days);
2. GPU type over the period: GPU-hours by type (asked apart from 1., whose rows it would multiply
   by the GPU types: a year by tenant and day is 15,000 rows, by tenant, type and day 90,000);
3. per tenant, this calendar month up to now (budget, forecast);
4. per tenant, the last seven days (forecast).

Each is a GROUP BY the store answers from its rollups where they serve (whole months; whole days by
tenant and GPU type) and from the interval-days elsewhere (`federation.history.report_sql`).

An empty window (a period that starts after now, a month that starts now) is not asked for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache

from federation.history.model import GroupBy, IntervalKey, Period
from federation.history.sums import EdgesQuery, ReportAnswer, ReportRead, SumsQuery
from federation.ledger.report.idle import add_edges
from federation.ledger.report.query import (
    Bucket,
    ReportQuery,
    bucket_edges,
    month_start_s,
    next_month_s,
    utc_s,
)
from federation.ledger.report.sums import WEEK_S, ReportSums, TenantSums, interval_sums
from federation.store.intervals import LedgerInterval

_PERIODS = {Bucket.DAY: Period.DAY, Bucket.MONTH: Period.MONTH}


@dataclass(frozen=True, slots=True)
class ArchivedRead:
    """The read to send, and where each of the report's sums sits in it (None: not asked)."""

    read: ReportRead
    rows: int | None
    daily: int | None
    by_type: int | None
    month: int | None
    week: int | None


@lru_cache(maxsize=4096)
def _start_s(bucket: str) -> float:
    # 'YYYY-MM' (a month) or 'YYYY-MM-DD' (a day, or a week's Monday): its first instant, UTC.
    return utc_s(bucket if len(bucket) == 10 else f"{bucket}-01")


def _day(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%d")


def report_read(
    query: ReportQuery,
    *,
    check: tuple[IntervalKey, ...],
    idle_sites: frozenset[tuple[str, str]] | None,
) -> ArchivedRead:
    sums: list[SumsQuery] = []

    def ask(q: SumsQuery) -> int:
        sums.append(q)
        return len(sums) - 1

    q_start, q_end, now = query.start_s, query.until_s, query.now_s
    rows = daily = by_type = month = week = None
    if q_end > q_start:
        group_by = tuple(GroupBy(d.value) for d in query.group_by)
        period = None if query.bucket is None else _PERIODS.get(query.bucket)
        starts: tuple[str, ...] = ()
        if query.bucket is Bucket.WEEK:
            starts = tuple(_day(e) for e in bucket_edges(q_start, q_end, Bucket.WEEK)[:-1])
        rows = ask(SumsQuery(q_start, q_end, group_by, period, starts, query.tenants))
        daily = ask(
            SumsQuery(q_start, q_end, (GroupBy.TENANT,), Period.DAY, (), query.tenants, count_intervals=False)
        )
        by_type = ask(
            SumsQuery(q_start, q_end, (GroupBy.GPU_TYPE,), None, (), query.tenants, count_intervals=False)
        )
    month_end = min(now, next_month_s(now))
    if month_end > month_start_s(now):
        month = ask(
            SumsQuery(
                month_start_s(now),
                month_end,
                (GroupBy.TENANT,),
                None,
                (),
                query.tenants,
                count_intervals=False,
            )
        )
    week = ask(
        SumsQuery(now - WEEK_S, now, (GroupBy.TENANT,), None, (), query.tenants, count_intervals=False)
    )
    edges = None
    if idle_sites and q_end > q_start:
        edges = EdgesQuery(q_start, q_end, idle_sites)
    return ArchivedRead(ReportRead(tuple(sums), edges, check), rows, daily, by_type, month, week)


def _per_tenant(answer: ReportAnswer, index: int | None) -> TenantSums:
    out: TenantSums = {}
    for r in () if index is None else answer.sums[index]:
        out[r.keys[0]] = [r.gpu_seconds, r.cost_micro_usd]
    return out


def archived_sums(asked: ArchivedRead, answer: ReportAnswer, query: ReportQuery) -> ReportSums:
    out = ReportSums()
    if asked.rows is not None:
        for r in answer.sums[asked.rows]:
            start = None if query.bucket is None or r.bucket is None else _start_s(r.bucket)
            out.rows[(start, r.keys)] = [r.gpu_seconds, r.cost_micro_usd, float(r.intervals)]
    if asked.daily is not None:
        for r in answer.sums[asked.daily]:
            (tenant,) = r.keys
            day = _start_s(str(r.bucket))
            out.daily_cost[(day, tenant)] = out.daily_cost.get((day, tenant), 0.0) + r.cost_micro_usd
            acc = out.period.setdefault(tenant, [0.0, 0.0])
            acc[0] += r.gpu_seconds
            acc[1] += r.cost_micro_usd
    if asked.by_type is not None:
        for r in answer.sums[asked.by_type]:
            (gpu,) = r.keys
            out.by_type[gpu] = out.by_type.get(gpu, 0.0) + r.gpu_seconds
    out.month = _per_tenant(answer, asked.month)
    out.week = _per_tenant(answer, asked.week)
    for e in answer.edges:
        add_edges(out.used, (e.cluster, e.gpu_type), e.at_s, e.delta)
    return out


def both_stores(
    live: Iterable[LedgerInterval],
    query: ReportQuery,
    asked: ArchivedRead,
    answer: ReportAnswer,
    *,
    idle_sites: frozenset[tuple[str, str]] | None,
) -> ReportSums:
    """etcd's intervals summed here plus the store's sums, each interval once: etcd's copy of an
    interval the store holds (`answer.held`, read in the same snapshot as its sums) is left out."""
    if answer.held:
        live = [iv for iv in live if (iv.job_id, iv.attempt) not in answer.held]
    sums = interval_sums(live, query, idle_sites=idle_sites)
    sums.add(archived_sums(asked, answer, query))
    return sums
