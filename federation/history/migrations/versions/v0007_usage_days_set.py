"""The job set and its kind on every interval-day, for usage reports by set and by sweep (issue 34).

A usage report sums archived intervals in SQL from `history_usage_days` (`report_sql`), whose rows
copy in the dimensions they are grouped by. Migration 0006 gave the intervals table the job's set and
the set's kind; this copies both onto the day rows (`job_set`, `set_kind`, "" for a job submitted
alone), so a report by set or sweep is a GROUP BY like the others. The rollups keep no set: a report
by set reads the interval-days, as one by user does.

Day rows written before this revision take their interval's set from `history_intervals`: those
archived after 0006 have one, those archived before it have "" there too and read as "no set".

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None

_COLUMNS = ("job_set", "set_kind")


def upgrade() -> None:
    for name in _COLUMNS:
        # ADD COLUMN with a constant default: no table rewrite on SQLite or PostgreSQL.
        op.add_column(
            "history_usage_days", sa.Column(name, sa.String, nullable=False, server_default=sa.text("''"))
        )
    days = sa.table("history_usage_days", *(sa.column(n, sa.String) for n in ("interval_id", *_COLUMNS)))
    intervals = sa.table("history_intervals", *(sa.column(n, sa.String) for n in ("interval_id", *_COLUMNS)))

    def of_interval(name: str) -> sa.ScalarSelect[str]:
        same = intervals.c.interval_id == days.c.interval_id
        return sa.select(intervals.c[name]).where(same).scalar_subquery()

    # Only the rows of intervals that have a set: one UPDATE, correlated by the intervals' key.
    with_set = sa.select(intervals.c.interval_id).where(intervals.c.job_set != "")
    op.get_bind().execute(
        days.update()
        .where(days.c.interval_id.in_(with_set))
        .values(job_set=of_interval("job_set"), set_kind=of_interval("set_kind"))
    )


def downgrade() -> None:
    with op.batch_alter_table("history_usage_days") as batch:
        for name in reversed(_COLUMNS):
            batch.drop_column(name)
