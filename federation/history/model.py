"""The values the history store takes and gives: archived jobs and audit records, job filters with
keyset pagination, and usage queries with their rows. Validated on construction, so a bad request
fails with the field it got wrong before any SQL runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from federation.errors import InvalidArgument
from federation.store.intervals import LedgerInterval
from federation.store.jobs import JobRecord
from placement.model import JobPhase, TenantId
from placement.model_plan import WaitReason

# The same bounds as ListJobs on the live path, so a client pages both stores alike.
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
MAX_AUDIT_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class ArchivedAttempt:
    """One attempt's kept summary (`federation.joblogs.archive`'s `_attempt` JSON), kept as JSON
    here: the history keeps what joblogs wrote without depending on the room above it."""

    attempt: int
    summary: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class KeptLog:
    """One replica's kept log tail (`federation.joblogs.archive`'s `<task>-<replica>` key), moved to
    SQL with its job. `kept_at_s` is when the attempt was kept (its summary's `kept_at_s`): readers
    serve a tail only within `logs.retainHours` of it, and the leader prunes it from SQL after.
    `data` is the bytes as kept, stamps and all: binary-safe, read back exactly."""

    job_id: str
    attempt: int
    task: str
    replica: int
    kept_at_s: float
    data: bytes

    def __post_init__(self) -> None:
        if self.attempt < 1:
            raise InvalidArgument(
                f"job {self.job_id}: kept log of attempt {self.attempt}; attempts start at 1"
            )


@dataclass(frozen=True, slots=True)
class HeldCopy:
    """What the history holds of one archived job, for the archiver's check before it deletes the
    job from etcd: its record as stored (the JSON text `write_jobs` wrote) and its kept tails' bytes
    by (attempt, task, replica)."""

    record_json: str
    logs: Mapping[tuple[int, str, int], bytes]


@dataclass(frozen=True, slots=True)
class WaitSnapshot:
    """The wait reasons a scheduling cycle gave the job, and when."""

    at_s: float
    reasons: tuple[WaitReason, ...]


@dataclass(frozen=True, slots=True)
class ArchivedJob:
    """An ended job with everything kept about it. Its events live inside `record`."""

    record: JobRecord
    ended_at_s: float
    attempts: tuple[ArchivedAttempt, ...] = ()
    intervals: tuple[LedgerInterval, ...] = ()
    waits: tuple[WaitSnapshot, ...] = ()
    # The attempts' kept log tails, every replica of every attempt still kept in etcd when archived.
    # Written with the job; `get_job` leaves them out (megabytes a gang), `kept_logs` reads them.
    logs: tuple[KeptLog, ...] = ()

    def __post_init__(self) -> None:
        if not self.record.phase.is_terminal:
            raise InvalidArgument(
                f"job {self.record.job_id}: phase {self.record.phase} has not ended;"
                " only ended jobs are archived"
            )
        for i, iv in enumerate(self.intervals):
            if iv.end_s is None:
                raise InvalidArgument(f"job {self.record.job_id}: intervals[{i}] is still open")
            if iv.job_id != self.record.job_id:
                raise InvalidArgument(f"job {self.record.job_id}: intervals[{i}] belongs to job {iv.job_id}")
        for i, kept in enumerate(self.logs):
            if kept.job_id != self.record.job_id:
                raise InvalidArgument(f"job {self.record.job_id}: logs[{i}] belongs to job {kept.job_id}")


@dataclass(frozen=True, slots=True)
class ArchivedAudit:
    """One admin action. `audit_id` is its etcd key's suffix (`<ns time>-<random>`): unique, so it
    is the primary key that makes a second archive of the same record a no-op."""

    audit_id: str
    at_s: float
    user: str
    role: str
    action: str
    target: str
    detail: str = ""


# (submitted_at_s, job_id): the live ListJobs order, so one page token shape serves both stores.
ListPosition = tuple[float, str]


@dataclass(frozen=True, slots=True)
class JobFilter:
    """ListJobs' filters plus `since_s` (submitted at or after). `tenant` None: every tenant; the
    caller decides what a principal may ask for (`security.auth.listable_tenant`)."""

    tenant: TenantId | None = None
    phases: frozenset[JobPhase] = frozenset()
    name_prefix: str = ""
    since_s: float | None = None
    page_size: int = DEFAULT_PAGE_SIZE
    after: ListPosition | None = None
    # Only this user's jobs ("" for everyone's): ListJobs' `user` filter.
    user: str = ""
    # Newest first (`after` is then the position the walk continues below), for ListJobs' default order.
    newest_first: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.page_size <= MAX_PAGE_SIZE:
            raise InvalidArgument(f"page_size: must be between 1 and {MAX_PAGE_SIZE}, got {self.page_size}")


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: tuple[JobRecord, ...]
    # Where the next page starts; None when this was the last.
    next_after: ListPosition | None


class GroupBy(StrEnum):
    TENANT = "tenant"
    USER = "user"
    CLUSTER = "cluster"
    PROVIDER = "provider"
    GPU_TYPE = "gpu_type"
    KIND = "kind"
    # Migration 0007: the job set ("" for a job submitted alone) and the sweep (the set where it is
    # a sweep, else ""), from the interval-days only: the rollups do not keep sets.
    SET = "set"
    SWEEP = "sweep"


class Period(StrEnum):
    DAY = "day"
    MONTH = "month"


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """GPU-hours and cost of closed intervals within [since_s, until_s), clipped to it, grouped by
    `group_by` and optionally by UTC day or month. `tenant` narrows to one tenant (isolation)."""

    since_s: float
    until_s: float
    group_by: tuple[GroupBy, ...] = ()
    period: Period | None = None
    tenant: TenantId | None = None

    def __post_init__(self) -> None:
        if not self.until_s > self.since_s:
            raise InvalidArgument(f"until_s: must be after since_s ({self.until_s} <= {self.since_s})")
        if len(set(self.group_by)) != len(self.group_by):
            raise InvalidArgument(f"group_by: names a dimension twice ({', '.join(self.group_by)})")


@dataclass(frozen=True, slots=True)
class UsageRow:
    # The values of the query's `group_by`, in its order.
    keys: tuple[str, ...]
    # 'YYYY-MM-DD' or 'YYYY-MM' when the query has a period; None otherwise.
    period: str | None
    gpu_hours: float
    cost_usd: float


@dataclass(frozen=True, slots=True)
class HistoryCounts:
    jobs: int
    intervals: int
    audit: int
    kept_logs: int = 0


# (day 'YYYY-MM-DD', interval id): where a walk of the archived intervals continues.
IntervalPosition = tuple[str, str]
# (job id, attempt): an interval's identity in both stores (its etcd key and its SQL row).
IntervalKey = tuple[str, int]
MAX_INTERVAL_PAGE = 10_000


@dataclass(frozen=True, slots=True)
class IntervalQuery:
    """Archived intervals that held GPUs within [since_s, until_s), whole (not clipped), a page at a
    time. `tenants` None: every tenant; otherwise only theirs (the caller's isolation rule)."""

    since_s: float
    until_s: float
    tenants: frozenset[TenantId] | None = None
    after: IntervalPosition | None = None
    limit: int = 5000

    def __post_init__(self) -> None:
        if not self.until_s > self.since_s:
            raise InvalidArgument(f"until_s: must be after since_s ({self.until_s} <= {self.since_s})")
        if not 1 <= self.limit <= MAX_INTERVAL_PAGE:
            raise InvalidArgument(f"limit: must be between 1 and {MAX_INTERVAL_PAGE}, got {self.limit}")


@dataclass(frozen=True, slots=True)
class IntervalPage:
    intervals: tuple[LedgerInterval, ...]
    # Where the next page starts; None when this was the last.
    next_after: IntervalPosition | None
