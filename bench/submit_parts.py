"""Parts of a submission's CPU, each timed alone in this process (issue 33).

No etcd and no gRPC server: what one submission's own pieces cost, for A/B runs against another tree
(run this file from a worktree of it: it imports the tree it sits in).

- `etcd_txn_build_us`: a submission's etcd transaction (2 compares, 2 puts, 2 reads) as a
  protobuf request (`kv_etcd._txn_to_pb`);
- `job_to_pb_us`: a reply's job message for a queued job with two phase events (`convert.job_to_pb`);
- `log_line_us`: the `job_submitted` line, JSON, written to a file (`federation.logs`).

    python bench/submit_parts.py            # 5 rounds of 20,000
    python bench/submit_parts.py --quick    # 3 rounds of 5,000

Each figure is the median of the rounds, in process CPU (`time.process_time`).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import structlog  # noqa: E402

from federation.api import convert  # noqa: E402
from federation.logs import configure_logging  # noqa: E402
from federation.store import kv_etcd  # noqa: E402
from federation.store.jobs import PhaseEvent  # noqa: E402
from federation.store.kv import Compare, Get, Put  # noqa: E402
from placement.model import JobPhase  # noqa: E402
from tests.conftest import build_job  # noqa: E402


def timed(one: Callable[[], object], n: int, rounds: int) -> float:
    """Median µs of `one` over `rounds` rounds of `n` calls."""
    figures = []
    for _ in range(rounds):
        began = time.process_time()
        for _ in range(n):
            one()
        figures.append(1e6 * (time.process_time() - began) / n)
    return statistics.median(figures)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="3 rounds of 5,000")
    args = parser.parse_args()
    n, rounds = (5_000, 3) if args.quick else (20_000, 5)

    idem, key = b"/gpufed/idem/t1/0123456789abcdef", b"/gpufed/jobs/train-1a2b3c4d"
    compares = (Compare.absent(idem), Compare.absent(key))
    success = (Put(idem, b'{"schema":1,"job_id":"train-1a2b3c4d","digest":"d"}'), Put(key, b"x" * 1500))
    failure = (Get(idem), Get(key))
    txn_us = timed(lambda: kv_etcd._txn_to_pb(compares, success, failure), n, rounds)

    job = dataclasses.replace(
        build_job("train-1a2b3c4d"),
        events=(
            PhaseEvent(JobPhase.QUEUED, 1000.0, 1, "submitted"),
            PhaseEvent(JobPhase.ADMITTED, 1001.5, 1, ""),
        ),
    )
    pb_us = timed(lambda: convert.job_to_pb(job), n, rounds)

    saved_stderr, saved_config = sys.stderr, structlog.get_config()
    with tempfile.TemporaryFile("w") as out:
        sys.stderr = out
        try:
            configure_logging(json=True)
            log = structlog.get_logger("federation.api.service")
            log_us = timed(
                lambda: log.info("job_submitted", job_id="train-1a2b3c4d", tenant="t1", user="u1"), n, rounds
            )
        finally:
            sys.stderr = saved_stderr
            structlog.configure(**saved_config)

    print(f"rounds: {rounds} of {n}")
    print(f"etcd_txn_build_us: {txn_us:.2f} us")
    print(f"job_to_pb_us: {pb_us:.2f} us")
    print(f"log_line_us: {log_us:.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
