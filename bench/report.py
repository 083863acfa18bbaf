"""Finance reports over a month of ledger intervals: how long computing and rendering take.

Generates 100,000 intervals for one month (30 tenants, 10 clusters, 6 GPU types, seeded), then
times `compute_report` for several groupings (median of several runs) and the renderers. The aim:
a month of 100,000 intervals reported in under a second.

    python bench/report.py            # 100,000 intervals, 7 runs each
    python bench/report.py --quick    # 100,000 intervals, 3 runs each

Ends with one `figure_name: value unit` line per figure, e.g. `report_100k_by_tenant_day_ms: 90 ms`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from federation.ledger.report import (  # noqa: E402
    Bucket,
    Dim,
    ForecastBasis,
    ProvisionedInterval,
    ReportQuery,
    compute_report,
    focus_rows,
    idle_cost,
    render_focus_csv,
    render_html,
    render_json,
)
from federation.store.intervals import IntervalEnd, LedgerInterval  # noqa: E402
from federation.store.records import TenantRecord  # noqa: E402
from placement.model import CapacityKind, ClusterName, GpuQuota, GpuType, JobId, TenantId  # noqa: E402

TYPES = ("A100", "H100", "L4", "A10G", "V100", "T4")
KINDS = (CapacityKind.PRIVATE, CapacityKind.ON_DEMAND, CapacityKind.SPOT)


def ledger(count: int, month_start: float, seed: int = 7) -> list[LedgerInterval]:
    rng = random.Random(seed)
    month = 30 * 86400.0
    out = []
    for i in range(count):
        start = month_start + rng.uniform(0, month)
        length = rng.expovariate(1 / 7200.0)
        out.append(
            LedgerInterval(
                job_id=JobId(f"job-{i}"),
                attempt=1 + (i % 3 == 0),
                tenant=TenantId(f"team-{rng.randrange(30)}"),
                user=f"user-{rng.randrange(300)}",
                cluster=ClusterName(f"cluster-{rng.randrange(10)}"),
                provider=rng.choice(("private", "aws", "gcp", "azure")),
                region="r1",
                gpu_type=GpuType(rng.choice(TYPES)),
                gpu_count=rng.choice((1, 2, 4, 8, 8, 16, 32)),
                kind=rng.choice(KINDS),
                start_s=start,
                end_s=None if i % 50 == 0 else start + length,
                usd_per_gpu_hour=rng.uniform(0.5, 7.0),
                ended=None if i % 50 == 0 else IntervalEnd.FINISHED,
                # Half the jobs in sets (issue 34), a fifth sweep trials; by the index, so the
                # generator's other draws (and so every other figure's ledger) are unchanged.
                job_set=f"set-{i % 400}" if i % 2 == 0 else "",
                set_kind=("sweep" if i % 10 < 4 else "array") if i % 2 == 0 else "",
            )
        )
    return out


def timed(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return 1000 * statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--intervals", type=int, default=100_000)
    args = parser.parse_args()
    runs = 3 if args.quick else 7
    start = datetime(2026, 11, 1, tzinfo=UTC).timestamp()
    end = datetime(2026, 12, 1, tzinfo=UTC).timestamp()
    now = end - 3600
    intervals = ledger(args.intervals, start)
    tenants = [
        TenantRecord(
            TenantId(f"team-{i}"),
            quotas=(GpuQuota(GpuType("A100"), guaranteed_gpus=16),),
            monthly_budget_gpu_hours=50_000.0,
        )
        for i in range(30)
    ]
    cases = {
        "by_tenant": ReportQuery(start, end, now, (Dim.TENANT,)),
        "by_tenant_day": ReportQuery(start, end, now, (Dim.TENANT,), Bucket.DAY),
        "by_tenant_gpu_type_week": ReportQuery(start, end, now, (Dim.TENANT, Dim.GPU_TYPE), Bucket.WEEK),
        "by_user_cluster_month": ReportQuery(start, end, now, (Dim.USER, Dim.CLUSTER), Bucket.MONTH),
        "by_tenant_user_cluster_gpu_type_kind_day": ReportQuery(
            start, end, now, (Dim.TENANT, Dim.USER, Dim.CLUSTER, Dim.GPU_TYPE, Dim.KIND), Bucket.DAY
        ),
        "by_tenant_day_last_7_days_forecast": ReportQuery(
            start, end, now, (Dim.TENANT,), Bucket.DAY, forecast=ForecastBasis.LAST_7_DAYS
        ),
        # Issue 34: by set (the query adds the tenant: a set's name is its tenant's own), by sweep.
        "by_set": ReportQuery(start, end, now, (Dim.SET,)),
        "by_sweep_week": ReportQuery(start, end, now, (Dim.SWEEP,), Bucket.WEEK),
        "one_tenant_by_day": ReportQuery(
            start, end, now, (Dim.TENANT,), Bucket.DAY, frozenset({TenantId("team-3")})
        ),
    }
    scale = f"{len(intervals) // 1000}k"
    figures: dict[str, tuple[float, str]] = {}
    for name, query in cases.items():
        ms = timed(partial(compute_report, intervals, tenants, query), runs)
        figures[f"report_{scale}_{name}_ms"] = (ms, "ms")
    report = compute_report(intervals, tenants, cases["by_tenant_day"])
    # The figures must add up, or the timing means nothing.
    clipped = sum(iv.gpu_hours(since_s=start, until_s=now) for iv in intervals)
    assert abs(report.total_gpu_hours - clipped) <= 1e-9 * clipped, (report.total_gpu_hours, clipped)
    figures["render_json_ms"] = (timed(lambda: render_json(report), runs), "ms")
    figures["render_html_ms"] = (timed(lambda: render_html(report), runs), "ms")
    pools = [
        ProvisionedInterval(
            f"cluster-{c}", f"pool-{g}", g, 64, 3.0, start + h * 3600.0, start + (h + 36) * 3600.0
        )
        for c in range(10)
        for g in TYPES
        for h in range(0, 30 * 24, 48)
    ]
    figures[f"idle_cost_{scale}_{len(pools)}_pool_intervals_ms"] = (
        timed(lambda: idle_cost(pools, intervals, start_s=start, end_s=now), runs),
        "ms",
    )
    began = time.perf_counter()
    rows = focus_rows(intervals, cases["by_tenant"])
    figures["focus_rows_ms"] = (1000 * (time.perf_counter() - began), "ms")
    began = time.perf_counter()
    render_focus_csv(rows)
    figures["focus_csv_ms"] = (1000 * (time.perf_counter() - began), "ms")
    figures["focus_rows"] = (float(len(rows)), "rows")
    print(f"intervals: {len(intervals)} in one month, 30 tenants, 10 clusters, {len(TYPES)} GPU types")
    print(f"runs: median of {runs}")
    for name, (value, unit) in figures.items():
        print(f"{name}: {value:.0f} {unit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
