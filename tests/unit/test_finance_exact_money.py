"""Issue 30, item 8: a report's costs are the same digit by digit before and after archiving.

The same ledger is reported two ways: every interval in memory (as etcd's ledger cache holds them
before the archiver runs), and most of them archived to a real database (SQLite, and PostgreSQL
through the process fixture) and summed in SQL. Prices here are what clouds charge ($2.49, $1.10,
$3.33, $0.07, $12.99 per GPU-hour: none a binary fraction), where float sums of GPU-seconds x price
rounded differently in each order of addition and the figures drifted in the last digit. Costs are
now whole micro-dollars per interval-day (`federation.store.money`), so the reports must be equal
with ==, and their JSON byte for byte. Times are whole seconds, as clusters report them.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import func, select

from federation.history import rows, schema
from federation.history.engine import migrate, open_engine
from federation.history.sql_store import SqlHistoryStore
from federation.history.usage_sql import month_rollup_rows, tenant_day_rollup_rows
from federation.ledger.job_cost import interval_micro_usd
from federation.ledger.report import Bucket, Dim, ReportQuery, render_csv, render_json
from federation.store.intervals import LedgerInterval
from federation.store.money import format_usd, micro_usd_of, piece_micro_usd, span_micro_usd
from placement.model import TenantId
from tests.history_builders import BACKENDS, an_archived_job, fresh_dsn, open_store
from tests.unit.test_report_sql_equality import DAY, NOW, PERIODS, _both_ways, _ledger, _stored

PRICES = [2.49, 1.1, 3.33, 0.07, 12.99]
Archived = tuple[SqlHistoryStore, list[LedgerInterval], list[LedgerInterval]]


def _priced(intervals: list[LedgerInterval], rng: random.Random) -> list[LedgerInterval]:
    return [replace(iv, usd_per_gpu_hour=rng.choice(PRICES)) for iv in intervals]


# Built once per process, so that both backends' cases hold the very same intervals (they are only
# read): `_both_ways` then computes each query's in-memory report once for SQLite and PostgreSQL.
@functools.cache
def _priced_ledger(seed: int, price_seed: int) -> tuple[list[LedgerInterval], list[LedgerInterval]]:
    """(closed, open) intervals of `_ledger(seed)`, priced from a Random(price_seed)."""
    closed, opened = _ledger(seed=seed)
    rng = random.Random(price_seed)
    return _priced(closed, rng), _priced(opened, rng)


@pytest.fixture(scope="module", params=BACKENDS)
def archived(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Archived]:
    closed, opened = _priced_ledger(30, 8)
    dsn = fresh_dsn(str(request.param), tmp_path_factory.mktemp("money"), request)
    yield from _stored(closed, opened, dsn)


@pytest.mark.parametrize(
    "group_by", [(Dim.TENANT,), (Dim.USER, Dim.CLUSTER), (Dim.TENANT, Dim.GPU_TYPE)], ids=str
)
def test_costs_are_the_same_digit_by_digit_whichever_store_holds_an_interval(
    archived: Archived, group_by: tuple[Dim, ...]
) -> None:
    store, everything, live = archived
    assert len(live) < len(everything) / 3, "most of the ledger must be summed in SQL"
    for bucket, (_, start, end), tenants in itertools.product(
        [None, Bucket.DAY, Bucket.WEEK, Bucket.MONTH], PERIODS, [None, frozenset({TenantId("nlp")})]
    ):
        query = ReportQuery(
            start_s=start, end_s=end, now_s=NOW, group_by=group_by, bucket=bucket, tenants=tenants
        )
        expected, got = _both_ways(store, everything, live, query)
        assert got == expected, (group_by, bucket, start, tenants)
        assert render_json(got) == render_json(expected)
        assert render_csv(got) == render_csv(expected)


def test_the_database_own_sum_of_the_stored_micro_dollars_is_the_report_total(archived: Archived) -> None:
    """SQL's own SUM over the stored integers, for a whole month and one tenant, against the report
    over the same month computed with nothing archived."""
    store, everything, live = archived
    query = ReportQuery.last_month(NOW, group_by=(Dim.TENANT,), tenants=frozenset({TenantId("nlp")}))
    expected, got = _both_ways(store, everything, live, query)
    d = schema.usage_days
    archived_ids = {f"{iv.job_id}/{iv.attempt:06d}" for iv in everything if iv not in live}
    with store.engine.connect() as conn:
        total = conn.execute(
            select(func.sum(d.c.cost_micro_usd)).where(
                d.c.tenant == "nlp",
                func.substr(d.c.day, 1, 7) == "2026-02",
                d.c.interval_id.in_(archived_ids),
            )
        ).scalar()
    in_etcd_only = sum(
        piece_micro_usd(iv.gpu_count, max(a, query.start_s), min(b, query.until_s), iv.usd_per_gpu_hour)
        for iv in live
        if iv.tenant == "nlp" and f"{iv.job_id}/{iv.attempt:06d}" not in archived_ids
        for a, b in _days(iv, NOW)
    )
    assert total is not None
    assert got.total_cost_usd == expected.total_cost_usd == (int(total) + in_etcd_only) / 1_000_000


def _days(iv: LedgerInterval, now_s: float) -> list[tuple[float, float]]:
    from federation.store.money import day_pieces

    end = now_s if iv.end_s is None else min(iv.end_s, now_s)
    return list(day_pieces(iv.start_s, end))


def test_an_interval_costs_its_days_pieces_and_money_formats_exactly() -> None:
    # 8 GPUs for 36 h at $2.49 from noon: 12 h + 24 h, each rounded once, then added as integers.
    start = NOW - 3 * DAY
    assert span_micro_usd(8, start, start + 36 * 3600, 2.49) == 8 * 12 * 2_490_000 + 8 * 24 * 2_490_000
    assert piece_micro_usd(1, 0.0, 1.0, 2.49) == 692  # 2.49 / 3600 = 0.0006916.. -> 692 micro-dollars
    assert format_usd(12_345_678) == "12.345678"
    assert format_usd(12_345_678, places=2) == "12.35"
    assert format_usd(2_675_000, places=2) == "2.68"  # half to even on integers, not float's 2.67
    assert format_usd(2_665_000, places=2) == "2.66"
    assert micro_usd_of("12.345678") == 12_345_678
    assert micro_usd_of("3") == 3_000_000
    with pytest.raises(ValueError, match="six decimal places"):
        micro_usd_of("1.2345678")
    iv = _ledger(seed=30)[0][0]
    assert interval_micro_usd(iv, now_s=NOW) == span_micro_usd(
        iv.gpu_count, iv.start_s, min(iv.end_s or NOW, NOW), iv.usd_per_gpu_hour
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_archived_before_migration_0005_read_the_same_after_it(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A history written at revision 0004 (day rows and rollups without micro-dollars) is filled by
    0005 from each row's own figures: its reports then equal, digit by digit, the same ledger
    reported from memory and the same ledger archived after the upgrade."""
    closed, _ = _priced_ledger(31, 9)
    by_job: dict[str, list[LedgerInterval]] = {}
    for iv in closed:
        by_job.setdefault(iv.job_id, []).append(iv)
    jobs = [
        an_archived_job(j, tenant=ivs[0].tenant, intervals=tuple(ivs)) for j, ivs in sorted(by_job.items())
    ]
    old = open_engine(fresh_dsn(backend, tmp_path / "old", request))
    try:
        migrate(old, "0004")
        days = [d for job in jobs for iv in job.intervals for d in rows.usage_day_rows(iv)]
        months, tenant_days = month_rollup_rows(days), tenant_day_rollup_rows(days)
        for row in (*days, *months, *tenant_days):
            row.pop("cost_micro_usd")
        for row in days:  # nor migration 0007's set on the day rows
            row.pop("job_set")
            row.pop("set_kind")
        with old.begin() as conn:
            conn.execute(schema.jobs.insert(), [rows.job_row(job) for job in jobs])
            # Interval rows as 0004 kept them: without migration 0006's set and burst-offer columns.
            added = {"job_set", "set_kind", *rows.OFFER_COLUMNS}
            old_rows = [{k: v for k, v in rows.interval_row(iv).items() if k not in added} for iv in closed]
            conn.execute(schema.intervals.insert(), old_rows)
            conn.execute(schema.usage_days.insert(), days)
            conn.execute(schema.usage_months.insert(), months)
            conn.execute(schema.usage_tenant_days.insert(), tenant_days)
        migrate(old)
        upgraded = SqlHistoryStore(old)
        for store in open_store(fresh_dsn(backend, tmp_path / "new", request)):
            assert store.write_jobs(jobs) == len(jobs)
            for bucket, (_, start, end) in itertools.product([None, Bucket.DAY, Bucket.MONTH], PERIODS):
                query = ReportQuery(
                    start_s=start, end_s=end, now_s=NOW, group_by=(Dim.TENANT, Dim.GPU_TYPE), bucket=bucket
                )
                expected, from_old = _both_ways(upgraded, closed, [], query)
                _, from_new = _both_ways(store, closed, [], query)
                assert from_old == expected == from_new, (bucket, start)
    finally:
        old.dispose()
