"""`python -m clusters.sim --config FILE`: simulated clusters as a process, for `gpufed up` and tests.

Each cluster in the config gets its own loopback port. When all are serving, one JSON line goes
to stdout and, atomically, to `--ready-file`:

    {"pid": 1234, "clusters": [{"name": "onprem", "url": "http://127.0.0.1:40123",
                                "admin_url": "http://127.0.0.1:40123/sim/v1"}]}

so a parent process waits for the file (or the line) instead of polling ports. SIGTERM or SIGINT
stops every cluster cleanly. Logs go to stderr, leaving stdout to the ready line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
import yaml

from clusters.files import write_atomically
from clusters.sim.cluster import SimCluster
from clusters.sim.config import SimClusterConfig, SimConfigError, load


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m clusters.sim", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="YAML file: one cluster, or clusters: [...]")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--port", type=int, default=0, help="0 picks free ports; N gives N, N+1, ... per cluster"
    )
    parser.add_argument(
        "--ready-file", type=Path, help="where to write the JSON of names and URLs when ready"
    )
    parser.add_argument("--kubeconfig", type=Path, help="write one kubeconfig with a context per cluster")
    parser.add_argument("--time-scale", type=float, help="override every cluster's timeScale")
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="keep each cluster's state here (a snapshot per cluster) and go on from it when restarted",
    )
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started this one dies (for a parent killed with SIGKILL)",
    )
    return parser


async def _wait_for_orphaning(parent_pid: int, stop: asyncio.Event) -> None:
    # A parent killed with SIGKILL cannot stop us, and we live in a session of our own: once we
    # are reparented, nobody owns these clusters any more, so they go too.
    while not stop.is_set():
        if os.getppid() != parent_pid:
            sys.stderr.write(f"parent {parent_pid} is gone; stopping\n")
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)


def _kubeconfig(clusters: Sequence[SimCluster]) -> dict[str, Any]:
    docs = [c.kubeconfig_dict() for c in clusters]
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [d["clusters"][0] for d in docs],
        "users": [d["users"][0] for d in docs],
        "contexts": [d["contexts"][0] for d in docs],
        "current-context": docs[0]["current-context"],
        "preferences": {},
    }


# `gc.set_threshold`'s three for the simulator, as `gpufed serve` sets them
# (`federation.runtime.heap.GC_THRESHOLDS`, not imported: the simulator stands for the member clusters'
# API servers and takes nothing of the federation's). CPython's are 700, 10 and 10.
GC_THRESHOLDS = (10_000, 10, 100)


def _settle_heap() -> None:
    """Once every cluster serves: what the simulator made to start (its imports, every cluster's
    nodes and config) frozen, so that no full collection walks it again, and the collector run less
    often. It makes and drops objects by the thousand a second (every request, watch event and
    snapshot), nearly all freed by reference counting: at 100 clusters the collector took 4.6 s of
    its CPU over a 4,000-job lifecycle (bench/scale.py, 2026-12-01: 14 full collections of 270 ms
    each over every cluster's objects), a third of it; 1.1 s with these."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def serve(configs: Sequence[SimClusterConfig], args: argparse.Namespace) -> None:
    clusters = [
        SimCluster(config, host=args.host, port=args.port + i if args.port else 0, state_dir=args.state_dir)
        for i, config in enumerate(configs)
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    watcher = asyncio.create_task(_wait_for_orphaning(os.getppid(), stop)) if args.exit_with_parent else None
    started: list[SimCluster] = []
    try:
        for cluster in clusters:
            await cluster.start()
            started.append(cluster)
        if args.kubeconfig:
            write_atomically(args.kubeconfig, yaml.safe_dump(_kubeconfig(clusters), sort_keys=False))
        ready = {
            "pid": os.getpid(),
            "clusters": [
                {"name": c.name, "url": c.url, "admin_url": f"{c.url}/sim/v1", "restored": c.restored}
                for c in clusters
            ],
        }
        line = json.dumps(ready)
        _settle_heap()
        if args.ready_file:
            write_atomically(args.ready_file, line + "\n")
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        await stop.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
        for cluster in reversed(started):
            await cluster.stop()
        if args.ready_file:
            with contextlib.suppress(FileNotFoundError):
                args.ready_file.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    try:
        configs = load(args.config)
    except SimConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if args.time_scale:
        configs = tuple(dataclasses.replace(c, time_scale=args.time_scale) for c in configs)
    asyncio.run(serve(configs, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
