"""One full scheduling cycle on a busy federation: the placer against a straightforward reference.

The snapshot (`bench/placer_scenario.py`): 10,000 waiting gangs, 50 clusters, 6 GPU types, 30
tenants, with running gangs on known nodes, quotas, budgets, priority classes, datasets, deadlines
and growable pools. Both implementations plan the same snapshot in the same process; the figures are
medians over several runs, and the admissions of the two must agree.

    python bench/placer.py            # 7 runs of the placer, 3 of the reference
    python bench/placer.py --quick    # 5 runs of the placer, 1 of the reference

Aim: one full cycle under 200 ms on a 2-core machine (recorded beside the measured value).

A wait decided for one gang is reused for an equal gang decided on the same working state (every
field but id and queue time equal; `placement.plan._Cycle.decide`). The scenario's gangs are all
different (each has its own expected run time), so there it costs only its bookkeeping; the second
scenario repeats each of a quarter as many gangs four times, as sweeps, arrays and a team's queue of
equal jobs do, and compares the plan with reuse to the plan that decides every gang afresh, in turns
in the same process (`repeated_*` figures; the two plans must be equal, reasons and all).

Wait reasons are worded when read (`placement/reasons.py`); the scheduler reads only those of jobs
whose reasons changed. `explain_all_ms` is the worst case: wording every waiting job's reasons after
the cycle, once.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.placer_reference import plan_reference  # noqa: E402
from bench.placer_scenario import NOW, build  # noqa: E402
from placement.model import JobId, Snapshot  # noqa: E402
from placement.plan import _plan, plan  # noqa: E402

AIM_MS = 200.0


def timed(function: object, runs: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(runs):
        gc.collect()
        started = time.perf_counter()
        result = function()  # type: ignore[operator]
        times.append((time.perf_counter() - started) * 1000)
    return times, result


def repeated(snapshot: Snapshot, copies: int) -> Snapshot:
    """Each queued gang `copies` times, with other ids and later queue times."""
    queued = tuple(
        replace(g, job_id=JobId(f"{g.job_id}-{k}"), queued_at_s=g.queued_at_s + 0.25 * k)
        for g in snapshot.queued
        for k in range(copies)
    )
    return replace(snapshot, queued=queued)


def reuse_figures(snapshot: Snapshot, runs: int) -> tuple[float, float, bool]:
    """Median ms of CPU with reuse and without, measured in turns (A B B A); whether the two plans
    are equal. CPU time, not wall: on a shared machine the wall time of one run moved by more than
    the difference measured."""
    reused_ms: list[float] = []
    fresh_ms: list[float] = []
    for turn in range(runs):
        order = ((True, reused_ms), (False, fresh_ms))
        for reuse, times in order if turn % 2 == 0 else reversed(order):
            gc.collect()
            started = time.process_time()
            _plan(snapshot, NOW, reuse=reuse)
            times.append((time.process_time() - started) * 1000)
    a, b = _plan(snapshot, NOW, reuse=True), _plan(snapshot, NOW, reuse=False)
    equal = (a.admissions, a.preemptions, a.capacity_requests, a.reservations, a.moves) == (
        b.admissions,
        b.preemptions,
        b.capacity_requests,
        b.reservations,
        b.moves,
    ) and [(w.job_id, w.reasons) for w in a.waiting] == [(w.job_id, w.reasons) for w in b.waiting]
    return statistics.median(reused_ms), statistics.median(fresh_ms), equal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs (finishes well within a minute)")
    parser.add_argument("--gangs", type=int, default=10_000)
    args = parser.parse_args()
    runs, reference_runs = (5, 1) if args.quick else (7, 3)

    snapshot = build(gangs=args.gangs)
    clusters = len(snapshot.clusters)
    types = len({p.gpu_type for c in snapshot.clusters for p in c.pools})
    print(
        f"snapshot: {len(snapshot.queued)} waiting gangs, {len(snapshot.running)} running, {clusters} clusters, "
        f"{types} GPU types, {len(snapshot.tenants)} tenants"
    )
    times, result = timed(lambda: plan(snapshot, now=NOW), runs)
    word_times, reasons = [], 0
    for _ in range(3):
        fresh = plan(snapshot, now=NOW)
        gc.collect()
        started = time.perf_counter()
        reasons = sum(len(w.reasons) for w in fresh.waiting)
        word_times.append((time.perf_counter() - started) * 1000)
    reference_times, reference = timed(lambda: plan_reference(snapshot, NOW), reference_runs)

    fast = [(a.job_id, a.cluster, a.gpu_type, a.kind) for a in result.admissions]  # type: ignore[attr-defined]
    slow = [(a.job_id, a.cluster, a.gpu_type, a.kind) for a in reference]  # type: ignore[attr-defined]
    agree = fast == slow
    if not agree:
        only_fast, only_slow = set(fast) - set(slow), set(slow) - set(fast)
        print(
            f"disagreement: {len(only_fast)} admissions only in the placer, {len(only_slow)} only in the reference"
        )
        for row in sorted(only_fast)[:5]:
            print("  placer only:", row)
        for row in sorted(only_slow)[:5]:
            print("  reference only:", row)
    median = statistics.median(times)
    reference_median = statistics.median(reference_times)
    admitted = len(result.admissions)  # type: ignore[attr-defined]
    print(
        f"plan: {admitted} admitted, {len(result.waiting)} waiting, {len(result.preemptions)} preemptions, "  # type: ignore[attr-defined]
        f"{len(result.capacity_requests)} capacity requests, {len(result.reservations)} reservations"  # type: ignore[attr-defined]
    )
    print(
        f"runs_ms: {', '.join(f'{t:.1f}' for t in times)} (reference: {', '.join(f'{t:.0f}' for t in reference_times)})"
    )
    print(f"aim_cycle_ms: {AIM_MS:.1f} ms")
    print(f"cycle_median_ms: {median:.1f} ms")
    print(
        f"explain_all_ms: {statistics.median(word_times):.1f} ms ({reasons} reasons of {len(fresh.waiting)} jobs)"
    )
    print(f"reference_cycle_median_ms: {reference_median:.1f} ms")
    print(f"speedup: {reference_median / median:.1f} x")
    print(f"per_admitted_job_us: {median * 1000 / max(admitted, 1):.1f} us")
    print(f"per_waiting_gang_us: {median * 1000 / max(len(snapshot.queued), 1):.1f} us")
    print(f"admissions_agree: {int(agree)} bool")

    distinct_reused, distinct_fresh, distinct_equal = reuse_figures(snapshot, runs)
    deep = repeated(build(gangs=args.gangs // 4), 4)
    deep_reused, deep_fresh, deep_equal = reuse_figures(deep, runs)
    print(
        f"reuse: all different {distinct_reused:.1f} ms with, {distinct_fresh:.1f} ms without; "
        f"{len(deep.queued)} gangs of {len(deep.queued) // 4} kinds {deep_reused:.1f} ms with, "
        f"{deep_fresh:.1f} ms without"
    )
    print(f"distinct_reuse_cost_ratio: {distinct_reused / distinct_fresh:.3f} ratio")
    print(f"repeated_cycle_median_ms: {deep_reused:.1f} ms")
    print(f"repeated_speedup_from_reuse: {deep_fresh / deep_reused:.2f} x")
    print(f"reuse_plans_equal: {int(distinct_equal and deep_equal)} bool")


if __name__ == "__main__":
    main()
