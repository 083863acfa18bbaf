"""Kept log tails: every replica's tail of every attempt, moved from etcd with its job.

Before this revision the archiver left a job's kept tails in etcd under their own lease
(`logs.retainHours`, a week by default), so etcd grew with every job for that long. Now they move to
SQL in the job's archive transaction and leave etcd with the job's other keys; the leader deletes
them from here once they are older than the retention (`ix_history_kept_logs_kept_at`). Nothing to
fill from older rows: tails archived before this revision stayed in etcd and expire there.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

_S = sa.Float(precision=53)


def upgrade() -> None:
    op.create_table(
        "history_kept_logs",
        sa.Column("job_id", sa.String, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("task", sa.String, nullable=False),
        sa.Column("replica", sa.Integer, nullable=False),
        sa.Column("kept_at_s", _S, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", "task", "replica", name="pk_history_kept_logs"),
    )
    op.create_index("ix_history_kept_logs_kept_at", "history_kept_logs", ["kept_at_s"])


def downgrade() -> None:
    op.drop_index("ix_history_kept_logs_kept_at", table_name="history_kept_logs")
    op.drop_table("history_kept_logs")
