"""Finance reports over archived history, as `ReportService.GetReport` computes them (issue 19).

Loads the same year of 1,000,000 closed intervals as `bench/history.py` (its generator and bulk
loaders: 40 tenants, 400 users, 12 clusters, 6 GPU types, seeded) into SQLite and into a real
PostgreSQL, then times the whole report path the API runs for the archived part of a report: the
SQL GROUP BY sums (`HistoryStore.read_report`, one snapshot), their merge with etcd's (empty here)
and `finish_report`, for

* June 2026 by tenant and GPU type, by month (`month_report_api_s`);
* 2026 by tenant, GPU type and month (`year_report_api_s`);
* June by user, by day (no rollup can serve users; the widest usual report);
* one tenant's June by day (a member's view);
* June by tenant and job set (issue 34: from the interval-days, as by user).

These sums count each row's interval pieces, as `HistoryStore.usage` (timed by `bench/history.py`)
does not: whole months come from the month rollup's interval counts and whole days of the daily
figures from the day rollup by tenant and GPU type (migration 0003); the partial months and days at
the ends, and groupings no rollup keeps (by user; by week), from `history_usage_days`. The totals
are checked against the generator's own sum for June, and the year's against its sum for 2026.

    python bench/report_sql.py            # 1,000,000 intervals, median of 3
    python bench/report_sql.py --quick    # 1,000,000 intervals too, one run each

Ends with `figure_name: value unit` lines.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import history as loads  # noqa: E402
from federation.history.sql_store import SqlHistoryStore  # noqa: E402
from federation.ledger.report import Bucket, Dim, ReportQuery  # noqa: E402
from federation.ledger.report.archived import both_stores, report_read  # noqa: E402
from federation.ledger.report.compute import Report, finish_report  # noqa: E402
from federation.runtime.postgres_process import PostgresProcess  # noqa: E402
from placement.model import TenantId  # noqa: E402

# "now" for the reports: 2027-01-01, after the whole year (its budget month and week hold nothing).
NOW = datetime(2027, 1, 1, tzinfo=UTC).timestamp()


def api_report(store: SqlHistoryStore, query: ReportQuery) -> Report:
    asked = report_read(query, check=(), idle_sites=None)
    answer = store.read_report(asked.read)
    return finish_report(both_stores([], query, asked, answer, idle_sites=None), [], query)


def measure(
    name: str,
    store: SqlHistoryStore,
    runs: int,
    expected: tuple[float, float],
    figures: dict[str, float],
) -> None:
    expected_june_h, expected_year_h = expected
    june = ReportQuery(start_s=loads.MONTH_START, end_s=loads.MONTH_END, now_s=NOW)
    by_tenant_gpu = replace(june, group_by=(Dim.TENANT, Dim.GPU_TYPE), bucket=Bucket.MONTH)
    got = api_report(store, by_tenant_gpu).total_gpu_hours
    if abs(got - expected_june_h) > 1e-6 * expected_june_h:
        raise SystemExit(f"{name}: June's GPU-hours {got} != {expected_june_h} from the generator")
    year_h = api_report(
        store, ReportQuery(start_s=loads.YEAR_START, end_s=loads.YEAR_END, now_s=NOW)
    ).total_gpu_hours
    if abs(year_h - expected_year_h) > 1e-6 * expected_year_h:
        raise SystemExit(f"{name}: 2026's GPU-hours {year_h} != {expected_year_h} from the generator")
    year = ReportQuery(
        start_s=loads.YEAR_START,
        end_s=loads.YEAR_END,
        now_s=NOW,
        group_by=(Dim.TENANT, Dim.GPU_TYPE),
        bucket=Bucket.MONTH,
    )
    cases = {
        "month_report_api_s": by_tenant_gpu,
        "year_report_api_s": year,
        "month_by_user_day_api_s": replace(june, group_by=(Dim.USER,), bucket=Bucket.DAY),
        # Issue 34: by tenant and set, from June's day rows (no rollup keeps the set). The loaded
        # rows have no set (the generator predates it): the read is what is timed, not the groups.
        "month_by_set_api_s": replace(june, group_by=(Dim.SET,)),
        "tenant_month_by_day_api_s": replace(
            june, group_by=(Dim.GPU_TYPE,), bucket=Bucket.DAY, tenants=frozenset({TenantId("team-07")})
        ),
    }
    for figure, query in cases.items():
        figures[f"{figure}_{name}"] = loads.median_s(partial(api_report, store, query), runs)
        print(f"{figure}_{name}: {figures[f'{figure}_{name}']:.3f} s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--intervals", type=int, default=1_000_000)
    args = parser.parse_args()
    runs = 1 if args.quick else 3
    figures: dict[str, float] = {}
    interval_rows, day_rows = loads.year_of_intervals(args.intervals)
    expected = (
        loads.expected_month_gpu_hours(day_rows),
        sum(row[10] * (row[3] - row[2]) for row in day_rows) / 3600.0,
    )
    with (
        tempfile.TemporaryDirectory(prefix="gpufed-bench-report-sql-") as tmp,
        PostgresProcess(settings={"max_wal_size": "4GB", "maintenance_work_mem": "256MB"}) as postgres,
    ):
        postgres_dsn = postgres.create_database("bench_report_sql")
        SqlHistoryStore.open(postgres_dsn).close()
        loader = multiprocessing.get_context("fork").Process(
            target=loads._load_postgres_in_child, args=(postgres_dsn, interval_rows, day_rows)
        )
        loader.start()
        sqlite_store = SqlHistoryStore.open(f"sqlite:///{Path(tmp) / 'history.sqlite3'}")
        try:
            loads.load_sqlite(sqlite_store, interval_rows, day_rows)
            loader.join()
            if loader.exitcode != 0:
                raise SystemExit(f"the PostgreSQL load failed (exit {loader.exitcode})")
            measure("sqlite", sqlite_store, runs, expected, figures)
        finally:
            sqlite_store.close()
        store = SqlHistoryStore.open(postgres_dsn)
        try:
            measure("postgres", store, runs, expected, figures)
        finally:
            store.close()
    print(f"intervals: {args.intervals} over 2026; runs: median of {runs}; aims: month < 1 s, year < 2 s")
    for name, value in figures.items():
        print(f"{name}: {value:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
