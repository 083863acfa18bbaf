"""What a finance report asks for: a period, a grouping, time buckets, and which tenants it may see.

Pure values and calendar arithmetic in UTC. Buckets are calendar days, ISO weeks (Monday 00:00) or
calendar months, so a report's rows line up with an invoice's periods.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from enum import StrEnum
from functools import lru_cache
from typing import Any

from placement.model import TenantId


class Dim(StrEnum):
    TENANT = "tenant"
    USER = "user"
    CLUSTER = "cluster"
    PROVIDER = "provider"
    GPU_TYPE = "gpu_type"
    KIND = "kind"
    # The job set an interval's job was released from ("" for a job submitted alone), and the same
    # for sweeps only ("" for every job that is no sweep's trial). A set's name is its tenant's own:
    # a report by either is also by tenant (`with_set_tenant`), so two tenants' sets of one name
    # never share a row.
    SET = "set"
    SWEEP = "sweep"


SET_DIMS = frozenset({Dim.SET, Dim.SWEEP})


def with_set_tenant(group_by: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """The grouping with the tenant just before the first set or sweep when it lacks one: a set is
    named within its tenant, so rows by set alone would add up two tenants' sets of the same name."""
    if Dim.TENANT in group_by or not SET_DIMS & set(group_by):
        return group_by
    at = next(i for i, d in enumerate(group_by) if d in SET_DIMS)
    return (*group_by[:at], Dim.TENANT, *group_by[at:])


class Bucket(StrEnum):
    DAY = "day"
    WEEK = "week"
    MONTH = "month"


class ForecastBasis(StrEnum):
    """The rate a month-end forecast extrapolates at, from now to the end of the month."""

    # This month's usage so far over the time elapsed: steady, slow to see a change in pace.
    MONTH_TO_DATE = "month_to_date"
    # The last seven days' usage over seven days: follows a recent ramp up or down.
    LAST_7_DAYS = "last_7_days"


_DAY, _WEEK = Bucket.DAY, Bucket.WEEK


@dataclass(frozen=True, slots=True)
class ReportQuery:
    start_s: float
    end_s: float
    now_s: float
    group_by: tuple[Dim, ...] = (Dim.TENANT,)
    bucket: Bucket | None = None
    # None: every tenant. Otherwise only these (a member's report names its own tenant only).
    tenants: frozenset[TenantId] | None = None
    forecast: ForecastBasis = ForecastBasis.MONTH_TO_DATE

    def __post_init__(self) -> None:
        if self.end_s <= self.start_s:
            raise ValueError("a report's period must end after it starts")
        # Frozen: the one place a grouping is completed, so every path (etcd's sums, SQL's, the
        # renderers' headers) sees the same columns.
        object.__setattr__(self, "group_by", with_set_tenant(tuple(self.group_by)))

    @property
    def until_s(self) -> float:
        """Where counting stops: the period's end, or now if that is earlier (nothing counts ahead)."""
        return min(self.end_s, max(self.now_s, self.start_s))

    @classmethod
    def this_month(cls, now_s: float, **kw: Any) -> ReportQuery:
        """The calendar month (UTC) that `now_s` falls in; it counts up to now."""
        return cls(start_s=month_start_s(now_s), end_s=next_month_s(now_s), now_s=now_s, **kw)

    @classmethod
    def last_month(cls, now_s: float, **kw: Any) -> ReportQuery:
        """The calendar month (UTC) before the one `now_s` falls in."""
        this = month_start_s(now_s)
        return cls(start_s=month_start_s(this - 1.0), end_s=this, now_s=now_s, **kw)

    @classmethod
    def between(cls, start: str | date, end: str | date, *, now_s: float, **kw: Any) -> ReportQuery:
        """[start, end) from ISO dates or date-times, read as UTC (`2026-11-01`, `2026-11-01T12:00`)."""
        return cls(start_s=utc_s(start), end_s=utc_s(end), now_s=now_s, **kw)


def utc_s(when: str | date) -> float:
    """Seconds since the epoch of an ISO date or date-time; without a zone it is UTC."""
    if isinstance(when, str):
        when = datetime.fromisoformat(when.replace("Z", "+00:00"))
    if not isinstance(when, datetime):
        when = datetime(when.year, when.month, when.day)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def month_start_s(at_s: float) -> float:
    return _month_of_day(int(at_s // 86400.0))


@lru_cache(maxsize=8192)
def _month_of_day(day: int) -> float:
    # Memoised by day: a month's worth of intervals asks for the same 30 answers again and again.
    at = datetime.fromtimestamp(day * 86400.0, UTC)
    return datetime(at.year, at.month, 1, tzinfo=UTC).timestamp()


def next_month_s(at_s: float) -> float:
    return _next_month(month_start_s(at_s))


@lru_cache(maxsize=1024)
def _next_month(month_s: float) -> float:
    at = datetime.fromtimestamp(month_s, UTC)
    nxt = at.replace(year=at.year + 1, month=1) if at.month == 12 else at.replace(month=at.month + 1)
    return nxt.timestamp()


DAY_S = 86400.0
WEEK_S = 7 * DAY_S
# 1970-01-01 was a Thursday: ISO weeks start 4 days later, on Monday 1970-01-05.
_MONDAY_S = 4 * DAY_S


def bucket_start_s(at_s: float, bucket: Bucket) -> float:
    # Days and weeks by arithmetic on the UTC epoch (no leap seconds in POSIX time): a report splits
    # hundreds of thousands of intervals, and a datetime per piece would dominate its time. The
    # enum members are compared as module constants: attribute lookups on the class cost more.
    if bucket is _DAY:
        return at_s - at_s % DAY_S
    if bucket is _WEEK:
        return at_s - (at_s - _MONDAY_S) % WEEK_S
    return month_start_s(at_s)


def bucket_end_s(start_s: float, bucket: Bucket) -> float:
    if bucket is _DAY:
        return start_s + DAY_S
    if bucket is _WEEK:
        return start_s + WEEK_S
    return next_month_s(start_s)


def bucket_edges(since_s: float, until_s: float, bucket: Bucket | None) -> list[float]:
    """Bucket boundaries from the one holding `since_s` to the first at or after `until_s`."""
    if bucket is None:
        return [since_s, until_s]
    edges = [bucket_start_s(since_s, bucket)]
    while edges[-1] < until_s:
        edges.append(bucket_end_s(edges[-1], bucket))
    if len(edges) == 1:
        edges.append(bucket_end_s(edges[0], bucket))
    return edges


def bucket_label(start_s: float, bucket: Bucket) -> str:
    at = datetime.fromtimestamp(start_s, UTC)
    if bucket is Bucket.MONTH:
        return at.strftime("%Y-%m")
    if bucket is Bucket.WEEK:
        year, week, _ = at.isocalendar()
        return f"{year}-W{week:02d}"
    return at.strftime("%Y-%m-%d")


def iso_utc(at_s: float) -> str:
    if at_s % 86400.0 == 0:
        return _iso_day(at_s)
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@lru_cache(maxsize=8192)
def _iso_day(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
