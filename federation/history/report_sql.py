"""The reads behind finance reports and the ledger listing, in SQL on `history_usage_days` and the
rollups.

* `sums`: GROUP BY sums of interval-days clipped to a range, by any dimensions and a time bucket.
  By set or sweep (migration 0007) only the interval-days answer: no rollup keeps the set.
  Every bucket a report offers starts at a UTC midnight, and a day row never crosses one, so a
  bucket's sum is the sum of its days' rows, and grouping happens on the `day` column itself.
  Interval counts are COUNT(DISTINCT interval_id). Where a rollup keeps the query's dimensions, its
  whole months (`history_usage_months`; no bucket or by month) or whole days
  (`history_usage_tenant_days`; by day) are read there instead, and only the partial ones at the
  range's ends from the days: a year is tens of thousands of rollup rows, not a million day rows.
  A month's interval count is its `intervals`; over several months an interval counts once, in the
  first month of the range it has usage in (see `sums` and `_months_sums`).
* `edges`: how the GPUs in use change over time per (cluster, GPU type), summed per instant in SQL:
  +gpus where a clipped day row starts, -gpus where it ends. A row ending at midnight and the same
  interval's next row starting there cancel, and such zero changes are left out.
* `held`: which interval ids of a list are archived (by primary key).
* `intervals_page`: whole intervals that overlap a range, a page at a time in the days table's key
  order (day, interval_id), each interval once: at its first day row inside the range.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Select,
    String,
    and_,
    bindparam,
    case,
    func,
    literal,
    or_,
    select,
    tuple_,
    union_all,
)
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.compiler import SQLCompiler

from federation.history import rows, schema
from federation.history.model import GroupBy, IntervalKey, IntervalPage, IntervalQuery, Period
from federation.history.sums import EdgesQuery, SumsQuery, SumsRow, UsageEdge
from federation.history.usage_sql import DIMENSION_COLUMNS, SQLITE_DAYS_KEY, key_column, whole_months
from federation.store.intervals import IntervalEnd, LedgerInterval
from federation.store.money import piece_micro_usd
from placement.model import CapacityKind, ClusterName, GpuType, JobId, TenantId

_CHUNK = 500
# The dimensions `history_usage_months` keeps (all but the user), and `history_usage_tenant_days`.
_ROLLUP_DIMENSIONS = frozenset({"tenant", "cluster", "provider", "gpu_type", "kind"})
_TENANT_DAY_DIMENSIONS = frozenset({"tenant", "gpu_type"})
# LedgerInterval's fields in order, as the intervals table names them.
_INTERVAL_COLUMNS = (
    "job_id",
    "attempt",
    "tenant",
    "user_name",
    "cluster",
    "provider",
    "region",
    "gpu_type",
    "gpu_count",
    "kind",
    "start_s",
    "end_s",
    "usd_per_gpu_hour",
    "ended",
    "job_name",
    "job_set",
    "set_kind",
    *rows.OFFER_COLUMNS,
)


def _clipped(lo: ColumnElement[Any], hi: ColumnElement[Any]) -> tuple[ColumnElement[Any], ColumnElement[Any]]:
    d = schema.usage_days
    return case((d.c.start_s < lo, lo), else_=d.c.start_s), case((d.c.end_s > hi, hi), else_=d.c.end_s)


def _in_range(
    lo: ColumnElement[Any], hi: ColumnElement[Any], first_day: Any, last_day: Any
) -> list[ColumnElement[bool]]:
    d = schema.usage_days
    return [d.c.day >= first_day, d.c.day <= last_day, d.c.end_s > lo, d.c.start_s < hi]


# The bound values of a days statement (`_days_statements`), by name: the statement is built once per
# shape and cached, and each read binds its range, tenants and bucket starts. Building it anew took
# most of a report's time (SQLAlchemy's construction, several ms a read; the database's part is less).
_SINCE, _UNTIL = bindparam("since_s", type_=schema.Seconds), bindparam("until_s", type_=schema.Seconds)
_FIRST_DAY, _LAST_DAY = bindparam("first_day", type_=String), bindparam("last_day", type_=String)


def _start(n: int) -> BindParameter[str]:
    return bindparam(f"start_{n}", type_=String)


def _tenants(count: int) -> list[BindParameter[str]]:
    """The tenant filter's values, bound one by one (`tenant_0`...): a statement's shape includes
    how many, so its SQL text is fixed and compiled once (an expanding IN is rendered per execution)."""
    return [bindparam(f"tenant_{n}", type_=String) for n in range(count)]


def _tenant_values(tenants: frozenset[str]) -> dict[str, str]:
    return {f"tenant_{n}": tenant for n, tenant in enumerate(sorted(tenants))}


def _first_last(first: str, last: str, tenants: frozenset[str] | None) -> dict[str, str]:
    """The values of a rollup statement: its range's first and last day or month (`first`,
    `last`) and the tenant filter's (`_tenants`)."""
    bound = {"first": first, "last": last}
    if tenants is not None:
        bound.update(_tenant_values(tenants))
    return bound


@functools.lru_cache(maxsize=1024)
def _driver_form(
    stmt: Select[Any], dialect: Dialect
) -> tuple[str, tuple[str, ...] | None, dict[str, Any], dict[str, Callable[[Any], Any]]]:
    """A cached statement's SQL for the dialect's driver: (text, parameter names in order for a
    positional paramstyle or None for a named one, the values the statement binds itself, the
    conversions the dialect applies to bound values by name: SQLite's float() of a Float's)."""
    compiled = _compiled(stmt, dialect)
    defaults = dict(compiled.construct_params(_check=False))
    order = tuple(compiled.positiontup or ()) if compiled.positional else None
    convert: dict[str, Callable[[Any], Any]] = {}
    for name, f in compiled._bind_processors.items():
        if isinstance(f, Sequence):  # a tuple's, per element: none of these statements binds one
            raise TypeError(f"{name}: `_fetch` binds no tuples")
        if f is not None:
            convert[name] = f
    return compiled.string, order, defaults, convert


@functools.lru_cache(maxsize=1024)
def _compiled(stmt: Select[Any], dialect: Dialect) -> SQLCompiler:
    compiled = stmt.compile(dialect=dialect)
    assert isinstance(compiled, SQLCompiler)
    return compiled


def _fetch_expanded(conn: Connection, stmt: Select[Any], values: Mapping[str, Any]) -> list[Any]:
    """Like `_fetch`, for a statement with an expanding IN (a list of any length): SQLAlchemy's
    compiled form, cached, expands it per execution as its own execution would."""
    compiled = _compiled(stmt, conn.dialect)
    state = compiled.construct_expanded_state(values)
    bound = dict(state.parameters)
    # The statement's own conversions (SQLite's float() of a Float's), then the expanded values'.
    for name, f in {**compiled._bind_processors, **state.processors}.items():
        if isinstance(f, Sequence):  # a tuple's, per element: its expanded names have their own
            continue
        if f is not None and name in bound:
            bound[name] = f(bound[name])
    return _run(conn, state.statement, state.positiontup, bound)


def _fetch(conn: Connection, stmt: Select[Any], values: Mapping[str, Any]) -> list[Any]:
    """The rows of a statement built once per shape, its `values` bound: run on the connection's
    DBAPI cursor (in its transaction) with the SQL compiled once. SQLAlchemy's per-execution work
    (cache key, compiled-cache lookup, parameter processing, result wrapping) was most of a
    report's time; its values come back as the driver's, and every caller converts them itself."""
    sql, order, defaults, convert = _driver_form(stmt, conn.dialect)
    bound = {**defaults, **values}
    for name, f in convert.items():
        bound[name] = f(bound[name])
    return _run(conn, sql, order, bound)


def _run(conn: Connection, sql: str, order: Sequence[str] | None, bound: Mapping[str, Any]) -> list[Any]:
    """`sql` on the connection's DBAPI cursor, in its transaction: its values in `order` for a
    positional paramstyle, by name for a named one (None)."""
    cursor = conn.connection.cursor()
    try:
        cursor.execute(sql, tuple(bound[name] for name in order) if order is not None else bound)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def _bucket(period: Period | None, starts: int) -> ColumnElement[Any] | None:
    """The bucket column: a day, a month, or the last of `starts` bucket starts (bound as
    `start_0`...) on or before the row's day; None for one bucket over the range."""
    d = schema.usage_days
    if period is Period.DAY:
        return d.c.day
    if period is Period.MONTH:
        return func.substr(d.c.day, 1, 7)
    if starts:
        # A day belongs to the last start on or before it. String comparison is date order here.
        # Days before the first start cannot occur: callers start the first bucket at or before
        # `since_s`'s day (and a day outside every bucket would fall in the first one regardless).
        whens = [(d.c.day >= _start(n), _start(n)) for n in reversed(range(1, starts))]
        return case(*whens, else_=_start(0)) if whens else _start(0)
    return None


def sums(conn: Connection, query: SumsQuery) -> tuple[SumsRow, ...]:
    months, days = _rollup_months(query), _rollup_days(query)
    if months is not None:
        first, last = months
        head, tail = query.since_s < first, last < query.until_s
        whole = _months_sums(conn, query, first, last, head=head)
    elif days is not None:
        first, last = days
        head, tail = query.since_s < first, last < query.until_s
        whole = _tenant_days_sums(conn, query, first, last)
    else:
        return _days_sums(conn, query, query.since_s, query.until_s)
    before = _days_sums(conn, query, query.since_s, first) if head else ()
    after = _days_sums(conn, query, last, query.until_s) if tail else ()
    if query.period is not None:
        # By day or month each part has buckets of its own (the head's lies before the first whole
        # day or month, the tail's after the last), and each part comes in (bucket, keys) order: so
        # one after the other they are in order, with nothing to add up (a year by day is 90,000
        # rows, and merging them in a dict here took longer than the SQL).
        return (*before, *whole, *after)
    merged: dict[tuple[str | None, tuple[str, ...]], list[float]] = {}
    parts = (whole, before, after)
    for part in parts:
        for r in part:
            total = merged.setdefault((r.bucket, r.keys), [0.0, 0, 0])
            total[0] += r.gpu_seconds
            total[1] += r.cost_micro_usd
            total[2] += r.intervals
    if tail and query.count_intervals:
        # Over the whole range an interval counts once: one running across `last` was counted in
        # the whole months (or the head), so it leaves the tail's count. Those are the intervals
        # of the tail's month that began before it (it starts at `last`, a month's first instant).
        for keys, carried in _carried_into(conn, query, last):
            found = merged.get((None, keys))
            if found is not None:
                found[2] -= carried
    return tuple(
        SumsRow(keys=keys, bucket=bucket, gpu_seconds=t[0], cost_micro_usd=int(t[1]), intervals=int(t[2]))
        for (bucket, keys), t in sorted(merged.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))
    )


def _rollup_months(query: SumsQuery) -> tuple[float, float] | None:
    """The whole months of the query's range that `history_usage_months` can answer, or None when
    it cannot help: a grouping it does not keep (user), day or week buckets, or no whole month."""
    if query.starts or query.period is Period.DAY:
        return None
    if not all(DIMENSION_COLUMNS[g] in _ROLLUP_DIMENSIONS for g in query.group_by):
        return None
    return whole_months(query.since_s, query.until_s)


def _rollup_days(query: SumsQuery) -> tuple[float, float] | None:
    """The whole UTC days of a by-day query's range that `history_usage_tenant_days` can answer (it
    keeps tenant and GPU type only), or None. Each day is its own bucket, so counts simply add."""
    if query.period is not Period.DAY:
        return None
    if not all(DIMENSION_COLUMNS[g] in _TENANT_DAY_DIMENSIONS for g in query.group_by):
        return None
    first = math.ceil(query.since_s / rows.DAY_S) * rows.DAY_S
    last = math.floor(query.until_s / rows.DAY_S) * rows.DAY_S
    return (first, last) if last > first else None


_FIRST, _LAST = bindparam("first", type_=String), bindparam("last", type_=String)


def _tenant_days_sums(
    conn: Connection, query: SumsQuery, first_s: float, last_s: float
) -> tuple[SumsRow, ...]:
    """Sums by day over the whole days [first_s, last_s) from the day rollup."""
    stmt = _tenant_days_statement(
        query.group_by, query.count_intervals, None if query.tenants is None else len(query.tenants)
    )
    bound = _first_last(rows.day_of(first_s), rows.day_of(last_s), query.tenants)
    return _rows(_fetch(conn, stmt, bound), with_bucket=True, width=len(query.group_by))


@functools.lru_cache(maxsize=256)
def _tenant_days_statement(
    group_by: tuple[GroupBy, ...], count_intervals: bool, tenants: int | None
) -> Select[Any]:
    """`_tenant_days_sums`'s statement by the query's shape, days bound as `first` and `last`."""
    t = schema.usage_tenant_days
    keys = [t.c[DIMENSION_COLUMNS[g]] for g in group_by]
    count = func.sum(t.c.intervals) if count_intervals else literal(0)
    stmt = select(
        t.c.day.label("bucket"), *keys, func.sum(t.c.gpu_seconds), func.sum(t.c.cost_micro_usd), count
    ).where(t.c.day >= _FIRST, t.c.day < _LAST)
    if tenants is not None:
        stmt = stmt.where(t.c.tenant.in_(_tenants(tenants)))
    by: list[ColumnElement[Any] | str] = ["bucket", *keys]
    return stmt.group_by(*by).order_by(*by)


def _months_sums(
    conn: Connection, query: SumsQuery, first_s: float, last_s: float, *, head: bool
) -> tuple[SumsRow, ...]:
    """Sums over the whole months [first_s, last_s) from the rollup. Counts: a month bucket counts
    the month's intervals; one bucket over the range counts each interval in its first month there
    only: the first month's intervals (none of them if a head before it counted them already,
    since an interval running into the first month has a piece in the head too) plus the intervals
    begun in each later month."""
    by_month = query.period is Period.MONTH
    stmt = _months_statement(
        query.group_by,
        by_month,
        query.count_intervals,
        head,
        None if query.tenants is None else len(query.tenants),
    )
    bound = _first_last(rows.month_of(first_s), rows.month_of(last_s), query.tenants)
    return _rows(_fetch(conn, stmt, bound), with_bucket=by_month, width=len(query.group_by))


@functools.lru_cache(maxsize=256)
def _months_statement(
    group_by: tuple[GroupBy, ...], by_month: bool, count_intervals: bool, head: bool, tenants: int | None
) -> Select[Any]:
    """`_months_sums`'s statement by the query's shape, months bound as `first` and `last`."""
    m = schema.usage_months
    keys = [m.c[DIMENSION_COLUMNS[g]] for g in group_by]
    bucket = m.c.month if by_month else None
    grouped = [bucket.label("bucket"), *keys] if bucket is not None else keys
    count: ColumnElement[Any]
    if not count_intervals:
        count = literal(0)
    elif bucket is not None:
        count = func.sum(m.c.intervals)
    elif head:
        count = func.sum(m.c.intervals_begun)
    else:
        count = func.sum(case((m.c.month == _FIRST, m.c.intervals), else_=m.c.intervals_begun))
    stmt = select(*grouped, func.sum(m.c.gpu_seconds), func.sum(m.c.cost_micro_usd), count).where(
        m.c.month >= _FIRST, m.c.month < _LAST
    )
    if tenants is not None:
        stmt = stmt.where(m.c.tenant.in_(_tenants(tenants)))
    if grouped:
        by: list[ColumnElement[Any] | str] = [*(["bucket"] if bucket is not None else []), *keys]
        stmt = stmt.group_by(*by).order_by(*by)
    return stmt


def _carried_into(conn: Connection, query: SumsQuery, month_s: float) -> list[tuple[tuple[str, ...], int]]:
    """Per group, the intervals running across `month_s` (a month's first instant): those with a
    day row in that month that began before it."""
    stmt = _carried_statement(query.group_by, None if query.tenants is None else len(query.tenants))
    bound = {"first": rows.month_of(month_s)}
    if query.tenants is not None:
        bound.update(_tenant_values(query.tenants))
    return [
        (tuple(str(v) for v in r[:-1]), int(r[-1])) for r in _fetch(conn, stmt, bound) if r[-1] is not None
    ]


@functools.lru_cache(maxsize=256)
def _carried_statement(group_by: tuple[GroupBy, ...], tenants: int | None) -> Select[Any]:
    """`_carried_into`'s statement by the query's shape, the month bound as `first`."""
    m = schema.usage_months
    keys = [m.c[DIMENSION_COLUMNS[g]] for g in group_by]
    stmt = select(*keys, func.sum(m.c.intervals - m.c.intervals_begun)).where(m.c.month == _FIRST)
    if tenants is not None:
        stmt = stmt.where(m.c.tenant.in_(_tenants(tenants)))
    if keys:
        stmt = stmt.group_by(*keys)
    return stmt


def _days_sums(conn: Connection, query: SumsQuery, since_s: float, until_s: float) -> tuple[SumsRow, ...]:
    """Sums over [since_s, until_s) from the interval-days, clipped to it; counts are distinct ids.

    Cost: a day row wholly inside the range adds its stored micro-dollars in SQL; the few rows the
    range's ends cut (those running at `since_s` or `until_s`) are read and costed here, by the
    same rule etcd's side uses (`money.piece_micro_usd`), never by SQL's float arithmetic."""
    stmt, cut = _days_statements(
        query.group_by,
        query.period,
        len(query.starts),
        query.count_intervals,
        None if query.tenants is None else len(query.tenants),
    )
    bound: dict[str, Any] = {
        "since_s": since_s,
        "until_s": until_s,
        "first_day": rows.day_of(since_s),
        "last_day": rows.day_of(until_s),
        **{f"start_{n}": start for n, start in enumerate(query.starts)},
    }
    if query.tenants is not None:
        bound.update(_tenant_values(query.tenants))
    with_bucket = query.period is not None or bool(query.starts)
    width = len(query.group_by)
    found = _rows(_fetch(conn, stmt, bound), with_bucket=with_bucket, width=width)
    extra: dict[tuple[str | None, tuple[str, ...]], int] = {}
    first = 1 if with_bucket else 0
    for r in _fetch(conn, cut, bound):
        gpus, a, b, price = r[-4:]
        micro = piece_micro_usd(int(gpus), max(float(a), since_s), min(float(b), until_s), float(price))
        at = (str(r[0]) if with_bucket else None, tuple(map(str, r[first : first + width])))
        extra[at] = extra.get(at, 0) + micro
    if not extra:
        return found
    return tuple(
        SumsRow(
            r.keys, r.bucket, r.gpu_seconds, r.cost_micro_usd + extra.get((r.bucket, r.keys), 0), r.intervals
        )
        for r in found
    )


@functools.lru_cache(maxsize=512)
def _days_statements(
    group_by: tuple[GroupBy, ...],
    period: Period | None,
    starts: int,
    count_intervals: bool,
    tenants: int | None,
) -> tuple[Select[Any], Select[Any]]:
    """(sums, cut) for `_days_sums`, by the query's shape; its values are bound at each read. The
    SQL is what building it per read gave: only SQLAlchemy's construction is saved."""
    d = schema.usage_days
    start, end = _clipped(_SINCE, _UNTIL)
    gpu_seconds = d.c.gpu_count * (end - start)
    inside = and_(d.c.start_s >= _SINCE, d.c.end_s <= _UNTIL)
    keys = [key_column(d, g) for g in group_by]
    bucket = _bucket(period, starts)
    grouped = [bucket.label("bucket"), *keys] if bucket is not None else keys
    count = func.count(func.distinct(d.c.interval_id)) if count_intervals else literal(0)
    in_range = and_(*_in_range(_SINCE, _UNTIL, _FIRST_DAY, _LAST_DAY))
    stmt = select(
        *grouped,
        func.sum(gpu_seconds),
        func.sum(case((inside, d.c.cost_micro_usd), else_=literal(0))),
        count,
    ).where(in_range)
    # A cut row runs at `since_s` or `until_s`, so it lies on the first or the last day (a day row
    # never crosses a midnight): said outright, the key reads those two days, not the whole range.
    cut = select(*grouped, d.c.gpu_count, d.c.start_s, d.c.end_s, d.c.usd_per_gpu_hour).where(
        in_range, or_(d.c.start_s < _SINCE, d.c.end_s > _UNTIL), d.c.day.in_([_FIRST_DAY, _LAST_DAY])
    )
    if tenants is not None:
        stmt = stmt.where(d.c.tenant.in_(_tenants(tenants)))
        cut = cut.where(d.c.tenant.in_(_tenants(tenants)))
    else:
        # As in `usage_sql`: across tenants SQLite's planner would skip-scan (tenant, day) and look
        # every row up; the days' own key reads them in sequence.
        stmt = stmt.with_hint(d, f"INDEXED BY {SQLITE_DAYS_KEY}", "sqlite")
    if grouped:
        # Grouped by the label, not the expression: PostgreSQL binds the CASE's literals afresh in
        # each clause and would not see the select's and the GROUP BY's as the same expression.
        # The bucket first: rows come from the days' key in day order, so SQLite's sort for the
        # GROUP BY finds them nearly in order (measured: about twice as fast over a year as keys first).
        by: list[ColumnElement[Any] | str] = [*(["bucket"] if bucket is not None else []), *keys]
        # In a fixed order: the caller's float sums then add in the same order every time.
        stmt = stmt.group_by(*by).order_by(*by)
    return stmt, cut


def _rows(found: Iterable[Any], *, with_bucket: bool, width: int) -> tuple[SumsRow, ...]:
    first = 1 if with_bucket else 0
    end = first + width
    # Positional and in one expression: a year by day is 90,000 rows, and this loop was most of the
    # read's time when written out with keywords.
    return tuple(
        SumsRow(
            tuple(map(str, r[first:end])),
            str(r[0]) if with_bucket else None,
            float(r[-3]),
            int(r[-2]),
            int(r[-1]),
        )
        for r in found
        # Without a GROUP BY, SQL answers one row of NULL sums when nothing matched.
        if r[-3] is not None
    )


def edges(conn: Connection, query: EdgesQuery) -> tuple[UsageEdge, ...]:
    if not query.sites:
        return ()
    bound = {
        "since_s": query.since_s,
        "until_s": query.until_s,
        "first_day": rows.day_of(query.since_s),
        "last_day": rows.day_of(query.until_s),
        "sites": sorted(query.sites),
    }
    return tuple(
        UsageEdge(str(cluster), str(gpu_type), float(at_s), int(delta))
        for cluster, gpu_type, at_s, delta in _fetch_expanded(conn, _edges_statement(), bound)
        if int(delta) != 0
    )


@functools.cache
def _edges_statement() -> Select[Any]:
    """`edges`' statement, built once: its range and days bound, its sites an expanding IN."""
    d = schema.usage_days
    start, end = _clipped(_SINCE, _UNTIL)
    site = tuple_(d.c.cluster, d.c.gpu_type)
    where = and_(
        *_in_range(_SINCE, _UNTIL, _FIRST_DAY, _LAST_DAY),
        site.in_(bindparam("sites", expanding=True, type_=site.type)),
    )
    starts = select(d.c.cluster, d.c.gpu_type, start.label("at_s"), d.c.gpu_count.label("delta"))
    ends = select(d.c.cluster, d.c.gpu_type, end.label("at_s"), (-d.c.gpu_count).label("delta"))
    moves = union_all(starts.where(where), ends.where(where)).subquery()
    return (
        select(moves.c.cluster, moves.c.gpu_type, moves.c.at_s, func.sum(moves.c.delta))
        .group_by(moves.c.cluster, moves.c.gpu_type, moves.c.at_s)
        .order_by(moves.c.cluster, moves.c.gpu_type, moves.c.at_s)
    )


def held(conn: Connection, keys: Sequence[IntervalKey]) -> frozenset[IntervalKey]:
    by_id = {rows.interval_id(job_id, attempt): (job_id, attempt) for job_id, attempt in keys}
    ids = sorted(by_id)
    found: set[IntervalKey] = set()
    for at in range(0, len(ids), _CHUNK):
        chunk = ids[at : at + _CHUNK]
        found.update(by_id[str(r[0])] for r in _fetch_expanded(conn, _held_statement(), {"ids": chunk}))
    return frozenset(found)


@functools.cache
def _held_statement() -> Select[Any]:
    i = schema.intervals
    return select(i.c.interval_id).where(i.c.interval_id.in_(bindparam("ids", expanding=True)))


def intervals_page(conn: Connection, query: IntervalQuery) -> IntervalPage:
    d, i = schema.usage_days, schema.intervals
    first, last = rows.day_of(query.since_s), rows.day_of(query.until_s)
    stmt = (
        select(*(i.c[name] for name in _INTERVAL_COLUMNS), d.c.day, d.c.interval_id)
        .join_from(d, i, i.c.interval_id == d.c.interval_id)
        .where(
            d.c.day >= first,
            d.c.day <= last,
            # An interval's first day row inside the range: the range's first day, or the day it
            # started on (the only row whose start is the interval's own; later ones start at midnight).
            or_(d.c.day == first, d.c.start_s == i.c.start_s),
            i.c.start_s < query.until_s,
            i.c.end_s > query.since_s,
        )
    )
    if query.tenants is not None:
        stmt = stmt.where(d.c.tenant.in_(sorted(query.tenants)))
    if query.after is not None:
        day, interval_id = query.after
        # Written out rather than as a row-value comparison: both dialects use the key's index.
        stmt = stmt.where(or_(d.c.day > day, and_(d.c.day == day, d.c.interval_id > interval_id)))
    stmt = stmt.order_by(d.c.day, d.c.interval_id).limit(query.limit + 1)
    found = conn.execute(stmt).all()
    page = found[: query.limit]
    kinds = {k.value: k for k in CapacityKind}
    ends = {e.value: e for e in IntervalEnd}
    # Plain tuples into the value type, positionally: a month's listing may read 100,000 rows, and
    # the mapping rows and dict round trip of `rows.interval_from_row` doubled the time.
    intervals = tuple(
        LedgerInterval(
            JobId(r[0]),
            int(r[1]),
            TenantId(r[2]),
            r[3],
            ClusterName(r[4]),
            r[5],
            r[6],
            GpuType(r[7]),
            int(r[8]),
            kinds[r[9]],
            float(r[10]),
            float(r[11]),
            float(r[12]),
            ends.get(r[13]),
            r[14],
            r[15] or "",
            r[16] or "",
            rows.offer_from_columns(int(r[1]), *r[17:22]),
        )
        for r in page
    )
    more = len(found) > query.limit
    return IntervalPage(
        intervals=intervals, next_after=(str(page[-1][22]), str(page[-1][23])) if more else None
    )
