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

Then restart to serving: a real etcd seeded with live jobs (90 % ended within the hour, 8 % queued,
2 % running on a member cluster that is full, so the queued wait), then `gpufed serve` launched on
it and timed until `/readyz` says 200 (job and ledger caches listed, the leader's first reconciler
tick and scheduling cycle done, archived usage read from SQL) and a GetJob answers. Once untimed
(it writes what a running federation has, and the modules' bytecode; in --quick only the bytecode
is written, by compileall), then against each history:
none, a tenth and all of the 1,000,000 intervals on SQLite, and all of them on PostgreSQL; aim
under 5 s whatever the history's size. Beside the intervals each full history also holds their
1,000,000 archived jobs (`history_jobs` rows with whole records, `--archived-jobs`; none in
--quick, whose minute they would not fit), so that it is the issue's size in jobs too.

    python bench/history.py            # after `make test`; 1,000,000 intervals, 5 runs, 20,000 jobs
                                       # archived; restart with 100,000 live jobs
    python bench/history.py --quick    # 1,000,000 intervals too, 1 run, 2,000 jobs archived;
                                       # restart with 10,000 live jobs, all the history only
    python bench/history.py --restart-only   # no SQL history: only the restart with 100,000 live
                                             # jobs and an empty SQLite history (to iterate on it)

Ends with one `figure_name: value unit` line per figure, among them `month_report_s: X s` (the
slower backend's month) and `restart_to_serving_s: X s` (the slowest restart of the run), and
`reference_loop_s: X s`, the slower of a fixed pure-Python loop timed before and after the restarts,
to read the restart's figure against the speed of its hour (docs/architecture.md gives its usual value).
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import itertools
import json
import logging
import multiprocessing
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import structlog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clusters.memory import InMemoryCluster  # noqa: E402
from datasync.loopback_ports import free_ports  # noqa: E402
from federation.api.client import GpufedClient  # noqa: E402
from federation.api.v1 import gpufed_pb2 as pb  # noqa: E402
from federation.history import schema  # noqa: E402
from federation.history.engine import open_engine  # noqa: E402
from federation.history.model import GroupBy, Period, UsageQuery  # noqa: E402
from federation.history.rows import DAY_S, day_of, job_row  # noqa: E402
from federation.history.sql_store import SqlHistoryStore  # noqa: E402
from federation.history.usage_sql import rebuild_rollups  # noqa: E402
from federation.runtime.bootstrap import bootstrap  # noqa: E402
from federation.runtime.config import parse_config  # noqa: E402
from federation.runtime.etcd_process import EtcdProcess  # noqa: E402
from federation.runtime.postgres_process import PostgresProcess  # noqa: E402
from federation.scheduling.workload import workload_for  # noqa: E402
from federation.store.intervals import IntervalEnd, LedgerInterval, interval_to_dict  # noqa: E402
from federation.store.job_store import KvStore, job_key  # noqa: E402
from federation.store.jobs import JobPlacement, JobRecord, PhaseEvent, job_to_dict  # noqa: E402
from federation.store.kv import Compare, Put, Txn  # noqa: E402
from federation.store.kv_etcd import EtcdKv  # noqa: E402
from federation.store.money import piece_micro_usd  # noqa: E402
from placement.model import CapacityKind, ClusterName, GpuType, JobId, JobPhase, Provider, TenantId  # noqa: E402
from tests.history_builders import an_archived_job, an_interval  # noqa: E402
from tests.job_builder import build_job  # noqa: E402

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
JOB_COLUMNS = (
    "job_id", "tenant", "user_name", "name", "phase", "submitted_at_s", "ended_at_s", "record_json",
)  # fmt: skip
DAY_COLUMNS = (
    "interval_id", "day", "start_s", "end_s", "tenant", "user_name", "cluster", "provider",
    "gpu_type", "kind", "gpu_count", "usd_per_gpu_hour", "cost_micro_usd",
)  # fmt: skip


def year_of_intervals(count: int, seed: int = 19) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """`count` interval rows and their per-day rows, as tuples in the columns' order above, in the
    order of their start (as a year of archiving would have written them). Drawn with numpy's
    arrays (the rows per interval in Python took 15 s of `--quick`'s minute on a busy machine)."""
    rng = np.random.default_rng(seed)
    types = tuple(PRICES)
    # Minutes to days: most runs are short, a few are long (lognormal, capped at three days).
    durations = np.minimum(3 * DAY_S, rng.lognormal(8.5, 1.3, count))
    starts = np.sort(YEAR_START + rng.random(count) * (YEAR_END - YEAR_START - 3 * DAY_S))
    ends = starts + durations
    tenant_n, user_n = rng.integers(0, 40, count), rng.integers(0, 10, count)
    cluster_n, type_n = rng.integers(0, len(CLUSTERS), count), rng.integers(0, len(types), count)
    spot_draw, gang_n = rng.random(count), rng.integers(0, len(GANG_GPUS), count)
    private = cluster_n % 3 == 0  # the clusters of PROVIDERS[0], "onprem"
    spot = ~private & (spot_draw < 0.2)
    kind_n = np.where(private, 0, np.where(spot, 1, 2))
    on_demand_price = np.array([PRICES[t][0] for t in types])
    private_price = np.array([PRICES[t][1] for t in types])
    prices = np.where(private, private_price[type_n], on_demand_price[type_n]) * np.where(spot, 0.4, 1.0)
    gpus = np.array(GANG_GPUS)[gang_n]

    tenant_names = [f"team-{t:02d}" for t in range(40)]
    user_names = [[f"{tenant}-user-{u}" for u in range(10)] for tenant in tenant_names]
    kinds = ("private", "spot", "on_demand")
    providers = [PROVIDERS[c % 3] for c in range(len(CLUSTERS))]
    tenants = [tenant_names[t] for t in tenant_n.tolist()]
    users = [user_names[t][u] for t, u in zip(tenant_n.tolist(), user_n.tolist(), strict=True)]
    clusters = [CLUSTERS[c] for c in cluster_n.tolist()]
    cluster_providers = [providers[c] for c in cluster_n.tolist()]
    gpu_types = [types[t] for t in type_n.tolist()]
    kind_names = [kinds[k] for k in kind_n.tolist()]
    gpu_counts, price_list = gpus.tolist(), prices.tolist()
    jobs = [f"job-{n:07d}" for n in range(count)]
    keys = [f"{job}/000001" for job in jobs]
    interval_rows: list[tuple[Any, ...]] = list(
        zip(
            keys, jobs, itertools.repeat(1), tenants, users, clusters, cluster_providers,
            itertools.repeat("r1"), gpu_types, gpu_counts, kind_names, starts.tolist(), ends.tolist(),
            price_list, itertools.repeat("finished"), jobs,
        )
    )  # fmt: skip

    # One row per UTC day an interval touches, cut at midnight.
    first_day = np.floor(starts / DAY_S)
    pieces = (np.ceil(ends / DAY_S) - first_day).astype(np.int64)
    owner = np.repeat(np.arange(count), pieces)
    nth = np.arange(len(owner)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    day = first_day[owner] + nth
    piece_start = np.maximum(starts[owner], day * DAY_S)
    piece_end = np.minimum(ends[owner], (day + 1) * DAY_S)
    # The table is kept in (day, interval_id) order; loading in that order appends rather than
    # splits. Interval ids rise with their number, so (day, number) is that order.
    order = np.lexsort((owner, day))
    owner, day = owner[order].tolist(), day[order].astype(np.int64).tolist()
    year_first_day = int(YEAR_START // DAY_S)
    # Day strings by day number: strftime per piece would be most of the generation's time.
    day_names = [day_of((year_first_day + n) * DAY_S) for n in range(367)]
    day_rows: list[tuple[Any, ...]] = [
        (
            keys[i], day_names[d - year_first_day], a, b, tenants[i], users[i], clusters[i],
            cluster_providers[i], gpu_types[i], kind_names[i], gpu_counts[i], price_list[i],
            piece_micro_usd(gpu_counts[i], a, b, price_list[i]),
        )
        for i, d, a, b in zip(owner, day, piece_start[order].tolist(), piece_end[order].tolist(), strict=True)
    ]  # fmt: skip
    return interval_rows, day_rows


def archived_job_rows(interval_rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The archived job of each interval (the generator's jobs ran once), as `history_jobs` rows in
    JOB_COLUMNS' order: what a year of archiving leaves beside its intervals, each with a whole
    record in the store's codec (about 1.2 KB). The records are one template's with the job's id and
    tenant put in; their events keep the template's times (the row's columns have the interval's).
    Nothing in a restart reads them; they are there so that the history is the issue's size in
    jobs as well as in intervals."""
    template = job_row(an_archived_job("JOB-ID-MARK", tenant="TENANT-MARK"))["record_json"]
    # COPY's text format and the plain replace below need no escaping in it.
    if any(c in template for c in "\\\t\n"):
        raise SystemExit(f"the archived job template needs escaping for COPY: {template}")
    rows: list[tuple[Any, ...]] = []
    for row in interval_rows:
        job_id, tenant, user, start, end = row[1], row[3], row[4], row[11], row[12]
        record = template.replace("JOB-ID-MARK", job_id).replace("TENANT-MARK", tenant)
        rows.append((job_id, tenant, user, job_id, "SUCCEEDED", start - 60.0, end, record))
    return rows


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
        for table in (schema.intervals, schema.usage_days, schema.jobs):
            for index in table.indexes:
                index.drop(conn)


def _create_secondary_indexes(store: SqlHistoryStore) -> None:
    with store.engine.begin() as conn:
        for table in (schema.intervals, schema.usage_days, schema.jobs):
            for index in table.indexes:
                index.create(conn)


def load_sqlite(
    store: SqlHistoryStore,
    interval_rows: Sequence[tuple[Any, ...]],
    day_rows: Sequence[tuple[Any, ...]],
    job_rows: Sequence[tuple[Any, ...]] = (),
) -> None:
    _drop_secondary_indexes(store)
    raw = store.engine.raw_connection()
    try:
        cursor = raw.cursor()
        for table, columns, data in (
            (schema.intervals.name, INTERVAL_COLUMNS, interval_rows),
            (schema.usage_days.name, DAY_COLUMNS, day_rows),
            (schema.jobs.name, JOB_COLUMNS, job_rows),
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
    with phase("sqlite rollups"), store.engine.begin() as conn:
        rebuild_rollups(conn)
    with phase("sqlite analyze"), store.engine.begin() as conn:
        # Statistics from a sample of each index (SQLite's advice for large databases), not a
        # read of every row of two million: the planner needs their shape, not their count.
        conn.exec_driver_sql("PRAGMA analysis_limit=1000")
        conn.exec_driver_sql("ANALYZE")


def _copy_text(rows: Sequence[tuple[Any, ...]]) -> bytes:
    # COPY's text format: the generated values hold no tab, newline or backslash.
    return "".join("\t".join(map(str, row)) + "\n" for row in rows).encode()


def load_postgres(
    store: SqlHistoryStore,
    interval_rows: Sequence[tuple[Any, ...]],
    day_rows: Sequence[tuple[Any, ...]],
    job_rows: Sequence[tuple[Any, ...]] = (),
) -> None:
    _drop_secondary_indexes(store)
    raw = store.engine.raw_connection()
    try:
        cursor: Any = raw.cursor()
        for table, columns, data in (
            (schema.intervals.name, INTERVAL_COLUMNS, interval_rows),
            (schema.usage_days.name, DAY_COLUMNS, day_rows),
            (schema.jobs.name, JOB_COLUMNS, job_rows),
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
    # ANALYZE for the planner's statistics; VACUUM too would set the visibility map (index-only
    # scans), but rewrites every page of a fresh table: too slow for a load, and autovacuum does it.
    # Before the rollups: their fill joins the days with the intervals, and planned without
    # statistics it took 10 s here against 5 to 7 s with them.
    with phase("postgres analyze"), store.engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")
    with phase("postgres rollups"), store.engine.begin() as conn:
        # The fill's hash join of 1,000,000 intervals spills to disk at the default 4 MB.
        conn.exec_driver_sql("SET LOCAL work_mem = '256MB'")
        rebuild_rollups(conn)
    with phase("postgres analyze rollups"), store.engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE history_usage_months, history_usage_tenant_days")


def _load_postgres_in_child(
    dsn: str,
    interval_rows: Sequence[tuple[Any, ...]],
    day_rows: Sequence[tuple[Any, ...]],
    job_rows: Sequence[tuple[Any, ...]] = (),
) -> None:
    store = SqlHistoryStore(open_engine(dsn))
    try:
        load_postgres(store, interval_rows, day_rows, job_rows)
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


# ---- restart to serving (issue 19: under 5 s whatever the history's size)

RESTART_TENANTS = tuple(f"t{n}" for n in range(8))
# One private H100 cluster, full with the running gangs (one GPU each): the queued jobs wait, as a
# busy federation's do, so the leader's first cycle plans over all of them and admits none.
RESTART_CONFIG = """\
tenants: [{{name: platform}}, {tenants}]
users:
  - {{name: admin, tenant: platform, role: admin}}
  - {{name: u0, tenant: t0, role: member}}
clusters:
  - name: onprem
    provider: private
    region: dc1
    pools: [{{name: h100, gpuType: H100, kind: private, usdPerGpuHour: 2.2, gpusPerNode: 8, nodes: {nodes}}}]
history:
  dsn: {dsn}
"""


def restart_config(dsn: str, running: int) -> str:
    return RESTART_CONFIG.format(
        tenants=", ".join(f"{{name: {t}}}" for t in RESTART_TENANTS), nodes=max(1, -(-running // 8)), dsn=dsn
    )


def live_mix(count: int) -> tuple[int, int, int]:
    """(ended, queued, running) of `count` jobs in etcd: most of what etcd holds within
    `retainInEtcd` has ended; a few per cent wait, fewer run."""
    running = count // 50
    queued = count * 8 // 100
    return count - queued - running, queued, running


def _live_record(n: int, phase: JobPhase, now: float, rng: random.Random) -> JobRecord:
    job_id = f"live-{n:07d}"
    tenant = RESTART_TENANTS[n % len(RESTART_TENANTS)]
    record = build_job(job_id, tenant=tenant, gpus=1, annotations=(("sim.gpufed.io/duration", "24h"),))
    submitted = now - 3000.0 + rng.random() * 600.0
    if phase is JobPhase.QUEUED:
        return replace(
            record,
            submitted_at_s=submitted,
            queued_at_s=submitted,
            events=(PhaseEvent(JobPhase.QUEUED, submitted, 1),),
        )
    started = submitted + 5.0
    events: tuple[PhaseEvent, ...] = (
        PhaseEvent(JobPhase.QUEUED, submitted, 1),
        PhaseEvent(JobPhase.ADMITTED, started - 2.0, 1),
        PhaseEvent(JobPhase.DISPATCHED, started - 1.0, 1),
        PhaseEvent(JobPhase.RUNNING, started, 1),
    )
    if phase is JobPhase.SUCCEEDED:
        # Ended within the last 40 minutes: inside `retainInEtcd` (an hour), so the archiver leaves
        # them where a steady state has them.
        events = (*events, PhaseEvent(JobPhase.SUCCEEDED, started + rng.random() * 600.0, 1, "done"))
    return replace(
        record,
        phase=phase,
        submitted_at_s=submitted,
        queued_at_s=submitted,
        placement=JobPlacement(ClusterName("onprem"), GpuType("H100"), CapacityKind.PRIVATE, 2.2),
        events=events,
    )


def _live_interval(record: JobRecord) -> LedgerInterval:
    start = next(e.at_s for e in record.events if e.phase is JobPhase.RUNNING)
    ended = record.events[-1] if record.phase.is_terminal else None
    return LedgerInterval(
        job_id=record.job_id,
        attempt=1,
        tenant=record.tenant,
        user=record.user,
        cluster=ClusterName("onprem"),
        provider="private",
        region="dc1",
        gpu_type=GpuType("H100"),
        gpu_count=1,
        kind=CapacityKind.PRIVATE,
        start_s=start,
        end_s=None if ended is None else ended.at_s,
        usd_per_gpu_hour=2.2,
        ended=None if ended is None else IntervalEnd.FINISHED,
        job_name=record.spec.name,
    )


async def seed_live(endpoint: str, state_dir: Path, config_text: str, count: int) -> JobId:
    """`count` jobs in etcd (records and their ledger intervals, through the store's own encoding,
    128 creates per etcd request), the running ones' gangs on the member cluster's journal, and the
    config's tenants, users and tokens; returns a queued job's id, for the serving check."""
    # The member cluster's and bootstrap's info lines (one per gang) would bury the figures.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    config = parse_config(config_text)
    now = time.time()
    rng = random.Random(7)
    ended, queued, running = live_mix(count)
    phases = [JobPhase.SUCCEEDED] * ended + [JobPhase.QUEUED] * queued + [JobPhase.RUNNING] * running
    rng.shuffle(phases)
    kv = await EtcdKv.connect(endpoint)
    try:
        await bootstrap(KvStore(kv), config, state_dir / "tokens")
        (state_dir / "clusters").mkdir(parents=True, exist_ok=True)
        cluster = InMemoryCluster(
            ClusterName("onprem"),
            provider=Provider.PRIVATE,
            region="dc1",
            pools=config.clusters[0].pools,
            journal_path=state_dir / "clusters" / "onprem.journal",
        )
        records = [_live_record(n, phase, now, rng) for n, phase in enumerate(phases)]
        txns = []
        for record in records:
            puts = [Put(job_key(record.job_id), json.dumps(job_to_dict(record)).encode())]
            if record.phase is not JobPhase.QUEUED:
                interval = _live_interval(record)
                puts.append(Put(interval.key, json.dumps(interval_to_dict(interval)).encode()))
            if record.phase is JobPhase.RUNNING:
                await cluster.dispatch(workload_for(record))
            txns.append(Txn((Compare.absent(job_key(record.job_id)),), tuple(puts)))
        # etcd counts the nested transactions' operations against its limit too: 40 jobs of at
        # most three each.
        batches = [txns[i : i + 40] for i in range(0, len(txns), 40)]
        for i in range(0, len(batches), 8):
            await asyncio.gather(*(kv.txn_many(b) for b in batches[i : i + 8]))
    finally:
        await kv.close()
    return next(r.job_id for r in records if r.phase is JobPhase.QUEUED)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def _cpu_s(pid: int) -> float:
    """CPU seconds (user and system) a live process has used so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_restart(
    endpoint: str, state_dir: Path, config_path: Path, job_id: JobId, label: str
) -> tuple[float, float]:
    """Seconds from launching one `gpufed serve` process to serving: `/readyz` 200 (caches listed,
    the leader's first reconciler tick and scheduling cycle done, archived usage read), then a
    GetJob of a queued job answered correctly on a fresh channel. Stops it after. Returns the
    seconds and the server's CPU seconds by then (the wall time on a shared machine varies with
    the load; the CPU time much less).

    `/readyz` is polled first because a gRPC channel that found no server backs off (a second,
    then more) before it tries again, which would add its backoff to the figure."""
    port, http_port = free_ports(2)
    token = (state_dir / "tokens" / "admin.token").read_text().strip()
    log = (state_dir / f"serve-{label}.log").open("wb")
    began = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "federation", "--state-dir", str(state_dir), "serve",
            "--etcd", endpoint, "--port", str(port), "--metrics-port", str(http_port),
            "--bootstrap", str(config_path), "--identity", f"bench-{label}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        # As an installed server runs: with its modules' bytecode cached (pip compiles on install),
        # which the first, untimed start writes; not compiling 300 modules on every start.
        env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
    )  # fmt: skip
    try:
        while not _ready(f"http://127.0.0.1:{http_port}/readyz"):
            if proc.poll() is not None:
                raise SystemExit(f"gpufed serve exited ({proc.returncode}); see {log.name}")
            if time.perf_counter() - began > 300:
                raise SystemExit(f"gpufed serve not ready after 300 s; see {log.name}")
            time.sleep(0.02)
        with GpufedClient(f"127.0.0.1:{port}", token, timeout_s=10.0) as client:
            job = client.get(job_id)
        serving = time.perf_counter() - began
        cpu = _cpu_s(proc.pid)
        assert job.job_id == job_id, job
        assert job.phase == pb.JOB_PHASE_QUEUED, job
        return serving, cpu
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _startup_parts(log_path: Path) -> dict[str, float]:
    """What the server's log says its start spent: listing etcd (wall and CPU seconds), the
    leader's first pass, and the process's CPU seconds when listed and when first pass was done."""
    parts = dict.fromkeys(
        ("listed_s", "listed_cpu_s", "cpu_listed_s", "first_pass_s", "cpu_first_pass_s"), float("nan")
    )
    for line in log_path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry.get("event") == "server_started":
            parts["listed_s"] = float(entry["listed_s"])
            parts["listed_cpu_s"] = float(entry.get("listed_cpu_s", "nan"))
            parts["cpu_listed_s"] = float(entry.get("cpu_s", "nan"))
        elif entry.get("event") == "leader_first_pass_done":
            parts["first_pass_s"] = float(entry["seconds"])
            parts["cpu_first_pass_s"] = float(entry.get("cpu_s", "nan"))
    return parts


def sample_of_history(
    interval_rows: Sequence[tuple[Any, ...]], day_rows: Sequence[tuple[Any, ...]], every: int
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every `every`-th interval and its days: a smaller history over the same year."""
    kept = interval_rows[::every]
    ids = {row[0] for row in kept}
    return list(kept), [row for row in day_rows if row[0] in ids]


REFERENCE_LOOP_STEPS = 20_000_000


def reference_loop_s() -> float:
    """Seconds for a fixed pure-Python loop, timed beside the restarts: this machine's speed swings
    from hour to hour (one evening a fixed loop took 2.0 to 3.5 s where it usually takes about 2), and
    a restart's figure can only be judged against the speed of the hour it ran in."""
    began = time.perf_counter()
    total = 0
    for step in range(REFERENCE_LOOP_STEPS):
        total += step
    assert total == REFERENCE_LOOP_STEPS * (REFERENCE_LOOP_STEPS - 1) // 2
    return time.perf_counter() - began


def measure_restarts(
    tmp: Path,
    args: argparse.Namespace,
    histories: Sequence[tuple[str, str]],
    figures: dict[str, tuple[float, str]],
) -> None:
    """Seeds a real etcd with `args.live` jobs, starts `gpufed serve` on it once (its first start
    writes what a running federation has: wait reasons, the leader key's history), then restarts it
    against each history database in `histories` ((label, DSN)), timing each restart."""
    state_dir = tmp / "restart-state"
    ended, queued, running = live_mix(args.live)
    loops = [reference_loop_s()]
    with EtcdProcess(tmp / "etcd") as etcd:
        with phase(
            f"etcd seeded with {args.live} live jobs ({ended} ended, {queued} queued, {running} running)"
        ):
            job_id = asyncio.run(
                seed_live(etcd.endpoint, state_dir, restart_config(histories[0][1], running), args.live)
            )
        for n, (label, dsn) in enumerate(histories):
            config_path = tmp / f"restart-{label}.yaml"
            config_path.write_text(restart_config(dsn, running))
            if n == 0 and args.quick:
                # Not a start of its own in --quick (it costs ten seconds of the minute): the
                # modules' bytecode written as pip would have, and the first timed start writes
                # the queued jobs' wait reasons itself (a little slower than a restart, never faster).
                with phase("bytecode of the project's modules"):
                    for package in ("federation", "clusters", "placement", "datasync", "iac"):
                        compileall.compile_dir(ROOT / package, quiet=1)
            elif n == 0:
                first, _ = time_restart(etcd.endpoint, state_dir, config_path, job_id, "first")
                print(f"  first start after seeding: {first:.1f} s")
            serving, cpu = time_restart(etcd.endpoint, state_dir, config_path, job_id, label)
            parts = _startup_parts(state_dir / f"serve-{label}.log")
            print(
                f"  restart, history {label}: serving at {serving:.2f} s, {cpu:.2f} s of the server's "
                f"CPU (listing etcd {parts['listed_s']:.2f} s, {parts['listed_cpu_s']:.2f} s of CPU; "
                f"the leader's first pass {parts['first_pass_s']:.2f} s; the process's CPU "
                f"{parts['cpu_listed_s']:.2f} s when listed, {parts['cpu_first_pass_s']:.2f} s at the "
                "first pass's end; the rest is the interpreter, imports, bootstrap and the members)"
            )
            figures[f"restart_to_serving_s_{label}"] = (serving, "s")
    loops.append(reference_loop_s())
    # The slower of the loop before and after the restarts: the machine's speed during them.
    figures["reference_loop_s"] = (max(loops), "s")
    print(
        f"  reference loop ({REFERENCE_LOOP_STEPS:,} additions): {loops[0]:.2f} s before, {loops[1]:.2f} s after"
    )


def _print_figures(figures: dict[str, tuple[float, str]]) -> None:
    for name, (value, unit) in figures.items():
        print(f"{name}: {value:.3f} {unit}" if unit == "s" else f"{name}: {value:.0f} {unit}")


def restart_only(args: argparse.Namespace, figures: dict[str, tuple[float, str]]) -> int:
    """The restart alone, against an empty SQLite history: what the restart costs with the SQL
    side at its cheapest, to iterate on the etcd side without loading a year of intervals."""
    with tempfile.TemporaryDirectory(prefix="gpufed-bench-restart-") as tmp_name:
        tmp = Path(tmp_name)
        empty_dsn = f"sqlite:///{tmp / 'history-empty.sqlite3'}"
        SqlHistoryStore.open(empty_dsn).close()
        measure_restarts(
            tmp, argparse.Namespace(**{**vars(args), "quick": False}), [("archived_0", empty_dsn)], figures
        )
    figures["restart_to_serving_s"] = figures["restart_to_serving_s_archived_0"]
    print(f"restart: {args.live} jobs in etcd, no archived history")
    _print_figures(figures)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--restart-only",
        action="store_true",
        help="only the restart (with an empty SQLite history), untimed first start included",
    )
    parser.add_argument("--intervals", type=int, default=1_000_000)
    parser.add_argument(
        "--archived-jobs",
        type=int,
        default=None,
        help="archived job rows beside the intervals, one per interval (as many as --intervals; quick 0)",
    )
    parser.add_argument(
        "--live", type=int, default=None, help="jobs in etcd for the restart (100,000; quick 10,000)"
    )
    args = parser.parse_args()
    runs, jobs = (1, 2_000) if args.quick else (5, 20_000)
    if args.live is None:
        args.live = 10_000 if args.quick else 100_000
    figures: dict[str, tuple[float, str]] = {}
    if args.restart_only:
        return restart_only(args, figures)

    began = time.perf_counter()
    interval_rows, day_rows = year_of_intervals(args.intervals)
    print(
        f"generated {len(interval_rows)} intervals ({len(day_rows)} interval-days) in {time.perf_counter() - began:.1f} s"
    )
    expected = expected_month_gpu_hours(day_rows)
    if args.archived_jobs is None:
        args.archived_jobs = 0 if args.quick else len(interval_rows)
    began = time.perf_counter()
    job_rows = archived_job_rows(interval_rows[: args.archived_jobs])
    print(f"generated {len(job_rows)} archived job rows in {time.perf_counter() - began:.1f} s")

    # fsync on (durable), with room for the load's WAL between checkpoints, as a production server has.
    with (
        tempfile.TemporaryDirectory(prefix="gpufed-bench-history-") as tmp_name,
        PostgresProcess(
            durable=True, settings={"max_wal_size": "4GB", "maintenance_work_mem": "256MB"}
        ) as postgres,
    ):
        tmp = Path(tmp_name)
        postgres_dsn = postgres.create_database("bench_history")
        SqlHistoryStore.open(postgres_dsn).close()  # migrated before the loader starts
        # The two loads run side by side (a forked process fills PostgreSQL), and only the loads:
        # every timed query runs alone.
        loader = multiprocessing.get_context("fork").Process(
            target=_load_postgres_in_child, args=(postgres_dsn, interval_rows, day_rows, job_rows)
        )
        began = time.perf_counter()
        loader.start()
        sqlite_dsn = f"sqlite:///{tmp / 'history.sqlite3'}"
        sqlite_store = SqlHistoryStore.open(sqlite_dsn)
        try:
            load_sqlite(sqlite_store, interval_rows, day_rows, job_rows)
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

        # Restart against growing histories: none, a tenth (full run), all of it on each backend.
        histories = []
        if not args.quick:
            empty_dsn = f"sqlite:///{tmp / 'history-empty.sqlite3'}"
            SqlHistoryStore.open(empty_dsn).close()
            histories.append(("archived_0", empty_dsn))
            tenth_dsn = f"sqlite:///{tmp / 'history-tenth.sqlite3'}"
            tenth = SqlHistoryStore.open(tenth_dsn)
            try:
                with phase("sqlite load of a tenth of the history"):
                    load_sqlite(tenth, *sample_of_history(interval_rows, day_rows, 10))
            finally:
                tenth.close()
            histories.append((f"archived_{args.intervals // 10}_sqlite", tenth_dsn))
        histories.append((f"archived_{args.intervals}_sqlite", sqlite_dsn))
        histories.append((f"archived_{args.intervals}_postgres", postgres_dsn))
        measure_restarts(tmp, args, histories, figures)

    for figure in ("month_report_s", "year_report_s"):
        figures[figure] = (max(figures[f"{figure}_sqlite"][0], figures[f"{figure}_postgres"][0]), "s")
    figures["archive_jobs_per_s"] = (
        min(figures["archive_jobs_per_s_sqlite"][0], figures["archive_jobs_per_s_postgres"][0]),
        "jobs/s",
    )
    figures["restart_to_serving_s"] = (
        max(value for name, (value, _) in figures.items() if name.startswith("restart_to_serving_s_")),
        "s",
    )
    print(
        f"intervals: {args.intervals} over 2026; month June 2026; runs: median of {runs}; archived {jobs} jobs per backend"
    )
    print(f"history: {args.intervals} intervals and {args.archived_jobs} archived job rows on each backend")
    print(
        f"restart: {args.live} jobs in etcd, `gpufed serve` launched to GetJob answered and /readyz 200 "
        "(leader's first pass done); restart_to_serving_s is the slowest history's"
    )
    print("aims: month_report_s < 1 s, year_report_s < 2 s, on both backends; restart_to_serving_s < 5 s")
    _print_figures(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
