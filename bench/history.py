"""The history store under a year of usage: how fast reports are in SQL, and how fast jobs archive.

Bulk-loads 1,000,000 closed ledger intervals spread over 2026 (40 tenants, 400 users, 12 clusters
on 3 providers, 6 GPU types at their prices, gangs of 1 to 64 GPUs running minutes to days; seeded)
into SQLite (a WAL file) and into a real PostgreSQL (a process, fsync on), then times, as the
finance report would ask:

* a month's report by tenant and GPU type (June 2026), on each backend: aim under 1 s;
* a year's report by tenant, GPU type and month: aim under 2 s;
* one tenant's month by day (what a member sees; tenant isolation narrows the query);

and the archive path: ended jobs (record, events, attempt, two intervals, a wait) written through
`SqlHistoryStore.write_jobs` in batches of 500, in jobs per second.

The load itself bypasses the store (executemany on SQLite, COPY on PostgreSQL, into empty tables),
the two backends side by side (PostgreSQL's from a forked process): it stands in for a year of
archiving, which is not what is measured. Every timed query runs alone, after both loads.

    python bench/history.py            # after `make test`; 1,000,000 intervals, 5 runs, 20,000 jobs archived
    python bench/history.py --quick    # 1,000,000 intervals too, 3 runs, 2,000 jobs archived

Ends with one `figure_name: value unit` line per figure, among them `month_report_s: X s` (the
slower backend's month).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from federation.history import schema  # noqa: E402
from federation.history.engine import open_engine  # noqa: E402
from federation.history.model import GroupBy, Period, UsageQuery  # noqa: E402
from federation.history.rows import DAY_S, day_of  # noqa: E402
from federation.history.sql_store import SqlHistoryStore  # noqa: E402
from federation.history.usage_sql import rebuild_month_rollup  # noqa: E402
from federation.runtime.postgres_process import PostgresProcess  # noqa: E402
from placement.model import TenantId  # noqa: E402
from tests.history_builders import an_archived_job, an_interval  # noqa: E402

YEAR_START = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
YEAR_END = datetime(2027, 1, 1, tzinfo=UTC).timestamp()
MONTH_START = datetime(2026, 6, 1, tzinfo=UTC).timestamp()
MONTH_END = datetime(2026, 7, 1, tzinfo=UTC).timestamp()
# GPU type -> (on-demand $/GPU-hour, private rate): prices of the kind a federation pays.
PRICES = {
    "H100": (4.5, 2.2),
    "A100": (2.9, 1.4),
    "L40S": (1.8, 0.9),
    "L4": (0.8, 0.4),
    "V100": (1.2, 0.5),
    "T4": (0.5, 0.2),
}
PROVIDERS = ("onprem", "aws", "gcp")
CLUSTERS = tuple(f"{PROVIDERS[c % 3]}-{c}" for c in range(12))
GANG_GPUS = (1, 1, 2, 4, 8, 8, 16, 32, 64)

INTERVAL_COLUMNS = (
    "interval_id", "job_id", "attempt", "tenant", "user_name", "cluster", "provider", "region",
    "gpu_type", "gpu_count", "kind", "start_s", "end_s", "usd_per_gpu_hour", "ended", "job_name",
)  # fmt: skip
DAY_COLUMNS = (
    "interval_id", "day", "start_s", "end_s", "tenant", "user_name", "cluster", "provider",
    "gpu_type", "kind", "gpu_count", "usd_per_gpu_hour",
)  # fmt: skip


def year_of_intervals(count: int, seed: int = 19) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """`count` interval rows and their per-day rows, as tuples in the columns' order above, in the
    order of their start (as a year of archiving would have written them)."""
    rng = random.Random(seed)
    interval_rows: list[tuple[Any, ...]] = []
    day_rows: list[tuple[Any, ...]] = []
    types = tuple(PRICES)
    # Minutes to days: most runs are short, a few are long (lognormal, capped at three days).
    durations = [min(3 * DAY_S, rng.lognormvariate(8.5, 1.3)) for _ in range(count)]
    starts = sorted(YEAR_START + rng.random() * (YEAR_END - YEAR_START - 3 * DAY_S) for _ in range(count))
    # Day strings by day number: strftime per piece would be most of the generation's time.
    first_day = int(YEAR_START // DAY_S)
    day_names = [day_of((first_day + n) * DAY_S) for n in range(367)]
    for n, (start, duration) in enumerate(zip(starts, durations, strict=True)):
        tenant = f"team-{rng.randrange(40):02d}"
        user = f"{tenant}-user-{rng.randrange(10)}"
        cluster = CLUSTERS[rng.randrange(len(CLUSTERS))]
        provider = PROVIDERS[int(cluster.rsplit("-", 1)[1]) % 3]
        gpu_type = types[rng.randrange(len(types))]
        private = provider == "onprem"
        kind = "private" if private else ("spot" if rng.random() < 0.2 else "on_demand")
        price = PRICES[gpu_type][1 if private else 0] * (0.4 if kind == "spot" else 1.0)
        end = start + duration
        gpus = GANG_GPUS[rng.randrange(len(GANG_GPUS))]
        job = f"job-{n:07d}"
        key = f"{job}/000001"
        interval_rows.append(
            (
                key,
                job,
                1,
                tenant,
                user,
                cluster,
                provider,
                "r1",
                gpu_type,
                gpus,
                kind,
                start,
                end,
                price,
                "finished",
                job,
            )
        )
        at = start
        while at < end:
            day = int(at // DAY_S)
            piece_end = min(end, (day + 1) * DAY_S)
            day_rows.append(
                (
                    key,
                    day_names[day - first_day],
                    at,
                    piece_end,
                    tenant,
                    user,
                    cluster,
                    provider,
                    gpu_type,
                    kind,
                    gpus,
                    price,
                )
            )
            at = piece_end
    # The table is kept in (day, interval_id) order; loading in that order appends rather than splits.
    day_rows.sort(key=lambda r: (r[1], r[0]))
    return interval_rows, day_rows


def _marks(columns: Sequence[str]) -> str:
    return ", ".join("?" for _ in columns)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Prints how long a step of the load took: where a slow load's time went."""
    began = time.perf_counter()
    yield
    print(f"  {name}: {time.perf_counter() - began:.1f} s")


def _drop_secondary_indexes(store: SqlHistoryStore) -> None:
    # As any bulk load does: building an index once at the end beats updating it row by row.
    with store.engine.begin() as conn:
        for table in (schema.intervals, schema.usage_days):
            for index in table.indexes:
                index.drop(conn)


def _create_secondary_indexes(store: SqlHistoryStore) -> None:
    with store.engine.begin() as conn:
        for table in (schema.intervals, schema.usage_days):
            for index in table.indexes:
                index.create(conn)


def load_sqlite(
    store: SqlHistoryStore, interval_rows: Sequence[tuple[Any, ...]], day_rows: Sequence[tuple[Any, ...]]
) -> None:
    _drop_secondary_indexes(store)
    raw = store.engine.raw_connection()
    try:
        cursor = raw.cursor()
        for table, columns, data in (
            (schema.intervals.name, INTERVAL_COLUMNS, interval_rows),
            (schema.usage_days.name, DAY_COLUMNS, day_rows),
        ):
            with phase(f"sqlite insert {table}"):
                cursor.executemany(
                    f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({_marks(columns)})", data
                )
        raw.commit()
    finally:
        raw.close()
    with phase("sqlite secondary indexes"):
        _create_secondary_indexes(store)
    with phase("sqlite month rollup and analyze"), store.engine.begin() as conn:
        rebuild_month_rollup(conn)
        conn.exec_driver_sql("ANALYZE")


def _copy_text(rows: Sequence[tuple[Any, ...]]) -> bytes:
    # COPY's text format: the generated values hold no tab, newline or backslash.
    return "".join("\t".join(map(str, row)) + "\n" for row in rows).encode()


def load_postgres(
    store: SqlHistoryStore, interval_rows: Sequence[tuple[Any, ...]], day_rows: Sequence[tuple[Any, ...]]
) -> None:
    _drop_secondary_indexes(store)
    raw = store.engine.raw_connection()
    try:
        cursor: Any = raw.cursor()
        for table, columns, data in (
            (schema.intervals.name, INTERVAL_COLUMNS, interval_rows),
            (schema.usage_days.name, DAY_COLUMNS, day_rows),
        ):
            with (
                phase(f"postgres COPY {table}"),
                cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy,
            ):
                for i in range(0, len(data), 100_000):
                    copy.write(_copy_text(data[i : i + 100_000]))
        with phase("postgres commit"):
            raw.commit()
    finally:
        raw.close()
    with phase("postgres secondary indexes"):
        _create_secondary_indexes(store)
    with phase("postgres month rollup"), store.engine.begin() as conn:
        rebuild_month_rollup(conn)
    # ANALYZE for the planner's statistics; VACUUM too would set the visibility map (index-only
    # scans), but rewrites every page of a fresh table: too slow for a load, and autovacuum does it.
    with phase("postgres analyze"), store.engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")


def _load_postgres_in_child(
    dsn: str, interval_rows: Sequence[tuple[Any, ...]], day_rows: Sequence[tuple[Any, ...]]
) -> None:
    store = SqlHistoryStore(open_engine(dsn))
    try:
        load_postgres(store, interval_rows, day_rows)
    finally:
        store.close()


def median_s(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm the caches once, as a server answering reports all day would have them
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def expected_month_gpu_hours(day_rows: Sequence[tuple[Any, ...]]) -> float:
    total = 0.0
    for row in day_rows:
        start, end, gpus = max(row[2], MONTH_START), min(row[3], MONTH_END), row[10]
        if end > start:
            total += gpus * (end - start) / 3600.0
    return total


def archive_jobs_per_s(store: SqlHistoryStore, job_count: int, batch: int = 500) -> float:
    jobs = []
    for n in range(job_count):
        job_id = f"arch-{n:07d}"
        at = YEAR_START + n * 60.0
        intervals = (
            an_interval(job_id, 1, start_s=at + 10, end_s=at + 1800),
            an_interval(job_id, 2, start_s=at + 1900, end_s=at + 7200),
        )
        jobs.append(
            an_archived_job(job_id, tenant=f"team-{n % 40:02d}", submitted_at_s=at, intervals=intervals)
        )
    began = time.perf_counter()
    for i in range(0, len(jobs), batch):
        store.write_jobs(jobs[i : i + batch])
    return job_count / (time.perf_counter() - began)


def measure(
    name: str,
    store: SqlHistoryStore,
    runs: int,
    jobs: int,
    expected: float,
    figures: dict[str, tuple[float, str]],
) -> None:
    dims = (GroupBy.TENANT, GroupBy.GPU_TYPE)
    month = UsageQuery(MONTH_START, MONTH_END, dims)
    year = UsageQuery(YEAR_START, YEAR_END, dims, Period.MONTH)
    # The same spans off the month boundaries ("the last 30 days"): the partial months at the ends
    # come from the interval-days, the whole ones from the rollup.
    days_30 = UsageQuery(MONTH_START + 10.5 * DAY_S, MONTH_START + 40.5 * DAY_S, dims)
    days_365 = UsageQuery(YEAR_START + 0.5 * DAY_S, YEAR_END - 0.5 * DAY_S, dims, Period.MONTH)
    year_by_user = UsageQuery(YEAR_START + 0.5 * DAY_S, YEAR_END - 0.5 * DAY_S, (GroupBy.USER,), Period.MONTH)
    one_tenant = UsageQuery(MONTH_START, MONTH_END, (GroupBy.TENANT,), Period.DAY, tenant=TenantId("team-07"))
    # By user the rollup cannot help: every interval-day of the range is read.
    month_by_user = UsageQuery(MONTH_START, MONTH_END, (GroupBy.USER,))
    UsageQuery(MONTH_START + 2.5 * DAY_S, MONTH_END - 3.5 * DAY_S, (GroupBy.TENANT, GroupBy.GPU_TYPE))
    got = sum(r.gpu_hours for r in store.usage(month))
    # The figures must add up, or the timing means nothing.
    assert abs(got - expected) <= 1e-6 * expected, (name, got, expected)
    figures[f"calendar_month_report_s_{name}"] = (median_s(lambda: store.usage(month), runs), "s")
    figures[f"days_30_report_s_{name}"] = (median_s(lambda: store.usage(days_30), runs), "s")
    figures[f"month_report_s_{name}"] = (
        max(figures[f"calendar_month_report_s_{name}"][0], figures[f"days_30_report_s_{name}"][0]),
        "s",
    )
    figures[f"calendar_year_report_s_{name}"] = (median_s(lambda: store.usage(year), runs), "s")
    figures[f"days_365_report_s_{name}"] = (median_s(lambda: store.usage(days_365), runs), "s")
    figures[f"year_report_s_{name}"] = (
        max(figures[f"calendar_year_report_s_{name}"][0], figures[f"days_365_report_s_{name}"][0]),
        "s",
    )
    if runs > 1:
        # Not in --quick: every interval-day of the year is read (about 1 s; the minute is short).
        figures[f"days_365_by_user_month_s_{name}"] = (median_s(lambda: store.usage(year_by_user), runs), "s")
    figures[f"one_tenant_month_by_day_s_{name}"] = (median_s(lambda: store.usage(one_tenant), runs), "s")
    figures[f"month_by_user_s_{name}"] = (median_s(lambda: store.usage(month_by_user), runs), "s")
    figures[f"archive_jobs_per_s_{name}"] = (archive_jobs_per_s(store, jobs), "jobs/s")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--intervals", type=int, default=1_000_000)
    args = parser.parse_args()
    runs, jobs = (1, 2_000) if args.quick else (5, 20_000)
    figures: dict[str, tuple[float, str]] = {}

    began = time.perf_counter()
    interval_rows, day_rows = year_of_intervals(args.intervals)
    print(
        f"generated {len(interval_rows)} intervals ({len(day_rows)} interval-days) in {time.perf_counter() - began:.1f} s"
    )
    expected = expected_month_gpu_hours(day_rows)

    # fsync on (durable), with room for the load's WAL between checkpoints, as a production server has.
    with (
        tempfile.TemporaryDirectory(prefix="gpufed-bench-history-") as tmp,
        PostgresProcess(
            durable=True, settings={"max_wal_size": "4GB", "maintenance_work_mem": "256MB"}
        ) as postgres,
    ):
        postgres_dsn = postgres.create_database("bench_history")
        SqlHistoryStore.open(postgres_dsn).close()  # migrated before the loader starts
        # The two loads run side by side (a forked process fills PostgreSQL), and only the loads:
        # every timed query runs alone.
        loader = multiprocessing.get_context("fork").Process(
            target=_load_postgres_in_child, args=(postgres_dsn, interval_rows, day_rows)
        )
        began = time.perf_counter()
        loader.start()
        sqlite_store = SqlHistoryStore.open(f"sqlite:///{Path(tmp) / 'history.sqlite3'}")
        try:
            load_sqlite(sqlite_store, interval_rows, day_rows)
            figures["load_s_sqlite"] = (time.perf_counter() - began, "s")
            loader.join()
            if loader.exitcode != 0:
                raise SystemExit(f"the PostgreSQL load failed (exit {loader.exitcode})")
            figures["load_s_postgres"] = (time.perf_counter() - began, "s")
            measure("sqlite", sqlite_store, runs, jobs, expected, figures)
        finally:
            sqlite_store.close()
        store = SqlHistoryStore.open(postgres_dsn)
        try:
            measure("postgres", store, runs, jobs, expected, figures)
        finally:
            store.close()

    for figure in ("month_report_s", "year_report_s"):
        figures[figure] = (max(figures[f"{figure}_sqlite"][0], figures[f"{figure}_postgres"][0]), "s")
    figures["archive_jobs_per_s"] = (
        min(figures["archive_jobs_per_s_sqlite"][0], figures["archive_jobs_per_s_postgres"][0]),
        "jobs/s",
    )
    print(
        f"intervals: {args.intervals} over 2026; month June 2026; runs: median of {runs}; archived {jobs} jobs per backend"
    )
    print("aims: month_report_s < 1 s, year_report_s < 2 s, on both backends")
    for name, (value, unit) in figures.items():
        print(f"{name}: {value:.3f} {unit}" if unit == "s" else f"{name}: {value:.0f} {unit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
