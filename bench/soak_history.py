"""The history soak of issue 19: jobs through two real servers with the archiver on, the leader
SIGKILLed during archiving, and etcd's size sampled all along; then the jobs and ledger intervals are
counted in PostgreSQL plus etcd against the submissions.

Time is compressed: `history.retainInEtcd` (an hour in production) and etcd's compaction retention
are seconds, so "flat after the first hour" is "flat after the warm-up" (printed). Submissions are
paced at `--rate`, which sets the bound on etcd's size (see tests/e2e/soak.py, `SoakPlan.bound_bytes`):
the bound depends on the rate and the windows, not on how many jobs went through.

    python bench/soak_history.py                       # 20 leader kills; as many jobs as fit ~20 min
    python bench/soak_history.py --jobs 200000 --rate 170   # the issue's 200,000 (if it keeps up)
    python bench/soak_history.py --quick               # within 60 s: 200 jobs, 1 leader kill

Everything is local and on loopback: etcd, PostgreSQL (Debian's), the simulator, `gpufed serve`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from federation.runtime.postgres_process import PostgresProcess  # noqa: E402
from tests.e2e.soak import MiB, Soak, SoakPlan, SoakResult  # noqa: E402

ISSUE_JOBS = 200_000


def plan_of(args: argparse.Namespace) -> SoakPlan:
    if args.quick:
        return SoakPlan(
            jobs=args.jobs or 200,
            kills=args.kills if args.kills is not None else 1,
            rate_per_s=args.rate or 25.0,
            retain_s=1.0,
            compaction_s=2,
            clusters=2,
            nodes_per_cluster=8,
            submit_threads=4,
            drain_timeout_s=30.0,
            record_pods=True,
            sample_s=1.0,
        )
    rate = args.rate or 12.0
    return SoakPlan(
        jobs=args.jobs or int(rate * args.minutes * 60),
        kills=args.kills if args.kills is not None else 20,
        rate_per_s=rate,
        retain_s=args.retain_s,
        compaction_s=args.compaction_s,
        clusters=4,
        nodes_per_cluster=32,
        submit_threads=8,
        drain_timeout_s=300.0,
        record_pods=args.record_pods,
        sample_s=2.0,
    )


def report(result: SoakResult) -> None:
    plan = result.plan
    warm = result.warm_samples
    half = len(warm) // 2
    first, second = warm[:half], warm[half:]
    took = result.submit_took_s + result.drain_took_s
    through = len(result.sql_jobs) + len(result.etcd_jobs)
    print("\nt_s  db_mib  in_use_mib  bound_mib  etcd_jobs  logs_keys  archived_logs  revision  compacted_to")
    step = max(1, len(result.samples) // 25)
    for s in result.samples[::step] + result.samples[-1:]:
        print(
            f"{s.t_s:5.0f} {s.db_size_bytes / MiB:7.1f} {s.db_in_use_bytes / MiB:10.1f} "
            f"{plan.bound_bytes / MiB:10.1f} {s.etcd_jobs:10d} {s.logs_keys:10d} "
            f"{s.archived_logs_keys:14d} {s.revision:9d} {s.compact_revision:13d}"
        )
    for kill in result.kills:
        print(
            f"kill at {kill.t_s:.0f} s of {kill.identity}: {kill.sql_jobs} in SQL, {kill.etcd_jobs} in etcd"
        )
    problems = result.problems()
    for problem in problems:
        print(f"PROBLEM: {problem}")
    totals = result.totals()
    print(
        f"\nwarm-up: {plan.warmup_s:.0f} s; bound: 2 x (rate {plan.rate_per_s:g}/s x live window "
        f"{plan.live_window_s:.0f} s x 16 KiB + rate x 16 revisions x 4 KiB x 2 x compaction {plan.compaction_s} s)"
        " + 16 MiB; kept logs leave etcd with their job, so nothing grows with the jobs through"
    )
    print(f"jobs_through: {through} jobs")
    print(f"jobs_submitted: {len(result.accepted)} jobs")
    print(f"sql_jobs: {len(result.sql_jobs)} jobs")
    print(f"etcd_jobs_left: {len(result.etcd_jobs)} jobs")
    print(f"ledger_intervals: {totals['intervals']} intervals")
    print(f"offered_rate: {plan.rate_per_s:g} jobs/s")
    print(f"submit_rate: {len(result.accepted) / max(result.submit_took_s, 1e-9):.1f} jobs/s")
    print(f"throughput: {through / max(took, 1e-9):.1f} jobs/s")
    print(f"drain_s: {result.drain_took_s:.1f} s")
    print(f"leader_kills: {len(result.kills)} kills")
    print(f"etcd_db_max_mib: {result.db_max_bytes / MiB:.1f} MiB")
    print(f"etcd_db_bound_flat_mib: {plan.bound_bytes / MiB:.1f} MiB")
    last = result.samples[-1] if result.samples else None
    if last is not None:
        print(f"etcd_kept_log_keys_at_end: {last.logs_keys} keys")
        print(
            "etcd_kept_log_keys_of_archived_jobs_max: "
            f"{max(s.archived_logs_keys for s in result.samples)} keys"
        )
        print(f"sql_kept_tails: {result.sql_tails} tails")
        print(f"etcd_live_jobs_max: {max(s.etcd_jobs for s in result.samples)} jobs")
    if len(warm) >= 2 and through:
        grown = warm[-1].db_in_use_bytes - warm[0].db_in_use_bytes
        print(f"etcd_in_use_growth_after_warmup_mib: {grown / MiB:.1f} MiB")
    if first and second:
        print(f"etcd_db_warm_first_half_max_mib: {max(s.db_size_bytes for s in first) / MiB:.1f} MiB")
        print(f"etcd_db_warm_second_half_max_mib: {max(s.db_size_bytes for s in second) / MiB:.1f} MiB")
    print(
        f"etcd_db_in_use_max_mib: {max((s.db_in_use_bytes for s in result.samples), default=0) / MiB:.1f} MiB"
    )
    print(f"etcd_compactions_seen: {len({s.compact_revision for s in result.samples} - {0})} revisions")
    print(f"revisions_per_job: {result.revisions_per_job:.1f} revisions")
    print(f"mean_job_record_bytes: {result.mean_job_value_bytes:.0f} B")
    print(f"submit_retries: {result.submit_errors} calls")
    lost_or_doubled = len(result.lost()) + len(result.doubled_jobs())
    print(f"lost_or_doubled: {lost_or_doubled} jobs")
    print(f"intervals_doubled: {len(result.doubled_intervals())} intervals")
    rate = through / max(took, 1e-9)
    print(f"issue_200k_run_estimate_min: {ISSUE_JOBS / max(rate, 1e-9) / 60:.0f} min")
    print(f"problems: {len(problems)} problems")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a small run, within 60 s")
    parser.add_argument("--jobs", type=int, help="jobs to submit (default: rate x minutes)")
    parser.add_argument("--rate", type=float, help="submissions per second (default 12; quick 25)")
    parser.add_argument(
        "--minutes", type=float, default=18.0, help="submission time when --jobs is not given"
    )
    parser.add_argument("--kills", type=int, help="leader SIGKILLs (default 20; quick 1)")
    parser.add_argument("--retain-s", type=float, default=10.0, help="history.retainInEtcd, seconds")
    parser.add_argument(
        "--compaction-s", type=int, default=10, help="etcd --auto-compaction-retention, seconds"
    )
    parser.add_argument("--record-pods", action="store_true", help="check the ledger against a pod watch too")
    parser.add_argument("--work-dir", type=Path, help="keep the run's files here (default: a temp dir)")
    args = parser.parse_args()
    plan = plan_of(args)
    print(
        f"soak: {plan.jobs} jobs at {plan.rate_per_s:g}/s, {plan.kills} leader kills, "
        f"retainInEtcd {plan.retain_s:g} s, etcd compaction {plan.compaction_s} s"
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpufed-soak-") as tmp, PostgresProcess() as postgres:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = Soak(plan, work, postgres, "soak_history").run(log=lambda m: print(m, flush=True))
    report(result)
    print(f"soak_total_s: {time.monotonic() - started:.1f} s")
    sys.exit(1 if result.problems() else 0)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
