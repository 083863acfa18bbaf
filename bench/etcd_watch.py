"""The etcd watch path's CPU an event: what every job cache pays for every job write (issue 33).

Every process that holds a job cache (the server, each API worker) follows every job write through
etcd's watch, and the lifecycle writes each job about eight times. This starts a real etcd and
measures this process's CPU (`time.process_time`) an event, three ways:

- `watch_raw_us_per_event`: `EtcdKv.watch_prefix` alone, replaying `--jobs` job records written
  before the watch starts (the gRPC stream, the events' hand-over, `KeyValue`s; no decoding);
- `watch_jobs_us_per_event`: `KvStore.watch_jobs` over the same history, each record decoded
  (another process's writes: none of them is this process's own `WrittenRecords`);
- `job_cache_us_per_event`: a `JobCache` following the same number of live writes, made by a writer
  process (its CPU is its own), from the cache's start until it holds every job;
- `job_cache_move_us_per_event`: the same cache following a second write of each of those jobs, in
  another phase (queued to admitted): the lifecycle's most common write (admitted, staging,
  dispatched, running, ended);
- `job_cache_rewrite_us_per_event`: and a third, in the same phase (a message): a write that keeps
  where the job is filed;
- `job_cache_lifecycle_us_per_event`: the three weighted as a job's ~8 writes are, 1 create, 5 phase
  changes and 2 others (derived from the three, not measured on its own).

    python bench/etcd_watch.py            # 20,000 jobs, 5 rounds
    python bench/etcd_watch.py --quick    # 5,000 jobs, 3 rounds
    python bench/etcd_watch.py --apply    # no etcd: `JobCache._apply` alone, decoded events
                                          # handed in (create, phase change, rewrite), with the
                                          # cyclic collector off, and again with the summary built

    python bench/etcd_watch.py --apply --depth 1000000
                                          # and the list index alone with a million queued jobs:
                                          # the oldest 2,000 moved to admitted, then rewritten

`--apply` is the cache's own part of an event, without the watch, the decode and the collector,
which the live figures carry too and which vary more from run to run.

The figures are the median of the rounds. Wall time is not used: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncGenerator
from multiprocessing.synchronize import Event as SyncEvent
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from federation.runtime.etcd_process import EtcdProcess  # noqa: E402
from federation.store.job_cache import JobCache  # noqa: E402
from federation.store.job_cache_index import JobIndex  # noqa: E402
from federation.store.job_store import (  # noqa: E402
    JOBS,
    PREFIX,
    InMemoryJobStore,
    JobEvent,
    JobEventType,
    KvStore,
    Stored,
    _dumps,
    job_key,
)
from federation.store.jobs import job_to_dict  # noqa: E402
from federation.store.kv import Put, Txn  # noqa: E402
from federation.store.kv_etcd import EtcdKv  # noqa: E402
from placement.model import JobPhase  # noqa: E402
from tests.job_builder import build_job  # noqa: E402

# Writes of one request: about what the group commit nests in one under the submission bench's
# load (7.2 at 8 in flight); each request is one revision, so one watch response.
BATCH = 8


def records(
    n: int, tag: str, *, phase: JobPhase | None = None, message: str | None = None
) -> list[tuple[bytes, bytes]]:
    out = []
    for i in range(n):
        job = build_job(f"{tag}-{i:07d}", tenant=f"t{i % 4}")
        if phase is not None:
            job = dataclasses.replace(job, phase=phase)
        if message is not None:
            job = dataclasses.replace(job, message=message)
        out.append((job_key(job.job_id), _dumps(job_to_dict(job))))
    return out


async def write_all(kv: EtcdKv, items: list[tuple[bytes, bytes]]) -> int:
    """Every record written, `BATCH` to a request, 8 requests in flight; the last revision."""
    batches = [items[i : i + BATCH] for i in range(0, len(items), BATCH)]
    last = 0
    sem = asyncio.Semaphore(8)

    async def one(batch: list[tuple[bytes, bytes]]) -> None:
        nonlocal last
        async with sem:
            results = await kv.txn_many([Txn((), (Put(k, v),)) for k, v in batch])
            last = max(last, results[0].revision)

    await asyncio.gather(*(one(b) for b in batches))
    return last


async def replay(endpoint: str, jobs: int, round_: int) -> tuple[float, float]:
    """CPU µs an event of the raw watch and of `watch_jobs`, over `jobs` records written before."""
    kv = await EtcdKv.connect(endpoint)
    try:
        await kv.delete_prefix(PREFIX)
        items = records(jobs, f"h{round_}")
        start = await kv.put(PREFIX + b"mark", b"x")
        await write_all(kv, items)

        async def timed(it: AsyncGenerator[object, None]) -> float:
            began = time.process_time()
            seen = 0
            async with contextlib.aclosing(it):
                async for _ in it:
                    seen += 1
                    if seen == jobs:
                        break
            return 1e6 * (time.process_time() - began) / jobs

        raw = kv.watch_prefix(JOBS, start_revision=start)
        raw_us = await timed(raw)
        store = KvStore(kv)
        decoded = store.watch_jobs(start_revision=start)
        decoded_us = await timed(decoded)
        return raw_us, decoded_us
    finally:
        await kv.delete_prefix(PREFIX)
        await kv.close()


def _writer(
    endpoint: str, parts: list[list[tuple[bytes, bytes]]], gos: list[SyncEvent], done: mp.Queue[int]
) -> None:
    """Each part written when its `go` is set; the last revision of each put on `done`."""

    async def run() -> None:
        kv = await EtcdKv.connect(endpoint)
        try:
            for items, go in zip(parts, gos, strict=True):
                go.wait()
                done.put(await write_all(kv, items))
        finally:
            await kv.close()

    asyncio.run(run())


async def live(endpoint: str, jobs: int, round_: int) -> tuple[float, float, float]:
    """CPU µs an event of a `JobCache` following `jobs` writes made by another process: creates,
    then each job moved to another phase, then each rewritten in that phase."""
    kv = await EtcdKv.connect(endpoint)
    try:
        await kv.delete_prefix(PREFIX)
        cache = JobCache(KvStore(kv))
        await cache.start()
        ctx = mp.get_context("spawn")
        tag = f"l{round_}"
        parts = [
            records(jobs, tag),
            records(jobs, tag, phase=JobPhase.ADMITTED),
            records(jobs, tag, phase=JobPhase.ADMITTED, message="staged"),
        ]
        gos = [ctx.Event() for _ in parts]
        done: mp.Queue[int] = ctx.Queue()
        writer = ctx.Process(target=_writer, args=(endpoint, parts, gos, done))
        writer.start()
        used: list[float] = []
        try:
            await asyncio.sleep(0.5)  # the writer's start-up is not ours
            for go in gos:
                began = time.process_time()
                go.set()
                # Looked at every 20 ms rather than woken at each revision: the bench's own
                # wake-ups would be counted as the cache's.
                last = None
                while last is None or cache.revision < last:
                    await asyncio.sleep(0.02)
                    if last is None and not done.empty():
                        last = done.get()
                    if not writer.is_alive() and writer.exitcode != 0:
                        raise RuntimeError(f"the writer failed (exit code {writer.exitcode})")
                used.append(time.process_time() - began)
            if cache.count() != jobs or cache.count_in(None, JobPhase.ADMITTED) != jobs:
                raise RuntimeError("the cache does not hold every job as last written")
        finally:
            writer.join(60)
            await cache.stop()
        created, moved, rewritten = (1e6 * u / jobs for u in used)
        return created, moved, rewritten
    finally:
        await kv.delete_prefix(PREFIX)
        await kv.close()


def apply_only(jobs: int, rounds: int) -> None:
    """CPU µs of `JobCache._apply` an event: creates, phase changes, same-phase rewrites."""
    made = [build_job(f"a-{i:07d}", tenant=f"t{i % 4}") for i in range(jobs)]
    moved = [dataclasses.replace(j, phase=JobPhase.ADMITTED) for j in made]
    rewritten = [dataclasses.replace(j, message="staged") for j in moved]

    async def one(summary: bool) -> list[float]:
        cache = JobCache(InMemoryJobStore())  # never started: events are handed in
        if summary:
            cache.summary()  # built (empty), as once SummarizeJobs has been asked
        revision, used = 0, []
        for batch in (made, moved, rewritten):
            events = []
            for job in batch:
                revision += 1
                events.append(JobEvent(JobEventType.PUT, job.job_id, job, revision))
            began = time.process_time()
            for ev in events:
                cache._apply(ev)
            used.append(1e6 * (time.process_time() - began) / jobs)
        return used

    for summary in (False, True):
        runs = []
        for _ in range(rounds):
            gc.collect()
            gc.disable()
            try:
                runs.append(asyncio.run(one(summary)))
            finally:
                gc.enable()
        name = "apply_summary" if summary else "apply"
        for i, kind in enumerate(("create", "move", "rewrite")):
            print(f"{name}_{kind}_us_per_event: {statistics.median(r[i] for r in runs):.2f} us")


class _Head:
    """What the index reads of a record, without building a million `JobRecord`s."""

    __slots__ = ("job_id", "phase", "submitted_at_s", "tenant")

    def __init__(self, i: int, phase: JobPhase) -> None:
        self.job_id = f"d{i:08d}"
        self.tenant = "alice" if i % 10 == 0 else "bob"
        self.phase = phase
        self.submitted_at_s = float(i)


def index_at_depth(depth: int, moves: int = 2_000) -> None:
    """CPU µs of `JobIndex.put` with `depth` queued jobs: the oldest leaving the queue (as a cycle's
    admissions do, from the front of every view), then each written again in its new phase."""
    index = JobIndex()
    index.rebuild(Stored[Any](_Head(i, JobPhase.QUEUED), 1) for i in range(depth))
    gc.collect()
    gc.disable()
    try:
        for phase_revision, name in ((2, "move"), (3, "rewrite")):
            batch = [Stored[Any](_Head(i, JobPhase.ADMITTED), phase_revision) for i in range(moves)]
            began = time.process_time()
            for stored in batch:
                index.put(stored)
            used = 1e6 * (time.process_time() - began) / moves
            print(f"index_depth_{name}_us_per_event: {used:.2f} us")
    finally:
        gc.enable()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="5,000 jobs, 3 rounds")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--apply", action="store_true", help="the cache's apply alone, no etcd")
    parser.add_argument("--depth", type=int, default=0, help="with --apply: the index at this depth")
    args = parser.parse_args()
    jobs = args.jobs or (5_000 if args.quick else 20_000)
    rounds = args.rounds or (3 if args.quick else 5)
    if args.apply:
        if args.depth:
            print(f"index depth: {args.depth} queued jobs")
            index_at_depth(args.depth)
        apply_only(jobs, rounds)
        return 0
    raw, decoded, cached, moved, rewritten = [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="etcd-watch-bench-") as tmp:
        etcd = EtcdProcess(Path(tmp) / "etcd", compaction_retention=None)
        etcd.start()
        try:
            for r in range(rounds):
                raw_us, decoded_us = asyncio.run(replay(etcd.endpoint, jobs, r))
                cached_us, moved_us, rewritten_us = asyncio.run(live(etcd.endpoint, jobs, r))
                print(
                    f"round {r}: raw {raw_us:.1f} µs, watch_jobs {decoded_us:.1f} µs, "
                    f"job cache {cached_us:.1f} µs a create, {moved_us:.1f} µs a phase change, "
                    f"{rewritten_us:.1f} µs another write",
                    flush=True,
                )
                raw.append(raw_us)
                decoded.append(decoded_us)
                cached.append(cached_us)
                moved.append(moved_us)
                rewritten.append(rewritten_us)
        finally:
            etcd.stop()
    print(f"jobs a round: {jobs}, rounds: {rounds}")
    print(f"watch_raw_us_per_event: {statistics.median(raw):.1f} us")
    print(f"watch_jobs_us_per_event: {statistics.median(decoded):.1f} us")
    created_us, moved_us, rewritten_us = (statistics.median(x) for x in (cached, moved, rewritten))
    lifecycle_us = (created_us + 5 * moved_us + 2 * rewritten_us) / 8
    print(f"job_cache_us_per_event: {created_us:.1f} us")
    print(f"job_cache_events_per_cpu_s: {1e6 / created_us:.0f} events/s")
    print(f"job_cache_move_us_per_event: {moved_us:.1f} us")
    print(f"job_cache_rewrite_us_per_event: {rewritten_us:.1f} us")
    print(f"job_cache_lifecycle_us_per_event: {lifecycle_us:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
