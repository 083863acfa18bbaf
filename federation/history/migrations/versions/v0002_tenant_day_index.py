"""One tenant's report reads only that tenant's days.

Without it a member's report (tenant isolation narrows it to its own tenant) scans every tenant's
rows of the period on `ix_history_usage_days_day` and filters; with it, it reads its own.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_index("ix_history_usage_days_tenant_day", "history_usage_days", ["tenant", "day"])


def downgrade() -> None:
    op.drop_index("ix_history_usage_days_tenant_day", table_name="history_usage_days")
