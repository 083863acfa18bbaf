"""How fast a simulated cluster takes and runs pods: `python -m clusters.sim.bench [--pods 1000]`.

Creates the pods through the official client over HTTP (from several threads, as a backend with a
connection pool would), then waits, through one watch, until every pod has run and succeeded, and
prints the figures. A benchmark, not a test: it asserts nothing and prints what it measured.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
from kubernetes import client, watch

from clusters.sim.config import SimPoolConfig, cluster
from clusters.sim.threaded import ThreadedSim


def _pod(i: int, duration_s: float) -> dict[str, object]:
    return {
        "metadata": {
            "name": f"bench-{i}",
            "labels": {"bench": "yes"},
            "annotations": {"sim.gpufed.io/duration": str(duration_s)},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ],
        },
    }


def run(pods: int, threads: int, duration_s: float) -> None:
    nodes = (pods + 7) // 8
    config = cluster("bench", [SimPoolConfig.of("a100", "A100", node_count=nodes)], event_limit=4 * pods)
    with ThreadedSim(config) as sim:
        configuration = client.Configuration()
        configuration.host = sim.url
        configuration.connection_pool_maxsize = threads
        # The client's own annotations are partial; the benchmark reads raw objects anyway.
        core: Any = client.CoreV1Api(client.ApiClient(configuration))
        rv = core.list_namespaced_pod("default").metadata.resource_version
        running: set[str] = set()
        done: set[str] = set()
        marks: dict[str, float] = {}
        started = time.monotonic()

        def follow() -> None:
            # Watch from before the first create: with thousands of pods the changes made while
            # they are created (binds, status, events) would otherwise outrun the history window.
            watcher: Any = watch.Watch()
            for event in watcher.stream(
                core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=600
            ):
                pod = event["raw_object"]
                phase = pod["status"].get("phase")
                if phase == "Running":
                    running.add(pod["metadata"]["name"])
                    if len(running) == pods:
                        marks.setdefault("running", time.monotonic() - started)
                elif phase == "Succeeded":
                    done.add(pod["metadata"]["name"])
                    if len(done) == pods:
                        watcher.stop()
                        return

        with ThreadPoolExecutor(threads + 1) as pool:
            followed = pool.submit(follow)
            list(pool.map(lambda i: core.create_namespaced_pod("default", _pod(i, duration_s)), range(pods)))
            created_s = time.monotonic() - started
            followed.result()
        all_running_s = marks.get("running", float("nan"))
        finished_s = time.monotonic() - started
        listed = time.monotonic()
        count = len(core.list_pod_for_all_namespaces().items)
        list_s = time.monotonic() - listed
    print(f"pods: {pods} on {nodes} nodes, {threads} client threads, {duration_s}s per pod")
    print(f"created (HTTP POST):      {created_s:6.2f} s  ({pods / created_s:,.0f} pods/s)")
    print(f"all Running:              {all_running_s:6.2f} s")
    print(f"all Succeeded (watched):  {finished_s:6.2f} s")
    print(f"list {count} pods:         {list_s * 1000:6.0f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clusters.sim.bench")
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    run(args.pods, args.threads, args.duration_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
