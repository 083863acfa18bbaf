"""`SqlHistoryStore`: the history store on SQLAlchemy Core, one implementation for SQLite and
PostgreSQL (the only dialect-specific part is the conflict clause of the idempotent insert).

Idempotence: a batch inserts its jobs' rows with ON CONFLICT DO NOTHING RETURNING job_id, and
writes the attempts, intervals, usage days and rollups of only the jobs it inserted, all in the
batch's one transaction (and the kept log tails of every job, each a no-op where its key is there
already). So an archived job is always whole, a job already there is left as it was (its first copy
stays), and two writers racing on one job (a deposed leader still finishing a
batch) cannot count its usage twice: PostgreSQL makes the second wait on the key, then skip it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Table, and_, func, or_, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.sql.dml import Insert

from federation.errors import InvalidArgument
from federation.history import report_sql, rows, schema, usage_sql
from federation.history.engine import migrate_if_behind, open_engine
from federation.history.errors import HistoryUnavailable
from federation.history.model import (
    MAX_AUDIT_LIMIT,
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
from federation.history.protocol import HistoryStore
from federation.history.sums import ReportAnswer, ReportRead
from placement.model import JobId

# Keeps each `IN (...)` and each multi-row VALUES well under SQLite's 32,766 bound parameters.
_CHUNK = 500


def _chunks(items: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


class SqlHistoryStore:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._dialect = engine.dialect.name

    @classmethod
    def open(cls, dsn: str) -> SqlHistoryStore:
        """Open the database and bring its schema to the newest revision."""
        engine = open_engine(dsn)
        try:
            migrate_if_behind(engine)
        except OperationalError as error:
            engine.dispose()
            raise HistoryUnavailable(f"history database at {engine.url!r}: {error.orig}") from error
        return cls(engine)

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        self._engine.dispose()

    def _insert(self, table: Table) -> Insert:
        if self._dialect == "postgresql":
            return postgresql.insert(table).on_conflict_do_nothing()
        return sqlite.insert(table).on_conflict_do_nothing()

    def _put(self, conn: Connection, table: Table, values: list[dict[str, Any]]) -> None:
        if values:
            conn.execute(self._insert(table), values)

    def _insert_new(self, conn: Connection, table: Table, values: list[dict[str, Any]]) -> set[str]:
        """Insert the rows that are not there yet; the primary keys of those this call inserted.

        RETURNING answers only rows actually inserted: a row another writer committed first (or
        commits while this waits on its key) is not returned, so its children are not written twice.
        """
        if not values:
            return set()
        key = table.primary_key.columns.values()[0]
        inserted: set[str] = set()
        for chunk in _chunks(values):
            inserted.update(conn.execute(self._insert(table).returning(key), list(chunk)).scalars())
        return inserted

    # ---- writes

    def write_jobs(self, jobs: Sequence[ArchivedJob]) -> int:
        try:
            with self._engine.begin() as conn:
                new_ids = self._insert_new(conn, schema.jobs, [rows.job_row(j) for j in jobs])
                new = [j for j in jobs if j.record.job_id in new_ids]
                self._put(
                    conn,
                    schema.attempts,
                    [rows.attempt_row(j.record.job_id, a) for j in new for a in j.attempts],
                )
                self._put(
                    conn,
                    schema.waits,
                    [rows.wait_row(j.record.job_id, seq, w) for j in new for seq, w in enumerate(j.waits)],
                )
                self._put(conn, schema.intervals, [rows.interval_row(iv) for j in new for iv in j.intervals])
                # Tails of every job of the batch, not only the new ones: a job an older archiver
                # wrote without them (and crashed before deleting) gains them; one already there is
                # left as it was (its primary key). In chunks: a gang's tails may be megabytes.
                for chunk in _chunks([rows.kept_log_row(k) for j in jobs for k in j.logs]):
                    self._put(conn, schema.kept_logs, list(chunk))
                days = [day for j in new for iv in j.intervals for day in rows.usage_day_rows(iv)]
                self._put(conn, schema.usage_days, days)
                # Only rows this transaction inserted are added, so a rewrite never counts twice.
                usage_sql.add_to_rollups(conn, self._dialect, days)
                return len(new)
        except OperationalError as error:
            raise HistoryUnavailable(f"history write of {len(jobs)} jobs: {error.orig}") from error

    def write_audit(self, records: Sequence[ArchivedAudit]) -> int:
        try:
            with self._engine.begin() as conn:
                return len(self._insert_new(conn, schema.audit, [rows.audit_row(r) for r in records]))
        except OperationalError as error:
            raise HistoryUnavailable(
                f"history write of {len(records)} audit records: {error.orig}"
            ) from error

    def prune_kept_logs(self, *, kept_before_s: float, limit: int) -> int:
        k = schema.kept_logs
        if limit < 1:
            raise InvalidArgument(f"limit: must be at least 1, got {limit}")
        # The oldest `limit` by the kept-time index, then those rows by key: one short transaction
        # (no DELETE ... LIMIT on PostgreSQL), so a large backlog never holds the table long.
        oldest = (
            select(k.c.job_id, k.c.attempt, k.c.task, k.c.replica)
            .where(k.c.kept_at_s < kept_before_s)
            .order_by(k.c.kept_at_s)
            .limit(limit)
        )
        try:
            with self._engine.begin() as conn:
                keys = [tuple(r) for r in conn.execute(oldest)]
                if not keys:
                    return 0
                key = tuple_(k.c.job_id, k.c.attempt, k.c.task, k.c.replica)
                deleted = 0
                for chunk in _chunks(keys):
                    deleted += conn.execute(k.delete().where(key.in_(list(chunk)))).rowcount
                return deleted
        except OperationalError as error:
            raise HistoryUnavailable(f"history prune of kept logs: {error.orig}") from error

    # ---- reads

    def kept_logs(self, job_id: JobId, attempt: int) -> list[KeptLog]:
        k = schema.kept_logs
        stmt = select(k).where(k.c.job_id == job_id, k.c.attempt == attempt).order_by(k.c.task, k.c.replica)
        with self._engine.connect() as conn:
            return [rows.kept_log_from_row(r) for r in conn.execute(stmt).mappings()]

    def get_job(self, job_id: JobId) -> ArchivedJob | None:
        with self._engine.connect() as conn:
            record_json = conn.execute(
                select(schema.jobs.c.record_json, schema.jobs.c.ended_at_s).where(
                    schema.jobs.c.job_id == job_id
                )
            ).one_or_none()
            if record_json is None:
                return None
            a, w, i = schema.attempts, schema.waits, schema.intervals
            attempts = conn.execute(select(a).where(a.c.job_id == job_id).order_by(a.c.attempt))
            waits = conn.execute(select(w).where(w.c.job_id == job_id).order_by(w.c.seq))
            intervals = conn.execute(select(i).where(i.c.job_id == job_id).order_by(i.c.attempt))
            return ArchivedJob(
                record=rows.record_from_row(record_json[0]),
                ended_at_s=float(record_json[1]),
                attempts=tuple(rows.attempt_from_row(r) for r in attempts.mappings()),
                waits=tuple(rows.wait_from_row(r) for r in waits.mappings()),
                intervals=tuple(rows.interval_from_row(r) for r in intervals.mappings()),
            )

    def held_copies(self, job_ids: Sequence[JobId]) -> dict[JobId, HeldCopy]:
        j, k = schema.jobs, schema.kept_logs
        records: dict[JobId, str] = {}
        logs: dict[JobId, dict[tuple[int, str, int], bytes]] = {}
        try:
            with self._engine.connect() as conn:
                for chunk in _chunks(sorted(set(job_ids))):
                    found = conn.execute(select(j.c.job_id, j.c.record_json).where(j.c.job_id.in_(chunk)))
                    records.update((JobId(row[0]), str(row[1])) for row in found)
                    tails = conn.execute(
                        select(k.c.job_id, k.c.attempt, k.c.task, k.c.replica, k.c.data).where(
                            k.c.job_id.in_(chunk)
                        )
                    )
                    for job_id, attempt, task, replica, data in tails:
                        # psycopg answers bytea as memoryview on some paths.
                        where = (int(attempt), str(task), int(replica))
                        logs.setdefault(JobId(job_id), {})[where] = bytes(data)
        except OperationalError as error:
            raise HistoryUnavailable(f"history read of {len(job_ids)} archived jobs: {error.orig}") from error
        return {job_id: HeldCopy(text, logs.get(job_id, {})) for job_id, text in records.items()}

    def archived_ids(self, job_ids: Sequence[JobId]) -> set[JobId]:
        found: set[JobId] = set()
        with self._engine.connect() as conn:
            for chunk in _chunks(sorted(set(job_ids))):
                result = conn.execute(select(schema.jobs.c.job_id).where(schema.jobs.c.job_id.in_(chunk)))
                found.update(JobId(row[0]) for row in result)
        return found

    def list_jobs(self, query: JobFilter) -> JobPage:
        j = schema.jobs
        key = (j.c.submitted_at_s, j.c.job_id)
        stmt = select(j.c.record_json, j.c.submitted_at_s, j.c.job_id)
        if query.tenant is not None:
            stmt = stmt.where(j.c.tenant == query.tenant)
        if query.phases:
            stmt = stmt.where(j.c.phase.in_(sorted(p.value for p in query.phases)))
        if query.user:
            stmt = stmt.where(j.c.user_name == query.user)
        if query.name_prefix:
            stmt = stmt.where(j.c.name.startswith(query.name_prefix, autoescape=True))
        if query.since_s is not None:
            stmt = stmt.where(j.c.submitted_at_s >= query.since_s)
        if query.after is not None:
            at, job_id = query.after
            # Written out rather than as a row-value comparison: both dialects use the index.
            if query.newest_first:
                stmt = stmt.where(or_(key[0] < at, and_(key[0] == at, key[1] < job_id)))
            else:
                stmt = stmt.where(or_(key[0] > at, and_(key[0] == at, key[1] > job_id)))
        order = (key[0].desc(), key[1].desc()) if query.newest_first else key
        stmt = stmt.order_by(*order).limit(query.page_size + 1)
        with self._engine.connect() as conn:
            found = conn.execute(stmt).all()
        page = found[: query.page_size]
        more = len(found) > query.page_size
        return JobPage(
            jobs=tuple(rows.record_from_row(r[0]) for r in page),
            next_after=(float(page[-1][1]), str(page[-1][2])) if more else None,
        )

    def usage(self, query: UsageQuery) -> list[UsageRow]:
        with self._engine.connect() as conn:
            return usage_sql.usage(conn, query)

    def list_audit(
        self, *, since_s: float | None = None, after: tuple[float, str] | None = None, limit: int = 1000
    ) -> list[ArchivedAudit]:
        if not 1 <= limit <= MAX_AUDIT_LIMIT:
            raise InvalidArgument(f"limit: must be between 1 and {MAX_AUDIT_LIMIT}, got {limit}")
        a = schema.audit
        stmt = select(a)
        if since_s is not None:
            stmt = stmt.where(a.c.at_s >= since_s)
        if after is not None:
            stmt = stmt.where(tuple_(a.c.at_s, a.c.audit_id) > tuple_(*after))
        stmt = stmt.order_by(a.c.at_s, a.c.audit_id).limit(limit)
        with self._engine.connect() as conn:
            return [rows.audit_from_row(r) for r in conn.execute(stmt).mappings()]

    def list_audit_newest(self, *, before_s: float | None = None, limit: int = 1000) -> list[ArchivedAudit]:
        # No upper bound here: ListAudit asks for one more than its own bound to know if more is left.
        if limit < 1:
            raise InvalidArgument(f"limit: must be at least 1, got {limit}")
        a = schema.audit
        stmt = select(a)
        if before_s is not None:
            stmt = stmt.where(a.c.at_s <= before_s)
        stmt = stmt.order_by(a.c.at_s.desc(), a.c.audit_id.desc()).limit(limit)
        with self._engine.connect() as conn:
            return [rows.audit_from_row(r) for r in conn.execute(stmt).mappings()]

    def intervals_page(self, query: IntervalQuery) -> IntervalPage:
        with self._engine.connect() as conn:
            return report_sql.intervals_page(conn, query)

    def read_report(self, read: ReportRead) -> ReportAnswer:
        with self._snapshot() as conn:
            return ReportAnswer(
                sums=tuple(report_sql.sums(conn, q) for q in read.sums),
                edges=() if read.edges is None else report_sql.edges(conn, read.edges),
                held=report_sql.held(conn, read.check),
            )

    @contextmanager
    def _snapshot(self) -> Iterator[Connection]:
        """A connection whose statements all read one snapshot of the database.

        PostgreSQL: REPEATABLE READ (its default, READ COMMITTED, takes a new snapshot per
        statement). SQLite: an explicit BEGIN, since Python's driver opens a transaction only before
        a write and would run each SELECT on its own; in WAL mode a read transaction sees the
        database as of its first read, and never blocks the archiver's writes.
        """
        with self._engine.connect() as conn:
            if self._dialect == "postgresql":
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
                # Begun here, not on the first statement SQLAlchemy runs: the reads may all run on
                # the DBAPI cursor (`report_sql._fetch`), and the rollback below must end them.
                conn.begin()
            else:
                conn.exec_driver_sql("BEGIN")
            try:
                yield conn
            finally:
                conn.rollback()

    def counts(self) -> HistoryCounts:
        with self._engine.connect() as conn:

            def count(table: Table) -> int:
                return int(conn.execute(select(func.count()).select_from(table)).scalar_one())

            return HistoryCounts(
                jobs=count(schema.jobs),
                intervals=count(schema.intervals),
                audit=count(schema.audit),
                kept_logs=count(schema.kept_logs),
            )


def _is_a_history_store(store: SqlHistoryStore) -> HistoryStore:
    # mypy checks here that the implementation keeps to the protocol the archiver and readers use.
    return store
