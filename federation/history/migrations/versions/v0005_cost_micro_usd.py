"""Cost in whole micro-dollars on every interval-day and in both rollups, so that reports add
integers: a report's costs are then the same digit by digit whether an interval was summed from
etcd (in Python) or from here (in SQL), and whatever order either adds in (issue 30: the figures
drifted in the last digit after archiving, from float sums of GPU-seconds x prices like $2.49).

* `history_usage_days.cost_micro_usd`: the row's GPUs x its seconds x the price, in micro-dollars,
  rounded half to even once (`federation.store.money.piece_micro_usd`; the rule is frozen below:
  a migration must do tomorrow what it did today);
* `history_usage_months.cost_micro_usd`, `history_usage_tenant_days.cost_micro_usd`: their day
  rows' sums, in SQL (integer sums are exact on both backends).

Rows written before this revision are filled from their own start, end, GPU count and price, by the
same rule as rows written after it, so they read the same. The fill reads the day rows in key order
a batch at a time and writes each row's figure back by its key.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None

_TABLES = ("history_usage_days", "history_usage_months", "history_usage_tenant_days")
_BATCH = 5_000


def _micro(gpu_count: int, start_s: float, end_s: float, usd_per_gpu_hour: float) -> int:
    # Frozen copy of `money.piece_micro_usd` as of this revision.
    if end_s <= start_s:
        return 0
    micro_price = round(usd_per_gpu_hour * 1_000_000)
    return round(float(gpu_count) * (end_s - start_s) * float(micro_price) / 3600.0)


def upgrade() -> None:
    for table in _TABLES:
        op.add_column(
            table, sa.Column("cost_micro_usd", sa.BigInteger, nullable=False, server_default=sa.text("0"))
        )
    bind = op.get_bind()
    days = sa.table(
        "history_usage_days",
        sa.column("day", sa.String),
        sa.column("interval_id", sa.String),
        sa.column("gpu_count", sa.Integer),
        sa.column("start_s", sa.Float),
        sa.column("end_s", sa.Float),
        sa.column("usd_per_gpu_hour", sa.Float),
        sa.column("cost_micro_usd", sa.BigInteger),
    )
    update = (
        days.update()
        .where(days.c.day == sa.bindparam("k_day"), days.c.interval_id == sa.bindparam("k_id"))
        .values(cost_micro_usd=sa.bindparam("v_cost"))
    )
    after: tuple[str, str] | None = None
    while True:
        stmt = sa.select(
            days.c.day,
            days.c.interval_id,
            days.c.gpu_count,
            days.c.start_s,
            days.c.end_s,
            days.c.usd_per_gpu_hour,
        )
        if after is not None:
            stmt = stmt.where(
                sa.or_(days.c.day > after[0], sa.and_(days.c.day == after[0], days.c.interval_id > after[1]))
            )
        found = bind.execute(stmt.order_by(days.c.day, days.c.interval_id).limit(_BATCH)).all()
        if not found:
            break
        bind.execute(
            update,
            [
                {
                    "k_day": r[0],
                    "k_id": r[1],
                    "v_cost": _micro(int(r[2]), float(r[3]), float(r[4]), float(r[5])),
                }
                for r in found
            ],
        )
        after = (str(found[-1][0]), str(found[-1][1]))
    # The rollups from their day rows: a month's by its days' range (the days' key), a day's by key.
    op.execute(
        "UPDATE history_usage_months SET cost_micro_usd = COALESCE(("
        " SELECT SUM(d.cost_micro_usd) FROM history_usage_days d"
        " WHERE d.day >= history_usage_months.month || '-01'"
        " AND d.day <= history_usage_months.month || '-31'"
        " AND d.tenant = history_usage_months.tenant AND d.cluster = history_usage_months.cluster"
        " AND d.provider = history_usage_months.provider AND d.gpu_type = history_usage_months.gpu_type"
        " AND d.kind = history_usage_months.kind), 0)"
    )
    op.execute(
        "UPDATE history_usage_tenant_days SET cost_micro_usd = COALESCE(("
        " SELECT SUM(d.cost_micro_usd) FROM history_usage_days d"
        " WHERE d.day = history_usage_tenant_days.day AND d.tenant = history_usage_tenant_days.tenant"
        " AND d.gpu_type = history_usage_tenant_days.gpu_type), 0)"
    )
    # No default from now on: every writer gives the figure (as the schema module says).
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.alter_column("cost_micro_usd", server_default=None)


def downgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("cost_micro_usd")
