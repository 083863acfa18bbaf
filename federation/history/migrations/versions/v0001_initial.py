"""The history store's first tables: jobs, attempts, waits, intervals, usage by day, audit.

Revision ID: 0001
Revises: none
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

_S = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "history_jobs",
        sa.Column("job_id", sa.String, primary_key=True),
        sa.Column("tenant", sa.String, nullable=False),
        sa.Column("user_name", sa.String, nullable=False),
        sa.Column("name", sa.String, nullable=False),
        sa.Column("phase", sa.String, nullable=False),
        sa.Column("submitted_at_s", _S, nullable=False),
        sa.Column("ended_at_s", _S, nullable=False),
        sa.Column("record_json", sa.Text, nullable=False),
    )
    op.create_index("ix_history_jobs_submitted", "history_jobs", ["submitted_at_s", "job_id"])
    op.create_index(
        "ix_history_jobs_tenant_submitted", "history_jobs", ["tenant", "submitted_at_s", "job_id"]
    )
    op.create_table(
        "history_attempts",
        sa.Column("job_id", sa.String, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("summary_json", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", name="pk_history_attempts"),
    )
    op.create_table(
        "history_waits",
        sa.Column("job_id", sa.String, nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("at_s", _S, nullable=False),
        sa.Column("reasons_json", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "seq", name="pk_history_waits"),
    )
    op.create_table(
        "history_intervals",
        sa.Column("interval_id", sa.String, primary_key=True),
        sa.Column("job_id", sa.String, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("tenant", sa.String, nullable=False),
        sa.Column("user_name", sa.String, nullable=False),
        sa.Column("cluster", sa.String, nullable=False),
        sa.Column("provider", sa.String, nullable=False),
        sa.Column("region", sa.String, nullable=False),
        sa.Column("gpu_type", sa.String, nullable=False),
        sa.Column("gpu_count", sa.Integer, nullable=False),
        sa.Column("kind", sa.String, nullable=False),
        sa.Column("start_s", _S, nullable=False),
        sa.Column("end_s", _S, nullable=False),
        sa.Column("usd_per_gpu_hour", _S, nullable=False),
        sa.Column("ended", sa.String, nullable=False),
        sa.Column("job_name", sa.String, nullable=False),
    )
    op.create_index("ix_history_intervals_job", "history_intervals", ["job_id"])
    op.create_table(
        "history_usage_days",
        sa.Column("interval_id", sa.String, nullable=False),
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("start_s", _S, nullable=False),
        sa.Column("end_s", _S, nullable=False),
        sa.Column("tenant", sa.String, nullable=False),
        sa.Column("user_name", sa.String, nullable=False),
        sa.Column("cluster", sa.String, nullable=False),
        sa.Column("provider", sa.String, nullable=False),
        sa.Column("gpu_type", sa.String, nullable=False),
        sa.Column("kind", sa.String, nullable=False),
        sa.Column("gpu_count", sa.Integer, nullable=False),
        sa.Column("usd_per_gpu_hour", _S, nullable=False),
        sa.PrimaryKeyConstraint("day", "interval_id", name="pk_history_usage_days"),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "history_audit",
        sa.Column("audit_id", sa.String, primary_key=True),
        sa.Column("at_s", _S, nullable=False),
        sa.Column("user_name", sa.String, nullable=False),
        sa.Column("role", sa.String, nullable=False),
        sa.Column("action", sa.String, nullable=False),
        sa.Column("target", sa.String, nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
    )
    op.create_index("ix_history_audit_at", "history_audit", ["at_s", "audit_id"])


def downgrade() -> None:
    for table in (
        "history_audit",
        "history_usage_days",
        "history_intervals",
        "history_waits",
        "history_attempts",
        "history_jobs",
    ):
        op.drop_table(table)
