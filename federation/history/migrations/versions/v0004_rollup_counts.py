"""Interval counts and exact cost in the month rollup, and a day rollup by tenant and GPU type, so
finance reports read rollups rather than every interval-day of a long period.

A finance report (`report_sql.sums`) counts each group's distinct intervals and sums cost as
GPU-seconds x price (exact on whole-second times, unlike 0002's `cost_usd`, which is divided by 3600
per write). Until now that made it read every interval-day of its period. With, per month and key:

* `cost_gpu_seconds`: GPU-seconds x USD per GPU-hour, undivided;
* `intervals`: the distinct intervals with a day row in the month;
* `intervals_begun`: those of them whose first day row is in the month,

a range of whole months counts `intervals` of its first month plus `intervals_begun` of the others
(an interval counts once however many months it spans), and a month bucket counts `intervals`.

`history_usage_tenant_days`: usage by UTC day, tenant and GPU type; every finance report asks for
tenant x day over its whole period (daily cost chart, per-tenant figures).

Both are filled from `history_usage_days` (the month rollup dropped and rebuilt), so they hold the
same figures as if every row had been written with them. An interval's first day row is the one
that starts where the interval starts (later rows start at a midnight; one that starts at a
midnight has a first row starting there too, which is why this compares with the interval's start,
not with midnight).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None

_S = sa.Float(precision=53)
_KEY = ("month", "tenant", "cluster", "provider", "gpu_type", "kind")


def _create(with_counts: bool) -> None:
    extra: list[sa.schema.SchemaItem] = (
        [
            sa.Column("cost_gpu_seconds", _S, nullable=False),
            sa.Column("intervals", sa.Integer, nullable=False),
            sa.Column("intervals_begun", sa.Integer, nullable=False),
        ]
        if with_counts
        else []
    )
    op.create_table(
        "history_usage_months",
        sa.Column("month", sa.String(7), nullable=False),
        sa.Column("tenant", sa.String, nullable=False),
        sa.Column("cluster", sa.String, nullable=False),
        sa.Column("provider", sa.String, nullable=False),
        sa.Column("gpu_type", sa.String, nullable=False),
        sa.Column("kind", sa.String, nullable=False),
        sa.Column("gpu_seconds", _S, nullable=False),
        sa.Column("cost_usd", _S, nullable=False),
        *extra,
        sa.PrimaryKeyConstraint(*_KEY, name="pk_history_usage_months"),
        sqlite_with_rowid=False,
    )


def upgrade() -> None:
    # SQLite's planner would walk (tenant, day) and look every row up; the table's own key reads
    # them in sequence, twice as fast.
    in_key_order = ""
    if op.get_bind().dialect.name == "sqlite":
        in_key_order = " INDEXED BY sqlite_autoindex_history_usage_days_1"
    # Rebuilt rather than altered: the new columns have no default that would be right for old rows,
    # and the fill below reads every day row once either way.
    op.drop_table("history_usage_months")
    _create(with_counts=True)
    op.create_table(
        "history_usage_tenant_days",
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("tenant", sa.String, nullable=False),
        sa.Column("gpu_type", sa.String, nullable=False),
        sa.Column("gpu_seconds", _S, nullable=False),
        sa.Column("cost_gpu_seconds", _S, nullable=False),
        sa.Column("intervals", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("day", "tenant", "gpu_type", name="pk_history_usage_tenant_days"),
        sqlite_with_rowid=False,
    )
    # One day row per interval and day: a day's intervals are its rows.
    op.execute(
        "INSERT INTO history_usage_tenant_days"
        " (day, tenant, gpu_type, gpu_seconds, cost_gpu_seconds, intervals)"
        " SELECT day, tenant, gpu_type, SUM(gpu_count * (end_s - start_s)),"
        " SUM(gpu_count * (end_s - start_s) * usd_per_gpu_hour), COUNT(*)"
        f" FROM history_usage_days{in_key_order} GROUP BY day, tenant, gpu_type"
    )
    # Frozen here rather than imported: a migration must do tomorrow what it did today. An interval's
    # rows are one per day and contiguous, so in a month exactly one of them is its first row or on
    # the month's first day: counting those counts each interval once per month.
    op.execute(
        "INSERT INTO history_usage_months"
        " (month, tenant, cluster, provider, gpu_type, kind, gpu_seconds, cost_usd,"
        " cost_gpu_seconds, intervals, intervals_begun)"
        " SELECT substr(d.day, 1, 7), d.tenant, d.cluster, d.provider, d.gpu_type, d.kind,"
        " SUM(d.gpu_count * (d.end_s - d.start_s)),"
        " SUM(d.gpu_count * (d.end_s - d.start_s) * d.usd_per_gpu_hour) / 3600.0,"
        " SUM(d.gpu_count * (d.end_s - d.start_s) * d.usd_per_gpu_hour),"
        " SUM(CASE WHEN d.start_s = i.start_s OR substr(d.day, 9, 2) = '01' THEN 1 ELSE 0 END),"
        " SUM(CASE WHEN d.start_s = i.start_s THEN 1 ELSE 0 END)"
        f" FROM history_usage_days d{in_key_order} JOIN history_intervals i ON i.interval_id = d.interval_id"
        " GROUP BY substr(d.day, 1, 7), d.tenant, d.cluster, d.provider, d.gpu_type, d.kind"
    )


def downgrade() -> None:
    op.drop_table("history_usage_tenant_days")
    op.drop_table("history_usage_months")
    _create(with_counts=False)
    op.execute(
        "INSERT INTO history_usage_months"
        " (month, tenant, cluster, provider, gpu_type, kind, gpu_seconds, cost_usd)"
        " SELECT substr(day, 1, 7), tenant, cluster, provider, gpu_type, kind,"
        " SUM(gpu_count * (end_s - start_s)), SUM(gpu_count * (end_s - start_s) * usd_per_gpu_hour) / 3600.0"
        " FROM history_usage_days"
        " GROUP BY substr(day, 1, 7), tenant, cluster, provider, gpu_type, kind"
    )
