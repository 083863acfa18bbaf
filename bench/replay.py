"""Replay Philly weeks through the real placer under every policy, at every private size.

    .venv/bin/python bench/replay.py                 # the config's week, every policy and size
    .venv/bin/python bench/replay.py --weeks all     # every week beside it (../shared/data/traces/)
    .venv/bin/python bench/replay.py --quick         # every 30th job, no sweep rows (under a minute)
    .venv/bin/python bench/replay.py --weeks all --every 5 --policies burst_now,gpufed  # tuning
    .venv/bin/python bench/replay.py --ray           # the sweep in parallel with Ray
    .venv/bin/python bench/replay.py --workers 1     # serially (default: a process per core)
    # Replay only the policies a change can touch, the other rows taken from an earlier full run:
    .venv/bin/python bench/replay.py --weeks all --policies burst_now,gpufed \
        --reuse docs/results/weeks.csv --out /tmp/merged

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

`--reuse CSV` (repeatable; a later file wins) fills in the rows of (week, policy, size) this run does
not replay from earlier runs' CSVs (`weeks.csv`, or a week's `replay.csv`): for a change that cannot
touch some policies (the on-demand curve never sees spot, so the resumable rule leaves it as it was).
A reused row has no list of the jobs that missed their deadlines, so replay `burst_now` and the
policy being judged, whose lists the deadline figures compare. `--no-run` replays nothing and only
merges. `--headlines-for NAME` prints the figure lines of another policy too, judged as gpufed is
(`<NAME>:` before each line).
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
from federation.replay.metrics import Metrics  # noqa: E402
from federation.replay.policies import policies  # noqa: E402
from federation.replay.report import figure_lines, headlines, markdown, read_csv, write_all  # noqa: E402
from federation.replay.sweep import for_weeks, sweep_weeks, week_name, weeks_beside  # noqa: E402


def merged(
    run: list[Metrics], reused: list[list[Metrics]], weeks: list[str], order: list[str]
) -> list[Metrics]:
    """The rows of this run, and for every (week, policy, size) it did not replay, the last reused
    file's row; only the weeks of this run and the policies of its config (a reused row of a setting
    the config no longer has is stale, not a result), in week, size and policy order."""
    rows: dict[tuple[str, str, float], Metrics] = {}
    known = set(order)
    for earlier in reused:
        rows.update(
            {(r.week, r.policy, r.size_factor): r for r in earlier if r.week in weeks and r.policy in known}
        )
    rows.update({(r.week, r.policy, r.size_factor): r for r in run})
    rank = {name: index for index, name in enumerate(order)}
    return sorted(rows.values(), key=lambda r: (weeks.index(r.week), r.size_factor, rank[r.policy], r.policy))


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
    parser.add_argument(
        "--reuse",
        type=Path,
        action="append",
        default=[],
        help="an earlier run's CSV whose rows fill in the policies not replayed now (repeatable)",
    )
    parser.add_argument("--no-run", action="store_true", help="replay nothing: merge the --reuse files")
    parser.add_argument(
        "--headlines-for", action="append", default=[], help="also print this policy's figure lines"
    )
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
    sampled = every > 1 or (bool(args.policies) and not args.reuse)
    out = args.out or (Path(tempfile.mkdtemp(prefix="replay-")) if sampled else ROOT / "docs" / "results")
    traces = weeks_beside(config.trace_path) if args.weeks == "all" else [config.trace_path]
    command = "python bench/replay.py " + " ".join(sys.argv[1:])
    started = time.perf_counter()
    configs = for_weeks(config, traces)
    rows = [] if args.no_run else sweep_weeks(configs, executor_for(args.workers, args.ray))
    elapsed = time.perf_counter() - started
    if args.reuse:
        order = [p.name for p in policies(dataclasses.replace(config, only_policies=()))]
        rows = merged(rows, [read_csv(path) for path in args.reuse], [week_name(t) for t in traces], order)
    if not rows:
        parser.error("nothing to report: no replay ran and no reused row is of these weeks")
    lines = write_all(rows, out, command.strip())
    print(markdown(rows, headlines(rows)))
    print(f"results in {out}")
    print(f"sweep_wall_s: {elapsed:.1f} s")
    for name in args.headlines_for:
        heads = headlines(rows, policy=name)
        for line in figure_lines(heads):
            print(f"{name}: {line}")
    print(f"slowest_replay_s: {max(r.replay_s for r in rows):.1f} s")
    print(f"slowest_replay_cpu_s: {max(r.replay_cpu_s for r in rows):.1f} s")
    # The replays' own CPU, summed: on a shared machine the wall time says more about the others.
    print(f"sweep_replay_cpu_s: {sum(r.replay_cpu_s for r in rows):.1f} s")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
