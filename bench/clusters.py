"""The Kubernetes backend under load: inventory, dispatch and status for 1,000 gangs on 200 nodes.

Starts a simulated cluster as its own process (`python -m clusters.sim`), so that the simulator and
the backend do not share an interpreter, then drives it through `KubernetesBackend` as federation
would: dispatch many small gangs with bounded concurrency, read inventory and statuses while they
run, and time how long it takes until every gang is listed and until every gang has finished.

    python bench/clusters.py            # 1,000 gangs of 2 x 1 GPU on 200 nodes of 8 GPUs
    python bench/clusters.py --quick    # 300 gangs, the same cluster (well under a minute)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import structlog  # noqa: E402

from clusters.api import GangPhase, GangWorkload  # noqa: E402
from clusters.kubernetes import (  # noqa: E402
    GpuPrice,
    KubernetesBackend,
    KubernetesClusterConfig,
    KubernetesSettings,
)
from federation.runtime.sim_process import SimProcess  # noqa: E402
from placement.model import CapacityKind, ClusterName, GpuType, Provider  # noqa: E402
from tests.contract.helpers import a_gang  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


async def run(jobs: int, nodes: int, concurrency: int, duration_s: float) -> dict[str, tuple[float, str]]:
    figures: dict[str, tuple[float, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sim = SimProcess(
            Path(tmp),
            [
                {
                    "name": "bench",
                    "pools": [{"name": "h100", "gpuType": "H100", "gpusPerNode": 8, "nodes": nodes}],
                }
            ],
        )
        sim.start()
        kubeconfig = sim.kubeconfig
        try:
            config = KubernetesClusterConfig(
                name=ClusterName("bench"),
                provider=Provider.AWS,
                region="us-east-1",
                prices=(GpuPrice(GpuType("H100"), CapacityKind.ON_DEMAND, 9.5),),
                kubeconfig=kubeconfig,
                settings=KubernetesSettings(api_threads=concurrency, sync_timeout_s=30.0),
            )
            began = time.perf_counter()
            async with KubernetesBackend(config) as backend:
                assert await backend.wait_synced(30.0)
                figures["sync_s"] = (time.perf_counter() - began, "s")
                state = await backend.inventory()
                assert sum(len(p.free_gpus_per_node) for p in state.pools) == nodes
                figures.update(await load(backend, jobs, concurrency, duration_s))
                counts = backend.watch_counts()
                figures["relists_during_run"] = (sum(c[0] for c in counts.values()) - len(counts), "lists")
                figures["watch_events"] = (sum(c[2] for c in counts.values()), "events")
        finally:
            sim.stop(timeout_s=30)
    return figures


async def load(
    backend: KubernetesBackend, jobs: int, concurrency: int, duration_s: float
) -> dict[str, tuple[float, str]]:
    gangs = [
        a_gang(f"bench-{i:05d}", tenant=f"t{i % 4}", replicas=2, gpus=1, duration_s=duration_s)
        for i in range(jobs)
    ]
    keys = {(g.job_id, g.attempt) for g in gangs}
    dispatch_ms: list[float] = []
    inventory_ms: list[float] = []
    status_ms: list[float] = []
    gate = asyncio.Semaphore(concurrency)

    async def dispatch_one(gang: GangWorkload) -> None:
        async with gate:
            t = time.perf_counter()
            await backend.dispatch(gang)
            dispatch_ms.append((time.perf_counter() - t) * 1000)

    seen_all_s = finished_all_s = float("nan")
    began = time.perf_counter()
    dispatched_s: list[float] = []

    async def dispatch_all() -> None:
        await asyncio.gather(*(dispatch_one(g) for g in gangs))
        dispatched_s.append(time.perf_counter() - began)

    dispatching = asyncio.create_task(dispatch_all())
    while True:
        t = time.perf_counter()
        await backend.inventory()
        inventory_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        statuses = await backend.statuses()
        status_ms.append((time.perf_counter() - t) * 1000)
        mine = [s for s in statuses if (s.job_id, s.attempt) in keys]
        now = time.perf_counter() - began
        if len(mine) == jobs and seen_all_s != seen_all_s:
            seen_all_s = now
        if len(mine) == jobs and all(s.phase is GangPhase.SUCCEEDED for s in mine):
            finished_all_s = now
            break
        if now > 600:
            raise SystemExit(f"gave up: {sum(s.phase.is_final for s in mine)} of {jobs} finished after 600 s")
        await asyncio.sleep(0.05)
    await dispatching
    return {
        "dispatch_p50": (statistics.median(dispatch_ms), "ms"),
        "dispatch_p99": (percentile(dispatch_ms, 0.99), "ms"),
        "dispatch_throughput": (jobs / dispatched_s[0], "gangs/s"),
        "inventory_p50": (statistics.median(inventory_ms), "ms"),
        "inventory_p99": (percentile(inventory_ms, 0.99), "ms"),
        "statuses_p50": (statistics.median(status_ms), "ms"),
        "statuses_p99": (percentile(status_ms, 0.99), "ms"),
        "all_statuses_seen": (seen_all_s, "s"),
        "all_succeeded": (finished_all_s, "s"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 gangs instead of 1,000")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=5.0, help="simulated run time of each gang")
    args = parser.parse_args()
    jobs = args.jobs or (300 if args.quick else 1000)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    print(
        f"{jobs} gangs of 2 x 1 GPU, {args.nodes} nodes of 8 GPUs, {args.concurrency} dispatches in flight",
        flush=True,
    )
    cpu = os.times()
    figures = asyncio.run(run(jobs, args.nodes, args.concurrency, args.duration_s))
    used = os.times()
    figures["backend_cpu"] = (used.user + used.system - cpu.user - cpu.system, "s")
    for name, (value, unit) in figures.items():
        print(f"{name}: {value:.3g} {unit}")


if __name__ == "__main__":
    main()
