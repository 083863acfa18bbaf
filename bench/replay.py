"""Replay Philly weeks through the real placer under every policy, at every private size.

    .venv/bin/python bench/replay.py                 # the config's week, every policy and size
    .venv/bin/python bench/replay.py --weeks all     # every week beside it (../shared/data/traces/)
    .venv/bin/python bench/replay.py --quick         # every 30th job, no sweep rows (under a minute)
    .venv/bin/python bench/replay.py --weeks all --every 5 --policies burst_now,gpufed  # tuning
    .venv/bin/python bench/replay.py --ray           # the sweep in parallel with Ray
    .venv/bin/python bench/replay.py --workers 1     # serially (default: a process per core)

Writes the table (Markdown, CSV) and one cost-versus-JCT plot per size to --out (default
docs/results/ for the full week, a temporary directory for --quick), and ends with the headline
figures, one per line: `cost_ratio_vs_fixed_wait_curve_<size>` (gpufed's cloud cost over the
fixed-wait curve's at gpufed's average JCT), `cloud_cost_cut_vs_burst_now_<size>` and
`avg_jct_vs_burst_now_<size>`; with the config's `spot_curve`, also against the same curve and
burst-now run with gpufed's spot rule (`cost_ratio_vs_spot_fixed_wait_curve_<size>`,
`cloud_cost_cut_vs_spot_burst_now_<size>`): how much of the saving is the wait's rather than spot's.
With `--weeks all` each name carries the week too (`..._<week>_<size>x`), a directory per week holds
its table and plots, and the last lines are the worst week of each size
(`worst_cost_ratio_vs_fixed_wait_curve_<size>x` and the like).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from federation.cli.replay import executor_for  # noqa: E402
from federation.replay.config import load_config  # noqa: E402
from federation.replay.report import headlines, markdown, write_all  # noqa: E402
from federation.replay.sweep import for_weeks, sweep_weeks, weeks_beside  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=ROOT / "bench" / "replay.yaml")
    parser.add_argument(
        "--quick", action="store_true", help="every 30th job of each week (a smoke check, not a result)"
    )
    parser.add_argument(
        "--weeks", choices=("one", "all"), default="one", help="the config's trace, or every trace beside it"
    )
    parser.add_argument("--every", type=int, default=0, help="replay every Nth job (sample for tuning)")
    parser.add_argument(
        "--policies", default="", help="comma-separated policy names to run (default: all), for tuning"
    )
    parser.add_argument("--ray", action="store_true", help="run the sweep with Ray")
    # Every core by default: the replays are independent and give the same rows in any number of
    # processes, and serial `--quick` took 73 s here against 37 s on both cores.
    parser.add_argument(
        "--workers",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="local processes (1: serial; default: every core this process may use)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    config = load_config(args.config)
    # Every 20th, not 10th: with the reservation rule's searches, every 10th job of the week took about
    # 125 s of CPU over all policies and sizes, over a minute even with two idle cores.
    # Every 30th since issue 35: every 20th took 102 s of the replays' CPU (140 s of wall on a busy
    # machine), with the deadlines and the spot-aware curve.
    every = args.every or (30 if args.quick else 1)
    config = dataclasses.replace(config, every_nth_job=every)
    if args.quick:
        # A smoke check of the curves and gpufed's own setting: the sweep's other settings (eight rows
        # since issue 35) would take it past a minute on two cores.
        config = dataclasses.replace(config, gpufed_sweep=())
    if args.policies:
        config = dataclasses.replace(config, only_policies=tuple(args.policies.split(",")))
    sampled = every > 1 or bool(args.policies)
    out = args.out or (Path(tempfile.mkdtemp(prefix="replay-")) if sampled else ROOT / "docs" / "results")
    traces = weeks_beside(config.trace_path) if args.weeks == "all" else [config.trace_path]
    command = "python bench/replay.py " + " ".join(sys.argv[1:])
    started = time.perf_counter()
    rows = sweep_weeks(for_weeks(config, traces), executor_for(args.workers, args.ray))
    elapsed = time.perf_counter() - started
    lines = write_all(rows, out, command.strip())
    print(markdown(rows, headlines(rows)))
    print(f"results in {out}")
    print(f"sweep_wall_s: {elapsed:.1f} s")
    print(f"slowest_replay_s: {max(r.replay_s for r in rows):.1f} s")
    print(f"slowest_replay_cpu_s: {max(r.replay_cpu_s for r in rows):.1f} s")
    # The replays' own CPU, summed: on a shared machine the wall time says more about the others.
    print(f"sweep_replay_cpu_s: {sum(r.replay_cpu_s for r in rows):.1f} s")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
