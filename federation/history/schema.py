"""The history's tables, as SQLAlchemy Core metadata at the newest migration.

The migrations under `migrations/versions/` create these tables; this module is what queries are
written against. `tests/unit/test_history_migrations.py` checks that the two agree.

Which index serves which query:

* `history_jobs` primary key (job_id): get one job; the idempotent insert's conflict check.
* `ix_history_jobs_submitted` (submitted_at_s, job_id): list across tenants in the live order, from a
  page position (keyset), and `since`.
* `ix_history_jobs_tenant_submitted` (tenant, submitted_at_s, job_id): one tenant's list, so a
  member's page costs what that tenant has, not what the federation has.
* `history_intervals` primary key (interval_id = `<job_id>/<attempt>`, the etcd key's tail): the
  idempotent insert; `ix_history_intervals_job` (job_id): a job's intervals for `describe`.
* `history_usage_days`: every closed interval cut at UTC midnights into one row per day it touched,
  with the dimensions copied in. A report over [since, until) reads only the days in that range:
  the primary key (day, interval_id) for the federation's report, `ix_history_usage_days_tenant_day`
  (tenant, day; migration 0002) for one tenant's. Grouping by day or month groups on the `day`
  column itself, so no interval is split at query time. A report by job set or sweep (migration
  0007: `job_set`, `set_kind`) reads these rows too, through the same two keys.
* `history_usage_months` (migration 0002; interval counts and undivided cost since 0004): the same
  usage summed by month, tenant, cluster, provider, GPU type and kind, kept in step by every
  archive write. A report not grouped by user, by day or by week (`HistoryStore.usage`, and the
  finance report's own rows in `report_sql.sums`) reads whole months here (a year is about 60,000
  rows instead of 1,000,000) and only the partial months at its ends from `history_usage_days`.
  Its primary key starts with the month.
* `history_usage_tenant_days` (migration 0004): usage by day, tenant and GPU type, what every finance
  report asks for by day over its whole period; whole days are read here, partial ones at the
  ends from `history_usage_days`. Its primary key starts with the day.
* `ix_history_audit_at` (at_s, audit_id): the audit trail in time order, from a position.
* `history_kept_logs` (migration 0003) primary key (job_id, attempt, task, replica): one attempt's
  tails for `gpufed logs`, and the idempotent insert; `ix_history_kept_logs_kept_at` (kept_at_s):
  the leader's prune of expired tails, a bounded DELETE from the oldest.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    text,
)

# Double precision on both backends: epoch seconds need more than a 4-byte float's 7 digits.
Seconds = Float(precision=53)
Money = Float(precision=53)

metadata = MetaData()

jobs = Table(
    "history_jobs",
    metadata,
    Column("job_id", String, primary_key=True),
    Column("tenant", String, nullable=False),
    Column("user_name", String, nullable=False),
    Column("name", String, nullable=False),
    Column("phase", String, nullable=False),
    Column("submitted_at_s", Seconds, nullable=False),
    Column("ended_at_s", Seconds, nullable=False),
    # The whole record in the store's own codec (`federation.store.jobs.job_to_dict`), events
    # included: one codec for etcd and SQL, so a record reads back exactly as it was kept.
    Column("record_json", Text, nullable=False),
    Index("ix_history_jobs_submitted", "submitted_at_s", "job_id"),
    Index("ix_history_jobs_tenant_submitted", "tenant", "submitted_at_s", "job_id"),
)

attempts = Table(
    "history_attempts",
    metadata,
    Column("job_id", String, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("summary_json", Text, nullable=False),
    PrimaryKeyConstraint("job_id", "attempt", name="pk_history_attempts"),
)

waits = Table(
    "history_waits",
    metadata,
    Column("job_id", String, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("at_s", Seconds, nullable=False),
    Column("reasons_json", Text, nullable=False),
    PrimaryKeyConstraint("job_id", "seq", name="pk_history_waits"),
)

intervals = Table(
    "history_intervals",
    metadata,
    Column("interval_id", String, primary_key=True),
    Column("job_id", String, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("tenant", String, nullable=False),
    Column("user_name", String, nullable=False),
    Column("cluster", String, nullable=False),
    Column("provider", String, nullable=False),
    Column("region", String, nullable=False),
    Column("gpu_type", String, nullable=False),
    Column("gpu_count", Integer, nullable=False),
    Column("kind", String, nullable=False),
    Column("start_s", Seconds, nullable=False),
    Column("end_s", Seconds, nullable=False),
    Column("usd_per_gpu_hour", Money, nullable=False),
    Column("ended", String, nullable=False),
    Column("job_name", String, nullable=False),
    # Migration 0006: the job's set and its kind ("" for a job submitted alone), and the attempt's
    # burst-at-once offer (all NULL when it had none, or was archived before the revision).
    Column("job_set", String, nullable=False, server_default=text("''")),
    Column("set_kind", String, nullable=False, server_default=text("''")),
    Column("burst_cluster", String, nullable=True),
    Column("burst_gpu_type", String, nullable=True),
    Column("burst_kind", String, nullable=True),
    Column("burst_usd_per_gpu_hour", Money, nullable=True),
    Column("burst_seen_at_s", Seconds, nullable=True),
    Index("ix_history_intervals_job", "job_id"),
)

usage_days = Table(
    "history_usage_days",
    metadata,
    Column("interval_id", String, nullable=False),
    # 'YYYY-MM-DD' (UTC): sorts as it reads, and its first 7 characters are the month on both backends.
    Column("day", String(10), nullable=False),
    # The part of the interval within that day.
    Column("start_s", Seconds, nullable=False),
    Column("end_s", Seconds, nullable=False),
    Column("tenant", String, nullable=False),
    Column("user_name", String, nullable=False),
    Column("cluster", String, nullable=False),
    Column("provider", String, nullable=False),
    Column("gpu_type", String, nullable=False),
    Column("kind", String, nullable=False),
    Column("gpu_count", Integer, nullable=False),
    Column("usd_per_gpu_hour", Money, nullable=False),
    # Migration 0005: this day's part of the interval in whole micro-dollars, rounded once
    # (`federation.store.money.piece_micro_usd`): what every cost in a report adds up, exactly.
    Column("cost_micro_usd", BigInteger, nullable=False),
    # Migration 0007: the interval's job set and the set's kind, copied in as the other dimensions
    # are, for usage reports by set and by sweep ("" for a job submitted alone, and for rows
    # archived before migration 0006 kept the set).
    Column("job_set", String, nullable=False, server_default=text("''")),
    Column("set_kind", String, nullable=False, server_default=text("''")),
    # Day first: the key is the index a period's report reads. On SQLite the table is stored in
    # that order (WITHOUT ROWID), so a month's rows are read in sequence, not looked up one by one.
    PrimaryKeyConstraint("day", "interval_id", name="pk_history_usage_days"),
    Index("ix_history_usage_days_tenant_day", "tenant", "day"),
    sqlite_with_rowid=False,
)

usage_months = Table(
    "history_usage_months",
    metadata,
    # 'YYYY-MM' (UTC).
    Column("month", String(7), nullable=False),
    Column("tenant", String, nullable=False),
    Column("cluster", String, nullable=False),
    Column("provider", String, nullable=False),
    Column("gpu_type", String, nullable=False),
    Column("kind", String, nullable=False),
    Column("gpu_seconds", Seconds, nullable=False),
    Column("cost_usd", Money, nullable=False),
    # Migration 0004, what a finance report (`report_sql.sums`) needs to read whole months here:
    # GPU-seconds x USD per GPU-hour undivided (exact on whole-second times, as the report sums it),
    # the distinct intervals with a day row in the month, and how many of them began in it (their
    # first day row is in this month). A range of whole months counts an interval once: its first
    # month's `intervals` plus the other months' `intervals_begun`.
    Column("cost_gpu_seconds", Money, nullable=False),
    Column("intervals", Integer, nullable=False),
    Column("intervals_begun", Integer, nullable=False),
    # Migration 0005: the sum of the day rows' `cost_micro_usd` (an exact integer sum).
    Column("cost_micro_usd", BigInteger, nullable=False),
    # Users are left out on purpose: with them a month has about as many rows as intervals, and the
    # rollup would save nothing. A report by user reads `history_usage_days`.
    PrimaryKeyConstraint(
        "month", "tenant", "cluster", "provider", "gpu_type", "kind", name="pk_history_usage_months"
    ),
    sqlite_with_rowid=False,
)

usage_tenant_days = Table(
    "history_usage_tenant_days",
    metadata,
    # Migration 0004: the same usage summed by UTC day, tenant and GPU type, kept in step by every
    # archive write. Every finance report asks for exactly this (its daily cost chart, GPU-hours by
    # type, each tenant's period figures) over its whole period: over a year that read every
    # interval-day; here a day has a row per tenant and GPU type in use (about 90,000 for a year of
    # 40 tenants and 6 types, against 1,000,000 interval-days). A day's distinct intervals are its
    # day rows, one per interval, so `intervals` adds up row by row.
    Column("day", String(10), nullable=False),
    Column("tenant", String, nullable=False),
    Column("gpu_type", String, nullable=False),
    Column("gpu_seconds", Seconds, nullable=False),
    Column("cost_gpu_seconds", Money, nullable=False),
    Column("intervals", Integer, nullable=False),
    # Migration 0005: the sum of the day rows' `cost_micro_usd`.
    Column("cost_micro_usd", BigInteger, nullable=False),
    PrimaryKeyConstraint("day", "tenant", "gpu_type", name="pk_history_usage_tenant_days"),
    sqlite_with_rowid=False,
)

audit = Table(
    "history_audit",
    metadata,
    Column("audit_id", String, primary_key=True),
    Column("at_s", Seconds, nullable=False),
    Column("user_name", String, nullable=False),
    Column("role", String, nullable=False),
    Column("action", String, nullable=False),
    Column("target", String, nullable=False),
    Column("detail", Text, nullable=False),
    Index("ix_history_audit_at", "at_s", "audit_id"),
)

kept_logs = Table(
    "history_kept_logs",
    metadata,
    Column("job_id", String, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("task", String, nullable=False),
    Column("replica", Integer, nullable=False),
    # When the attempt was kept: what `logs.retainHours` counts from, on reads and in the prune.
    Column("kept_at_s", Seconds, nullable=False),
    # The bytes as etcd held them (BLOB on SQLite, bytea on PostgreSQL): read back exactly.
    Column("data", LargeBinary, nullable=False),
    PrimaryKeyConstraint("job_id", "attempt", "task", "replica", name="pk_history_kept_logs"),
    Index("ix_history_kept_logs_kept_at", "kept_at_s"),
)
