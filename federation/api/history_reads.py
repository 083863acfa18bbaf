"""The API's reads of the history store (issue 19): what GetJob, ListJobs, the reports, the ledger
listing and ListAudit need from SQL, all through the `HistoryStore` protocol.

Synchronous, like the store: callers on the event loop run each function on a worker thread
(`asyncio.to_thread`), one call per request. Each function turns a database that does not answer
into `HistoryUnavailable` (UNAVAILABLE, retryable):

* `list_archived`: ListJobs' page of archived jobs in either order, with the store's filters (tenant,
  phases, user, since) in SQL and the cluster filter on the decoded records (the placement lives
  inside the record's JSON), walking the store's pages until enough jobs pass.
* `read_report`: a finance report's sums over archived intervals, computed in SQL.
* `archived_intervals`: the closed intervals that overlap a period, whole, for the reads that need
  one row per interval (ListLedger, the FOCUS export), read a page at a time.
* `audit_before`: audit records newest first, before a position, for ListAudit's pages.
* `kept_logs`: an archived attempt's kept log tails, for StreamLogs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from sqlalchemy.exc import OperationalError

from federation.history.errors import HistoryUnavailable
from federation.history.model import (
    MAX_PAGE_SIZE,
    ArchivedAudit,
    ArchivedJob,
    IntervalKey,
    IntervalQuery,
    JobFilter,
    KeptLog,
)
from federation.history.protocol import HistoryStore
from federation.history.sums import ReportAnswer, ReportRead
from federation.store.intervals import LedgerInterval
from federation.store.jobs import JobRecord
from placement.model import JobId, JobPhase, TenantId

ListKey = tuple[float, str]
# Jobs per store page while filters the SQL cannot apply (cluster) drop some of them.
_BATCH = MAX_PAGE_SIZE
# Intervals per store page for the per-interval reads.
_INTERVAL_PAGE = 5000


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


@_answers
def kept_logs(history: HistoryStore, job_id: JobId, attempt: int) -> list[KeptLog]:
    return history.kept_logs(job_id, attempt)


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
    found: list[JobRecord] = []
    position = after
    while len(found) < count:
        page = history.list_jobs(
            JobFilter(
                tenant=tenant,
                phases=phases,
                user=user,
                since_s=since_s,
                after=position,
                newest_first=newest_first,
                page_size=_BATCH,
            )
        )
        for job in page.jobs:
            if wants(job):
                found.append(job)
                if len(found) == count:
                    break
        if page.next_after is None:
            break
        position = page.next_after
    return found


@_answers
def read_report(history: HistoryStore, read: ReportRead) -> ReportAnswer:
    return history.read_report(read)


@_answers
def archived_intervals(
    history: HistoryStore, since_s: float, until_s: float, tenant: TenantId | None
) -> tuple[list[LedgerInterval], frozenset[IntervalKey]]:
    """Every archived interval that held GPUs within [since_s, until_s), whole (not clipped), and
    their ids. Read in pages: each round trip is bounded, whatever the period."""
    found: list[LedgerInterval] = []
    after = None
    tenants = None if tenant is None else frozenset({tenant})
    while True:
        page = history.intervals_page(
            IntervalQuery(
                since_s=since_s, until_s=until_s, tenants=tenants, after=after, limit=_INTERVAL_PAGE
            )
        )
        found.extend(page.intervals)
        if page.next_after is None:
            break
        after = page.next_after
    return found, frozenset((iv.job_id, iv.attempt) for iv in found)


@_answers
def audit_before(history: HistoryStore, before_s: float | None, limit: int) -> list[ArchivedAudit]:
    """Up to `limit` archived audit records at or before `before_s`, newest first."""
    return history.list_audit_newest(before_s=before_s, limit=limit)
