"""`HistoryStore`: what the archiver writes to and the read paths read from.

Synchronous on purpose: both drivers (sqlite3, psycopg) block, and one blocking call per batch on a
worker thread (`asyncio.to_thread`) costs less than an async driver's round trips per row. Callers
on the event loop must not call it directly.

Writes are idempotent by primary key: writing a job, interval or audit record that is already
there changes nothing (the first copy stays), so the archiver may repeat a batch after a crash
between its SQL commit and its etcd delete.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from federation.history.model import (
    ArchivedAudit,
    ArchivedJob,
    HeldCopy,
    HistoryCounts,
    IntervalPage,
    IntervalQuery,
    JobFilter,
    JobPage,
    KeptLog,
    UsageQuery,
    UsageRow,
)
from federation.history.sums import ReportAnswer, ReportRead
from placement.model import JobId


class HistoryStore(Protocol):
    def write_jobs(self, jobs: Sequence[ArchivedJob]) -> int:
        """Write the jobs with their attempts, intervals, usage days, waits and kept log tails in one
        transaction.
        Returns how many jobs were new (the rest were already archived and were left as they were,
        but for kept tails they lacked, which are added: each tail is idempotent by its own key)."""
        ...

    def prune_kept_logs(self, *, kept_before_s: float, limit: int) -> int:
        """Delete up to `limit` kept log tails kept before `kept_before_s`, oldest first, in one
        short transaction; returns how many went. The leader calls it batch by batch."""
        ...

    def kept_logs(self, job_id: JobId, attempt: int) -> list[KeptLog]:
        """One attempt's kept tails, by task and replica, whatever their age (the caller applies
        the retention: `logs.retainHours` from `kept_at_s`)."""
        ...

    def held_copies(self, job_ids: Sequence[JobId]) -> dict[JobId, HeldCopy]:
        """What the history holds of those of `job_ids` that are archived (the others are left
        out): each one's stored record and kept tails, read together for a batch (two queries per
        few hundred jobs, on one connection), for the archiver's check before it deletes them."""
        ...

    def write_audit(self, records: Sequence[ArchivedAudit]) -> int:
        """Write audit records in one transaction; returns how many were new."""
        ...

    def get_job(self, job_id: JobId) -> ArchivedJob | None: ...

    def archived_ids(self, job_ids: Sequence[JobId]) -> set[JobId]:
        """Which of these jobs are archived (the collector asks it of gangs whose job etcd no longer
        holds: those are this federation's, and finished)."""
        ...

    def list_jobs(self, query: JobFilter) -> JobPage:
        """Jobs in the live ListJobs order (submitted_at_s, job_id), or its reverse with
        `query.newest_first`, from `query.after`."""
        ...

    def usage(self, query: UsageQuery) -> list[UsageRow]:
        """GPU-hours and cost of archived (closed) intervals, computed in SQL."""
        ...

    def list_audit(
        self, *, since_s: float | None = None, after: tuple[float, str] | None = None, limit: int = 1000
    ) -> list[ArchivedAudit]:
        """Audit records in time order, from `after` (at_s, audit_id) or `since_s`."""
        ...

    def list_audit_newest(self, *, before_s: float | None = None, limit: int = 1000) -> list[ArchivedAudit]:
        """Up to `limit` audit records at or before `before_s`, newest first (ListAudit's pages)."""
        ...

    def intervals_page(self, query: IntervalQuery) -> IntervalPage:
        """A page of the archived intervals that overlap the query's range, whole, each once, in the
        store's own order; a caller reads every page to have them all (the ledger listing, FOCUS)."""
        ...

    def read_report(self, read: ReportRead) -> ReportAnswer:
        """A report's sums over archived intervals, computed in SQL, and which of `read.check` are
        archived, all read from one snapshot (`federation.history.sums`)."""
        ...

    def counts(self) -> HistoryCounts: ...

    def close(self) -> None: ...
