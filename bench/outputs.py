"""Benchmark: what outputs (issue 34) cost where it matters.

1. The placer's hold (`federation.datasets.outputs.awaited_inputs`), run by every scheduling cycle over
   every live job: a deep queue of 20,000 queued jobs (2,000 of them naming a version that 200 running
   producers declare), and the same queue with no outputs at all (the common case: one attribute read
   per job). Median of 21 calls, milliseconds.
2. Registration: succeeded jobs' outputs registered by one controller pass, each output 20 objects of
   4 KiB in a local-directory store, the registry in the in-memory etcd twin (hashing and the two
   listings dominate; etcd's round trips are what the twin leaves out). Outputs per second.

`--quick` uses 2,000 queued jobs and 20 outputs. Ends with `figure_name: value unit` lines.

    .venv/bin/python bench/outputs.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datasync.store_config import LocalStoreConfig
from federation.datasets.outputs import (
    OutputsController,
    Registrar,
    attempt_prefix,
    awaited_inputs,
)
from federation.datasets.registry import DatasetRegistry
from federation.datasets.stores import StoreDirectory, StoreRecord
from federation.spec.jobspec import DatasetRef, OutputSpec
from federation.store.job_store import InMemoryJobStore
from federation.store.jobs import JobPlacement, JobRecord, PhaseEvent
from federation.store.records import ClusterRecord
from placement.model import CapacityKind, ClusterName, GpuType, JobId, JobPhase, Provider
from tests.unit.reconcile_world import a_job


def _queue(queued: int, producers: int, with_outputs: bool) -> list[JobRecord]:
    base = a_job("q")
    jobs = []
    for i in range(producers if with_outputs else 0):
        spec = replace(base.spec, outputs=(OutputSpec(f"d{i}", f"vision/d{i}/", "v1"),))
        jobs.append(replace(base, job_id=JobId(f"p-{i}"), spec=spec, phase=JobPhase.RUNNING))
    for i in range(queued):
        ref = DatasetRef(f"d{i % producers}", "v1") if with_outputs and i % 10 == 0 else None
        jobs.append(replace(base, job_id=JobId(f"q-{i}"), spec=replace(base.spec, dataset=ref)))
    return jobs


def hold_ms(jobs: list[JobRecord]) -> float:
    nothing: dict[str, object] = {}
    samples = []
    for _ in range(21):
        started = time.perf_counter()
        awaited_inputs(jobs, nothing.get)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


async def registration_per_s(outputs: int, root: Path) -> float:
    store = InMemoryJobStore()
    stores = StoreDirectory(store.kv)
    await stores.put(StoreRecord("lab", LocalStoreConfig(str(root))))
    await store.put_cluster(
        ClusterRecord(ClusterName("lab"), Provider.PRIVATE, "dc1", (), object_store="lab")
    )
    end = time.time()
    base = a_job("prep")
    jobs = []
    for i in range(outputs):
        out = OutputSpec("tokens", "vision/tokens/", f"v{i}")
        job = replace(
            base,
            job_id=JobId(f"prep-{i}"),
            spec=replace(base.spec, outputs=(out,)),
            phase=JobPhase.SUCCEEDED,
            placement=JobPlacement(ClusterName("lab"), GpuType("A100"), CapacityKind.PRIVATE, 1.0),
            events=(PhaseEvent(JobPhase.SUCCEEDED, end, 1),),
        )
        prefix = root / attempt_prefix(out, job.job_id, 1)
        prefix.mkdir(parents=True)
        for k in range(20):
            (prefix / f"part-{k}.bin").write_bytes(bytes([k]) * 4096)
        jobs.append(job)
    registry = DatasetRegistry(store.kv)
    controller = OutputsController(
        Registrar(kv=store.kv, store=store, registry=registry, stores=stores), lambda: jobs
    )
    started = time.perf_counter()
    done = await controller.run_once()
    elapsed = time.perf_counter() - started
    await stores.close()
    assert done == outputs, done
    return outputs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    queued, outputs = (2_000, 20) if args.quick else (20_000, 100)
    with_outputs = hold_ms(_queue(queued, 200, True))
    without = hold_ms(_queue(queued, 200, False))
    with tempfile.TemporaryDirectory(prefix="gpufed-bench-outputs-") as scratch:
        rate = asyncio.run(registration_per_s(outputs, Path(scratch)))
    print(f"outputs_hold_{queued}_jobs_with_producers_ms: {with_outputs:.2f} ms")
    print(f"outputs_hold_{queued}_jobs_without_outputs_ms: {without:.2f} ms")
    print(f"outputs_registered_per_s: {rate:.1f} outputs/s (20 x 4 KiB each, local store)")


if __name__ == "__main__":
    main()
