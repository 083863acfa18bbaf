"""The savings report (issue 35) over a month of ledger intervals: how long computing and rendering
take, in Python, one interval at a time.

Builds `bench/report.py`'s month of 100,000 intervals (seeded), gives two thirds of the attempts a
burst-at-once offer seen up to an hour before they started and a fifth a job set, checks that the
report's `paid_usd` equals the usage report's cloud cost to the micro-dollar, then times
`compute_savings` by tenant and GPU type, by set, and by tenant and day, and the CSV and HTML
renderers (median of several runs).

    python bench/savings.py            # 7 runs each
    python bench/savings.py --quick    # 3 runs each

Ends with one `figure_name: value unit` line per figure.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import ledger  # noqa: E402
from federation.ledger.report import Bucket, ReportQuery, compute_report  # noqa: E402
from federation.ledger.report.savings import SavingsDim, SavingsQuery, compute_savings  # noqa: E402
from federation.ledger.report.savings_render import render_savings_csv, render_savings_html  # noqa: E402
from federation.store.intervals import LedgerInterval  # noqa: E402
from federation.store.jobs import BurstOffer  # noqa: E402
from placement.model import CapacityKind, ClusterName, GpuType  # noqa: E402


def with_offers(intervals: list[LedgerInterval], seed: int = 11) -> list[LedgerInterval]:
    rng = random.Random(seed)
    out = []
    for iv in intervals:
        offer = None
        if rng.random() < 2 / 3:
            offer = BurstOffer(
                cluster=ClusterName("cloud-0"),
                gpu_type=GpuType(iv.gpu_type),
                kind=CapacityKind.ON_DEMAND,
                usd_per_gpu_hour=round(rng.uniform(2.0, 12.0), 2),
                seen_at_s=iv.start_s - rng.uniform(0, 3600.0),
                attempt=iv.attempt,
            )
        job_set = f"sweep-{rng.randrange(200)}" if rng.random() < 0.2 else ""
        out.append(replace(iv, burst_offer=offer, job_set=job_set, set_kind="sweep" if job_set else ""))
    return out


def timed(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 runs per figure instead of 7")
    parser.add_argument("--intervals", type=int, default=100_000)
    args = parser.parse_args()
    runs = 3 if args.quick else 7
    start = datetime(2026, 11, 1, tzinfo=UTC).timestamp()
    end = datetime(2026, 12, 1, tzinfo=UTC).timestamp()
    intervals = with_offers(ledger(args.intervals, start))
    now = end + 86400.0

    by_type = SavingsQuery(start_s=start, end_s=end, now_s=now)
    report = compute_savings(intervals, by_type)
    public = [iv for iv in intervals if iv.kind is not CapacityKind.PRIVATE]
    usage = compute_report(public, [], ReportQuery(start_s=start, end_s=end, now_s=now))
    assert report.total.paid_micro == round(usage.total_cost_usd * 1_000_000), "paid != usage report's cost"
    print(
        f"{len(intervals):,} intervals: paid ${report.total.paid_micro / 1e6:,.2f}, burst at once "
        f"${report.total.burst_micro / 1e6:,.2f}, {report.total.attempts_no_offer:,} attempts without an offer"
    )

    by_set = replace(by_type, group_by=(SavingsDim.SET,))
    by_day = replace(by_type, group_by=(SavingsDim.TENANT,), bucket=Bucket.DAY)
    figures = {
        "savings_100k_by_tenant_gpu_type_ms": timed(lambda: compute_savings(intervals, by_type), runs),
        "savings_100k_by_set_ms": timed(lambda: compute_savings(intervals, by_set), runs),
        "savings_100k_by_tenant_day_ms": timed(lambda: compute_savings(intervals, by_day), runs),
    }
    day_report = compute_savings(intervals, by_day)
    figures["savings_csv_by_tenant_day_ms"] = timed(lambda: render_savings_csv(day_report), runs)
    figures["savings_html_by_tenant_day_ms"] = timed(lambda: render_savings_html(day_report), runs)
    for name, seconds in figures.items():
        print(f"{name}: {seconds * 1000:.0f} ms")


if __name__ == "__main__":
    main()
