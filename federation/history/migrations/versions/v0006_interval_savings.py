"""What an archived interval needs for the savings report and for finance by set and sweep (issues 34
and 35): the job set its job was released from, the set's kind, and the burst-at-once offer the
placer recorded for the attempt (`LedgerInterval.burst_offer`, flattened).

Intervals archived before this revision have none of these: their set is "" (a job submitted
alone, as the ledger said of them then) and their offer NULL (the savings report counts them as
attempts with nothing recorded to burst to, with no saving). Nothing to fill.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None

_F = sa.Float(precision=53)
_TEXT = ("job_set", "set_kind")
_OFFER = (
    ("burst_cluster", sa.String),
    ("burst_gpu_type", sa.String),
    ("burst_kind", sa.String),
    ("burst_usd_per_gpu_hour", _F),
    ("burst_seen_at_s", _F),
)


def upgrade() -> None:
    with op.batch_alter_table("history_intervals") as batch:
        for name in _TEXT:
            batch.add_column(sa.Column(name, sa.String, nullable=False, server_default=sa.text("''")))
        for name, kind in _OFFER:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("history_intervals") as batch:
        for name, _ in reversed(_OFFER):
            batch.drop_column(name)
        for name in reversed(_TEXT):
            batch.drop_column(name)
