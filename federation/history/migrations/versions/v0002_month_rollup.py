"""Month rollup of usage, and one tenant's report reading only that tenant's days.

`history_usage_months` lets a long report read one row per month and dimension instead of every
interval-day; it is filled here from the rows 0001 kept, so reports read the same before and after.
`ix_history_usage_days_tenant_day`: a member's report (narrowed to its own tenant) reads its own
rows rather than every tenant's rows of the period.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

_S = sa.Float(precision=53)


def upgrade() -> None:
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
        sa.PrimaryKeyConstraint(
            "month", "tenant", "cluster", "provider", "gpu_type", "kind", name="pk_history_usage_months"
        ),
        sqlite_with_rowid=False,
    )
    # Frozen here rather than imported: a migration must do tomorrow what it did today.
    op.execute(
        "INSERT INTO history_usage_months"
        " (month, tenant, cluster, provider, gpu_type, kind, gpu_seconds, cost_usd)"
        " SELECT substr(day, 1, 7), tenant, cluster, provider, gpu_type, kind,"
        " SUM(gpu_count * (end_s - start_s)), SUM(gpu_count * (end_s - start_s) * usd_per_gpu_hour) / 3600.0"
        " FROM history_usage_days"
        " GROUP BY substr(day, 1, 7), tenant, cluster, provider, gpu_type, kind"
    )
    op.create_index("ix_history_usage_days_tenant_day", "history_usage_days", ["tenant", "day"])


def downgrade() -> None:
    op.drop_index("ix_history_usage_days_tenant_day", table_name="history_usage_days")
    op.drop_table("history_usage_months")
