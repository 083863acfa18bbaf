"""The API's reads of the history store (issue 19): what ListJobs, the reports and ListAudit need
from SQL beyond the `HistoryStore` protocol's own calls.

Synchronous, like the store: callers on the event loop run each function on a worker thread
(`asyncio.to_thread`), one call per request. Three reads the protocol does not offer are written
here against the store's tables (`federation.history.schema`) and decoded with its own row codecs
(`federation.history.rows`), so a row reads back exactly as the store wrote it:

* `list_archived`: ListJobs' page of archived jobs in either order (the protocol's `list_jobs`
  walks oldest first only), with the user filter in SQL and the cluster filter on the decoded
  records (the placement lives inside the record's JSON).
* `archived_intervals`: the closed intervals that overlap a period, found through the interval-days
  table's day index, so that a report over both stores can run the same arithmetic on them as on
  etcd's intervals and leave out of etcd's side the ids SQL already holds.
* `audit_before`: audit records newest first, before a position, for ListAudit's pages.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime
from typing import ParamSpec, TypeVar

from sqlalchemy import and_, or_, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from federation.history import rows, schema
from federation.history.errors import HistoryUnavailable
from federation.history.model import ArchivedAudit, ArchivedJob
from federation.history.protocol import HistoryStore
from federation.history.sql_store import SqlHistoryStore
from federation.store.intervals import IntervalEnd, LedgerInterval
from federation.store.jobs import JobRecord
from placement.model import CapacityKind, ClusterName, GpuType, JobId, JobPhase, TenantId

ListKey = tuple[float, str]
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
)
# Rows read per round trip while filters the SQL cannot apply (cluster) drop some of them.
_BATCH = 500


P = ParamSpec("P")
R = TypeVar("R")


def _answers(read: Callable[P, R]) -> Callable[P, R]:
    """A database that does not answer is UNAVAILABLE (retryable), not an unknown error."""

    @functools.wraps(read)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return read(*args, **kwargs)
        except OperationalError as error:
            raise HistoryUnavailable(f"history database: {error.orig}") from error

    return guarded


@_answers
def get_job(history: HistoryStore, job_id: JobId) -> ArchivedJob | None:
    return history.get_job(job_id)


def _engine(history: HistoryStore) -> Engine:
    if not isinstance(history, SqlHistoryStore):
        raise TypeError(f"history reads need the SQL history store, got {type(history).__name__}")
    return history.engine


@_answers
def list_archived(
    history: HistoryStore,
    *,
    tenant: TenantId | None,
    phases: frozenset[JobPhase],
    wants: Callable[[JobRecord], bool],
    user: str,
    since_s: float | None,
    after: ListKey | None,
    newest_first: bool,
    count: int,
) -> list[JobRecord]:
    """The first `count` archived jobs past `after` in list order (or in reverse) that `wants`."""
    j = schema.jobs
    key = (j.c.submitted_at_s, j.c.job_id)
    stmt = select(j.c.record_json, j.c.submitted_at_s, j.c.job_id)
    if tenant is not None:
        stmt = stmt.where(j.c.tenant == tenant)
    if phases:
        stmt = stmt.where(j.c.phase.in_(sorted(p.value for p in phases)))
    if user:
        stmt = stmt.where(j.c.user_name == user)
    if since_s is not None:
        stmt = stmt.where(j.c.submitted_at_s >= since_s)
    order = (key[0].desc(), key[1].desc()) if newest_first else key
    found: list[JobRecord] = []
    position = after
    with _engine(history).connect() as conn:
        while len(found) < count:
            page = stmt
            if position is not None:
                at, job_id = position
                # Written out rather than as a row-value comparison: both dialects use the index.
                if newest_first:
                    page = page.where(or_(key[0] < at, and_(key[0] == at, key[1] < job_id)))
                else:
                    page = page.where(or_(key[0] > at, and_(key[0] == at, key[1] > job_id)))
            got = conn.execute(page.order_by(*order).limit(_BATCH)).all()
            for record_json, _at, _id in got:
                job = rows.record_from_row(record_json)
                if wants(job):
                    found.append(job)
                    if len(found) == count:
                        break
            if len(got) < _BATCH:
                break
            position = (float(got[-1][1]), str(got[-1][2]))
    return found


def _day(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%d")


@_answers
def archived_intervals(
    history: HistoryStore, since_s: float, until_s: float, tenant: TenantId | None
) -> list[LedgerInterval]:
    """Every archived interval that held GPUs within [since_s, until_s), whole (not clipped)."""
    d, i = schema.usage_days, schema.intervals
    ids = select(d.c.interval_id).where(d.c.day >= _day(since_s), d.c.day <= _day(until_s))
    ids = ids.where(d.c.start_s < until_s, d.c.end_s > since_s)
    if tenant is not None:
        ids = ids.where(d.c.tenant == tenant)
    columns = [i.c[name] for name in _INTERVAL_COLUMNS]
    stmt = select(*columns).where(i.c.interval_id.in_(ids.distinct()))
    kinds = {k.value: k for k in CapacityKind}
    ends = {e.value: e for e in IntervalEnd}
    with _engine(history).connect() as conn:
        # Plain tuples into the value type, positionally: a month's report may read 100,000 rows,
        # and the mapping rows and dict round trip of `rows.interval_from_row` doubled the time.
        return [
            LedgerInterval(
                JobId(job_id),
                int(attempt),
                TenantId(tenant),
                user,
                ClusterName(cluster),
                provider,
                region,
                GpuType(gpu_type),
                int(gpu_count),
                kinds[kind],
                float(start_s),
                float(end_s),
                float(price),
                ends.get(ended),
                job_name,
            )
            for (
                job_id,
                attempt,
                tenant,
                user,
                cluster,
                provider,
                region,
                gpu_type,
                gpu_count,
                kind,
                start_s,
                end_s,
                price,
                ended,
                job_name,
            ) in conn.execute(stmt)
        ]


@_answers
def audit_before(history: HistoryStore, before_s: float | None, limit: int) -> list[ArchivedAudit]:
    """Up to `limit` archived audit records at or before `before_s`, newest first."""
    a = schema.audit
    stmt = select(a)
    if before_s is not None:
        stmt = stmt.where(a.c.at_s <= before_s)
    stmt = stmt.order_by(a.c.at_s.desc(), a.c.audit_id.desc()).limit(limit)
    with _engine(history).connect() as conn:
        return [rows.audit_from_row(r) for r in conn.execute(stmt).mappings()]
