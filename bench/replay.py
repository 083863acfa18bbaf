"""Replay the Philly week through the real placer under every policy, at every private size.

    .venv/bin/python bench/replay.py                 # the whole week, every policy and size
    .venv/bin/python bench/replay.py --quick         # every 10th job (under a minute)
    .venv/bin/python bench/replay.py --ray           # the sweep in parallel with Ray
    .venv/bin/python bench/replay.py --workers 2     # ... or in a local process pool

Writes the table (Markdown, CSV) and one cost-versus-JCT plot per size to --out (default
docs/results/ for the full week, a temporary directory for --quick), and ends with the headline
figures, one per line: `cost_ratio_vs_fixed_wait_curve_<size>` (gpufed's cloud cost over the
fixed-wait curve's at gpufed's average JCT) and `cloud_cost_cut_vs_burst_now_<size>`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from federation.cli.replay import executor_for  # noqa: E402
from federation.replay.config import load_config  # noqa: E402
from federation.replay.report import headlines, markdown, write_all  # noqa: E402
from federation.replay.sweep import sweep  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=ROOT / "bench" / "replay.yaml")
    parser.add_argument("--quick", action="store_true", help="every 10th job of the week")
    parser.add_argument("--ray", action="store_true", help="run the sweep with Ray")
    parser.add_argument("--workers", type=int, default=1, help="local processes (1: serial)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    config = load_config(args.config)
    if args.quick:
        config = dataclasses.replace(config, every_nth_job=10)
    out = args.out or (Path(tempfile.mkdtemp(prefix="replay-")) if args.quick else ROOT / "docs" / "results")
    command = "python bench/replay.py " + " ".join(sys.argv[1:])
    started = time.perf_counter()
    rows = sweep(config, executor_for(args.workers, args.ray))
    elapsed = time.perf_counter() - started
    lines = write_all(rows, out, command.strip())
    print(markdown(rows, headlines(rows)))
    print(f"results in {out}")
    print(f"sweep_wall_s: {elapsed:.1f} s")
    print(f"slowest_replay_s: {max(r.replay_s for r in rows):.1f} s")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
