"""Usage reports in SQL, and keeping the rollups (by month; by day, tenant and GPU type) in step
with the rows they sum.

A report over [since, until) is answered in at most three parts, each one index-backed SQL query:
the whole UTC months inside the range from `history_usage_months` (when the report is not by user
or by day, which the rollup does not keep), and the rest, the partial months at either end or the
whole range, from `history_usage_days`, clipped to the range. The parts are merged by key here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, Table, and_, case, func, literal, literal_column, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from federation.history import rows, schema
from federation.history.model import GroupBy, Period, UsageQuery, UsageRow

DIMENSION_COLUMNS = {
    GroupBy.TENANT: "tenant",
    GroupBy.USER: "user_name",
    GroupBy.CLUSTER: "cluster",
    GroupBy.PROVIDER: "provider",
    GroupBy.GPU_TYPE: "gpu_type",
    GroupBy.KIND: "kind",
    # In `history_usage_days` only (migration 0007): no rollup keeps the set.
    GroupBy.SET: "job_set",
    GroupBy.SWEEP: "sweep",
}
# The dimensions only the interval-days keep: a query by any of them reads no rollup.
DAYS_ONLY = frozenset({GroupBy.USER, GroupBy.SET, GroupBy.SWEEP})
SQLITE_DAYS_KEY = "sqlite_autoindex_history_usage_days_1"
_ROLLUP_KEY = ("month", "tenant", "cluster", "provider", "gpu_type", "kind")
_TENANT_DAY_KEY = ("day", "tenant", "gpu_type")
_ROLLUP_SUMS = (
    "gpu_seconds",
    "cost_usd",
    "cost_gpu_seconds",
    "intervals",
    "intervals_begun",
    "cost_micro_usd",
)

# (group keys, period) -> [gpu_hours, cost_usd]
Sums = dict[tuple[tuple[str, ...], str | None], list[float]]


def month_start_s(year: int, month: int) -> float:
    return datetime(year + (month - 1) // 12, (month - 1) % 12 + 1, 1, tzinfo=UTC).timestamp()


def whole_months(since_s: float, until_s: float) -> tuple[float, float] | None:
    """[first, last) month boundaries inside [since_s, until_s), or None if no whole month fits."""
    start = datetime.fromtimestamp(since_s, UTC)
    first = month_start_s(start.year, start.month)
    if first < since_s:
        first = month_start_s(start.year, start.month + 1)
    end = datetime.fromtimestamp(until_s, UTC)
    last = month_start_s(end.year, end.month)
    return (first, last) if last > first else None


def key_column(table: Table, dim: GroupBy) -> ColumnElement[Any]:
    """A grouping's column in `table`; the sweep is the set where its kind is `sweep`, else "".
    Its CASE has literal strings, not bound values, so that PostgreSQL sees the GROUP BY's
    expression and the select's as the same one."""
    if dim is GroupBy.SWEEP:
        sweep: ColumnElement[str] = literal_column("'sweep'")
        return case((table.c.set_kind == sweep, table.c.job_set), else_=literal_column("''"))
    return table.c[DIMENSION_COLUMNS[dim]]


def _uses_rollup(query: UsageQuery) -> bool:
    return not DAYS_ONLY & set(query.group_by) and query.period is not Period.DAY


def _days_select(query: UsageQuery, since_s: float, until_s: float) -> Select[Any]:
    d = schema.usage_days
    lo = literal(since_s, schema.Seconds)
    hi = literal(until_s, schema.Seconds)
    # Clip to [since, until); rows wholly inside are left as they are.
    start = case((d.c.start_s < lo, lo), else_=d.c.start_s)
    end = case((d.c.end_s > hi, hi), else_=d.c.end_s)
    gpu_seconds = d.c.gpu_count * (end - start)
    keys = [key_column(d, g) for g in query.group_by]
    period: list[ColumnElement[Any]] = []
    if query.period is Period.DAY:
        period = [d.c.day]
    elif query.period is Period.MONTH:
        period = [func.substr(d.c.day, 1, 7)]
    conditions = [
        d.c.day >= rows.day_of(since_s),
        d.c.day <= rows.day_of(until_s),
        d.c.end_s > lo,
        d.c.start_s < hi,
    ]
    stmt = (
        select(
            *keys,
            *period,
            func.sum(gpu_seconds) / 3600.0,
            func.sum(gpu_seconds * d.c.usd_per_gpu_hour) / 3600.0,
        )
        .where(and_(*conditions))
        .group_by(*keys, *period)
    )
    if query.tenant is not None:
        return stmt.where(d.c.tenant == query.tenant)
    # Across tenants SQLite's planner prefers skip-scanning (tenant, day) to save the GROUP BY's
    # sort, then looks every row up: twice as slow as reading the days in key order (measured over
    # 1,000,000 intervals). The key of a WITHOUT ROWID table is this auto-named index.
    return stmt.with_hint(d, f"INDEXED BY {SQLITE_DAYS_KEY}", "sqlite")


def _months_select(query: UsageQuery, first_s: float, last_s: float) -> Select[Any]:
    m = schema.usage_months
    keys = [m.c[DIMENSION_COLUMNS[g]] for g in query.group_by]
    period = [m.c.month] if query.period is Period.MONTH else []
    conditions = [m.c.month >= rows.month_of(first_s), m.c.month < rows.month_of(last_s)]
    if query.tenant is not None:
        conditions.append(m.c.tenant == query.tenant)
    return (
        select(*keys, *period, func.sum(m.c.gpu_seconds) / 3600.0, func.sum(m.c.cost_usd))
        .where(and_(*conditions))
        .group_by(*keys, *period)
    )


def _add(sums: Sums, found: Iterable[Any], width: int, with_period: bool) -> None:
    for r in found:
        if r[-2] is None:
            # Without a GROUP BY, SQL answers one row of NULL sums when nothing matched.
            continue
        key = (tuple(str(v) for v in r[:width]), str(r[width]) if with_period else None)
        total = sums.setdefault(key, [0.0, 0.0])
        total[0] += float(r[-2])
        total[1] += float(r[-1])


def usage(conn: Connection, query: UsageQuery) -> list[UsageRow]:
    width = len(query.group_by)
    with_period = query.period is not None
    sums: Sums = {}
    months = whole_months(query.since_s, query.until_s) if _uses_rollup(query) else None
    if months is None:
        _add(sums, conn.execute(_days_select(query, query.since_s, query.until_s)), width, with_period)
    else:
        first, last = months
        _add(sums, conn.execute(_months_select(query, first, last)), width, with_period)
        for since, until in ((query.since_s, first), (last, query.until_s)):
            if until > since:
                _add(sums, conn.execute(_days_select(query, since, until)), width, with_period)
    return [
        UsageRow(keys=keys, period=period, gpu_hours=total[0], cost_usd=total[1])
        for (keys, period), total in sorted(sums.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))
    ]


def month_rollup_rows(day_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rollup's increments for newly written interval-days, one row per month and key.

    `day_rows` must hold every day row of each interval in it (as `write_jobs` writes whole
    intervals): an interval's first day row, the one that makes it count as begun in its month, is
    its earliest here."""
    listed = list(day_rows)
    first_day: dict[str, str] = {}
    for d in listed:
        seen = first_day.get(d["interval_id"])
        if seen is None or d["day"] < seen:
            first_day[d["interval_id"]] = d["day"]
    # key -> [GPU-seconds, cost in USD, GPU-seconds x price, intervals, intervals begun]
    totals: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0, 0, 0])
    # An interval counts once per month however many of its days fall in it.
    counted: set[tuple[str, str]] = set()
    for d in listed:
        gpu_seconds = d["gpu_count"] * (d["end_s"] - d["start_s"])
        month = d["day"][:7]
        key = (month, d["tenant"], d["cluster"], d["provider"], d["gpu_type"], d["kind"])
        total = totals[key]
        total[0] += gpu_seconds
        total[1] += gpu_seconds * d["usd_per_gpu_hour"] / 3600.0
        total[2] += gpu_seconds * d["usd_per_gpu_hour"]
        total[5] += d["cost_micro_usd"]
        if (d["interval_id"], month) not in counted:
            counted.add((d["interval_id"], month))
            total[3] += 1
        if first_day[d["interval_id"]] == d["day"]:
            total[4] += 1
    return [
        {
            **dict(zip(_ROLLUP_KEY, key, strict=True)),
            "gpu_seconds": t[0],
            "cost_usd": t[1],
            "cost_gpu_seconds": t[2],
            "intervals": int(t[3]),
            "intervals_begun": int(t[4]),
            "cost_micro_usd": int(t[5]),
        }
        for key, t in totals.items()
    ]


def tenant_day_rollup_rows(day_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The day rollup's increments for newly written interval-days, one row per day, tenant and
    GPU type (a day row is one interval's part of one day, so each adds one interval)."""
    totals: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0])
    for d in day_rows:
        gpu_seconds = d["gpu_count"] * (d["end_s"] - d["start_s"])
        total = totals[(d["day"], d["tenant"], d["gpu_type"])]
        total[0] += gpu_seconds
        total[1] += gpu_seconds * d["usd_per_gpu_hour"]
        total[2] += 1
        total[3] += d["cost_micro_usd"]
    return [
        {
            "day": day,
            "tenant": tenant,
            "gpu_type": gpu_type,
            "gpu_seconds": t[0],
            "cost_gpu_seconds": t[1],
            "intervals": int(t[2]),
            "cost_micro_usd": int(t[3]),
        }
        for (day, tenant, gpu_type), t in totals.items()
    ]


def add_to_rollups(conn: Connection, dialect: str, day_rows: list[dict[str, Any]]) -> None:
    """Add newly written interval-days to both rollups (insert, or add to the row already there)."""
    for table, key, increments in (
        (schema.usage_months, _ROLLUP_KEY, month_rollup_rows(day_rows)),
        (schema.usage_tenant_days, _TENANT_DAY_KEY, tenant_day_rollup_rows(day_rows)),
    ):
        if not increments:
            continue
        stmt = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
        upsert = stmt.on_conflict_do_update(
            index_elements=list(key),
            set_={c.name: c + stmt.excluded[c.name] for c in table.columns if c.name not in key},
        )
        conn.execute(upsert, increments)


def rebuild_rollups(conn: Connection) -> None:
    """Recompute both rollups from `history_usage_days`: after a bulk load that bypassed
    `write_jobs`, or to repair a rollup one suspects. In the caller's transaction.

    An interval's first day row is the one starting where the interval starts (the others start at
    a midnight, and one starting at a midnight has its first row start there too). Its rows are one
    per day and contiguous, so in a month it has exactly one row that is its first or falls on the
    month's first day: counting those counts it once, with no COUNT(DISTINCT) (a sort per group).

    Written as SQL text, as migration 0004 fills them, for SQLite's INDEXED BY: its planner would
    walk (tenant, day) and look every row up (measured: about twice as slow over 1,000,000 rows),
    and SQLAlchemy does not render FROM hints for SQLite."""
    in_key_order = f" INDEXED BY {SQLITE_DAYS_KEY}" if conn.dialect.name == "sqlite" else ""
    conn.execute(schema.usage_months.delete())
    conn.exec_driver_sql(
        "INSERT INTO history_usage_months"
        " (month, tenant, cluster, provider, gpu_type, kind, gpu_seconds, cost_usd,"
        " cost_gpu_seconds, intervals, intervals_begun, cost_micro_usd)"
        " SELECT substr(d.day, 1, 7), d.tenant, d.cluster, d.provider, d.gpu_type, d.kind,"
        " SUM(d.gpu_count * (d.end_s - d.start_s)),"
        " SUM(d.gpu_count * (d.end_s - d.start_s) * d.usd_per_gpu_hour) / 3600.0,"
        " SUM(d.gpu_count * (d.end_s - d.start_s) * d.usd_per_gpu_hour),"
        " SUM(CASE WHEN d.start_s = i.start_s OR substr(d.day, 9, 2) = '01' THEN 1 ELSE 0 END),"
        " SUM(CASE WHEN d.start_s = i.start_s THEN 1 ELSE 0 END),"
        " SUM(d.cost_micro_usd)"
        f" FROM history_usage_days d{in_key_order}"
        " JOIN history_intervals i ON i.interval_id = d.interval_id"
        " GROUP BY substr(d.day, 1, 7), d.tenant, d.cluster, d.provider, d.gpu_type, d.kind"
    )
    conn.execute(schema.usage_tenant_days.delete())
    conn.exec_driver_sql(
        "INSERT INTO history_usage_tenant_days"
        " (day, tenant, gpu_type, gpu_seconds, cost_gpu_seconds, intervals, cost_micro_usd)"
        " SELECT day, tenant, gpu_type, SUM(gpu_count * (end_s - start_s)),"
        " SUM(gpu_count * (end_s - start_s) * usd_per_gpu_hour), COUNT(*), SUM(cost_micro_usd)"
        f" FROM history_usage_days{in_key_order} GROUP BY day, tenant, gpu_type"
    )
