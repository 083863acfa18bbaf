"""`SqlHistoryStore`: the history store on SQLAlchemy Core, one implementation for SQLite and
PostgreSQL (the only dialect-specific part is the conflict clause of the idempotent insert).

Idempotence: a batch first asks which of its jobs are already there and writes only the others,
each with all its rows, in the batch's one transaction; so an archived job is always whole, and a
job found present needs none of its rows written again. The inserts still say ON CONFLICT DO
NOTHING, which covers two writers racing on one job (a deposed leader still finishing a batch).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Table, and_, case, func, literal, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.sql.dml import Insert

from federation.errors import InvalidArgument
from federation.history import rows, schema
from federation.history.engine import migrate, open_engine
from federation.history.errors import HistoryUnavailable
from federation.history.model import (
    MAX_AUDIT_LIMIT,
    ArchivedAudit,
    ArchivedJob,
    GroupBy,
    HistoryCounts,
    JobFilter,
    JobPage,
    Period,
    UsageQuery,
    UsageRow,
)
from placement.model import JobId

# Keeps each `IN (...)` and each multi-row VALUES well under SQLite's 32,766 bound parameters.
_CHUNK = 500

_DIMENSION_COLUMNS = {
    GroupBy.TENANT: "tenant",
    GroupBy.USER: "user_name",
    GroupBy.CLUSTER: "cluster",
    GroupBy.PROVIDER: "provider",
    GroupBy.GPU_TYPE: "gpu_type",
    GroupBy.KIND: "kind",
}


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
            migrate(engine)
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

    def _present(self, conn: Connection, column: ColumnElement[str], keys: Sequence[str]) -> set[str]:
        present: set[str] = set()
        for chunk in _chunks(keys):
            present.update(conn.execute(select(column).where(column.in_(chunk))).scalars())
        return present

    # ---- writes

    def write_jobs(self, jobs: Sequence[ArchivedJob]) -> int:
        try:
            with self._engine.begin() as conn:
                ids = [j.record.job_id for j in jobs]
                present = self._present(conn, schema.jobs.c.job_id, ids)
                new = [j for j in jobs if j.record.job_id not in present]
                self._put(conn, schema.jobs, [rows.job_row(j) for j in new])
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
                self._put(
                    conn,
                    schema.usage_days,
                    [day for j in new for iv in j.intervals for day in rows.usage_day_rows(iv)],
                )
                return len(new)
        except OperationalError as error:
            raise HistoryUnavailable(f"history write of {len(jobs)} jobs: {error.orig}") from error

    def write_audit(self, records: Sequence[ArchivedAudit]) -> int:
        try:
            with self._engine.begin() as conn:
                present = self._present(conn, schema.audit.c.audit_id, [r.audit_id for r in records])
                new = [r for r in records if r.audit_id not in present]
                self._put(conn, schema.audit, [rows.audit_row(r) for r in new])
                return len(new)
        except OperationalError as error:
            raise HistoryUnavailable(
                f"history write of {len(records)} audit records: {error.orig}"
            ) from error

    # ---- reads

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

    def list_jobs(self, query: JobFilter) -> JobPage:
        j = schema.jobs
        stmt = select(j.c.record_json, j.c.submitted_at_s, j.c.job_id)
        if query.tenant is not None:
            stmt = stmt.where(j.c.tenant == query.tenant)
        if query.phases:
            stmt = stmt.where(j.c.phase.in_(sorted(p.value for p in query.phases)))
        if query.name_prefix:
            stmt = stmt.where(j.c.name.startswith(query.name_prefix, autoescape=True))
        if query.since_s is not None:
            stmt = stmt.where(j.c.submitted_at_s >= query.since_s)
        if query.after is not None:
            stmt = stmt.where(tuple_(j.c.submitted_at_s, j.c.job_id) > tuple_(*query.after))
        stmt = stmt.order_by(j.c.submitted_at_s, j.c.job_id).limit(query.page_size + 1)
        with self._engine.connect() as conn:
            found = conn.execute(stmt).all()
        page = found[: query.page_size]
        more = len(found) > query.page_size
        return JobPage(
            jobs=tuple(rows.record_from_row(r[0]) for r in page),
            next_after=(float(page[-1][1]), str(page[-1][2])) if more else None,
        )

    def usage(self, query: UsageQuery) -> list[UsageRow]:
        d = schema.usage_days
        lo = literal(query.since_s, schema.Seconds)
        hi = literal(query.until_s, schema.Seconds)
        # Clip to [since, until); a day wholly inside the range is left as it is.
        start = case((d.c.start_s < lo, lo), else_=d.c.start_s)
        end = case((d.c.end_s > hi, hi), else_=d.c.end_s)
        gpu_seconds = d.c.gpu_count * (end - start)
        keys = [d.c[_DIMENSION_COLUMNS[g]] for g in query.group_by]
        period: list[ColumnElement[Any]] = []
        if query.period is Period.DAY:
            period = [d.c.day]
        elif query.period is Period.MONTH:
            period = [func.substr(d.c.day, 1, 7)]
        conditions = [
            d.c.day >= rows.day_of(query.since_s),
            d.c.day <= rows.day_of(query.until_s),
            d.c.end_s > lo,
            d.c.start_s < hi,
        ]
        if query.tenant is not None:
            conditions.append(d.c.tenant == query.tenant)
        stmt = (
            select(
                *keys,
                *period,
                func.sum(gpu_seconds) / 3600.0,
                func.sum(gpu_seconds * d.c.usd_per_gpu_hour) / 3600.0,
            )
            .where(and_(*conditions))
            .group_by(*keys, *period)
            .order_by(*keys, *period)
        )
        with self._engine.connect() as conn:
            found = conn.execute(stmt).all()
        width = len(keys)
        return [
            UsageRow(
                keys=tuple(str(v) for v in r[:width]),
                period=str(r[width]) if period else None,
                gpu_hours=float(r[-2]),
                cost_usd=float(r[-1]),
            )
            for r in found
            # Without a GROUP BY, SQL answers one row of NULL sums when nothing matched.
            if r[-2] is not None
        ]

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

    def counts(self) -> HistoryCounts:
        with self._engine.connect() as conn:

            def count(table: Table) -> int:
                return int(conn.execute(select(func.count()).select_from(table)).scalar_one())

            return HistoryCounts(
                jobs=count(schema.jobs), intervals=count(schema.intervals), audit=count(schema.audit)
            )
