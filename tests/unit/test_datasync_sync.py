"""The sync engine on the in-memory and local-directory stores: copies, no-ops, changes, deletes,
retries, resumed multipart uploads, server-side copies, progress, egress estimates and verification."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from datasync import transfer
from datasync.errors import AccessDenied, SyncFailed
from datasync.journal import Journal, MemoryJournal
from datasync.manifest import build_manifest
from datasync.marker import MARKER_NAME
from datasync.model import Manifest
from datasync.plan import plan_sync
from datasync.progress import SyncProgress
from datasync.store import Blob, ObjectStore, PartInfo, list_all
from datasync.store_local import LocalStore
from datasync.store_memory import MemoryStore
from datasync.sync import SyncReport, run_sync, sync_version
from datasync.throttle import ByteBudget, RetryPolicy, TokenBucket
from datasync.transfer import SyncOptions, folder_marker_phases
from datasync.verify import verify

KIB = 1024
FAST_RETRY = RetryPolicy(max_attempts=4, initial_backoff_s=0.001, max_backoff_s=0.002)
SMALL_PARTS = SyncOptions(
    multipart_threshold_bytes=64 * KIB, part_size_bytes=16 * KIB, retry=FAST_RETRY, concurrency=4
)


def fill(store: MemoryStore, prefix: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        store.write(prefix + name, data)


def some_files(n_small: int = 5, n_big: int = 1) -> dict[str, bytes]:
    files = {f"small/{i}.bin": os.urandom(1000 + i) for i in range(n_small)}
    files.update({f"big/{i}.bin": os.urandom(100 * KIB + 7) for i in range(n_big)})
    return files


async def synced(
    source: ObjectStore,
    target: ObjectStore,
    manifest: Manifest,
    *,
    journal: Journal | None = None,
    recorded_etags: Mapping[str, str] | None = None,
    options: SyncOptions = SMALL_PARTS,
) -> SyncReport:
    plan = await plan_sync(
        source, "v1/", target, "cache/", manifest, journal=journal, recorded_etags=recorded_etags
    )
    return await run_sync(plan, source, target, options=options, journal=journal)


async def contents(store: MemoryStore, prefix: str) -> dict[str, bytes]:
    return {
        p[len(prefix) :]: d
        for p, (d, _, _) in store.objects.items()
        if p.startswith(prefix) and ".gpufed/" not in p
    }


async def test_build_manifest_hashes_every_object_relative_to_the_prefix() -> None:
    source = MemoryStore("src")
    files = some_files()
    fill(source, "v1/", files)
    source.write("other/x", b"not in the version")
    manifest = await build_manifest(source, "v1", chunk_bytes=10 * KIB)
    assert {e.path: e.sha256 for e in manifest.entries} == {
        p: hashlib.sha256(d).hexdigest() for p, d in files.items()
    }
    assert manifest.total_size_bytes == sum(len(d) for d in files.values())


async def test_first_sync_copies_everything_verified_and_a_resync_moves_nothing() -> None:
    source, target = MemoryStore("src"), MemoryStore("dst", endpoint="other")
    files = some_files()
    fill(source, "v1/", files)
    manifest = await build_manifest(source, "v1/")
    report = await synced(source, target, manifest)
    assert await contents(target, "cache/") == files
    assert report.objects_copied == len(files)
    assert report.parts_uploaded == 7
    assert "cache/" + MARKER_NAME in target.objects

    target.requests.clear()
    again = await synced(source, target, manifest, recorded_etags=report.verified_etags)
    assert again.objects_copied == 0
    assert again.objects_up_to_date == len(files)
    # The whole no-op, given the record of the verified copy: the plan's listing and the closing one
    # that confirms the copy (and finds strays, issue 30); nothing read or written.
    assert dict(target.requests) == {"list": 2}

    # Without a record, the marker is only a hint: what it vouches for is re-read at the target (no
    # egress) before it counts; still nothing is written.
    target.requests.clear()
    hinted = await synced(source, target, manifest)
    assert hinted.objects_copied == 0
    assert dict(target.requests) == {"list": 2, "get": 1 + len(files)}


async def test_changed_and_deleted_objects_are_the_only_ones_that_move() -> None:
    source, target = MemoryStore("src"), MemoryStore("dst", endpoint="other")
    files = some_files()
    fill(source, "v1/", files)
    await synced(source, target, await build_manifest(source, "v1/"))
    target.write("cache/not-ours.txt", b"someone else's")

    source.write("v1/small/0.bin", b"changed")
    del source.objects["v1/small/1.bin"]
    source.write("v1/new.bin", b"new")
    target.requests.clear()
    report = await synced(source, target, await build_manifest(source, "v1/"))
    assert report.objects_copied == 2
    assert report.objects_deleted == 1
    assert target.requests["put"] == 3  # two objects and the marker
    got = await contents(target, "cache/")
    assert got["small/0.bin"] == b"changed"
    assert got["new.bin"] == b"new"
    assert "small/1.bin" not in got
    assert got["not-ours.txt"] == b"someone else's"  # never written by a sync, so never deleted


async def test_transient_failures_are_retried_and_permanent_ones_fail_the_sync_with_reasons() -> None:
    source, target = MemoryStore("src"), MemoryStore("dst", endpoint="other")
    fill(source, "v1/", some_files(n_small=3, n_big=1))
    manifest = await build_manifest(source, "v1/")
    target.fail("put", times=2)
    target.fail("put_part", times=1)
    report = await synced(source, target, manifest)
    assert report.retries == 3
    assert report.objects_copied == 4

    other = MemoryStore("dst2", endpoint="x")
    other.fail("put", times=1, error=AccessDenied("forbidden"))
    with pytest.raises(SyncFailed) as failed:
        await synced(source, other, manifest)
    assert not failed.value.retryable
    assert "forbidden" in str(failed.value)
    assert len(failed.value.failures) == 1
    # What did succeed is in the marker: the next run copies only the failed object.
    plan = await plan_sync(source, "v1/", other, "cache/", manifest)
    assert len(plan.to_copy) == 1


async def test_a_source_that_no_longer_matches_the_manifest_is_not_copied() -> None:
    source, target = MemoryStore("src"), MemoryStore("dst", endpoint="other")
    fill(source, "v1/", {"a": b"aaa"})
    manifest = await build_manifest(source, "v1/")
    source.write("v1/a", b"bbb")
    with pytest.raises(SyncFailed) as failed:
        await synced(source, target, manifest)
    assert "differs from the manifest" in str(failed.value)
    assert not failed.value.retryable
    assert "cache/a" not in target.objects


async def test_an_interrupted_multipart_upload_resumes_without_resending_finished_parts() -> None:
    source, target = MemoryStore("src"), MemoryStore("dst", endpoint="other")
    fill(source, "v1/", {"big.bin": os.urandom(160 * KIB), "small.bin": b"s"})
    manifest = await build_manifest(source, "v1/")
    journal = MemoryJournal()
    # Let the first parts through, then fail the rest permanently: a run that dies half way.
    original = target.put_part
    sent = 0

    async def dying_put_part(path: str, upload_id: str, part_number: int, data: Blob) -> PartInfo:
        nonlocal sent
        sent += 1
        if sent > 4:
            raise AccessDenied("process died")
        return await original(path, upload_id, part_number, data)

    # mypy refuses any assignment to a method (method-assign); it still checks the stand-in's signature.
    target.put_part = dying_put_part  # type: ignore[method-assign]
    with pytest.raises(SyncFailed):
        await synced(
            source,
            target,
            manifest,
            journal=journal,
            options=SyncOptions(
                multipart_threshold_bytes=64 * KIB,
                part_size_bytes=16 * KIB,
                retry=FAST_RETRY,
                concurrency=1,
                max_buffered_bytes=16 * KIB,
            ),
        )
    target.put_part = original  # type: ignore[method-assign]
    before = target.bytes_written
    report = await synced(source, target, manifest, journal=journal)
    assert report.parts_reused == 4
    assert report.parts_uploaded == 6
    assert target.bytes_written - before < 160 * KIB  # the finished parts were not sent again
    assert (await contents(target, "cache/"))["big.bin"] == source.objects["v1/big.bin"][0]
    assert journal.records == []  # cleared once the marker was written


async def test_same_endpoint_uses_server_side_copy_and_costs_no_egress() -> None:
    source, target = MemoryStore("src", endpoint="same"), MemoryStore("dst", endpoint="same")
    fill(source, "v1/", some_files())
    manifest = await build_manifest(source, "v1/")
    plan = await plan_sync(source, "v1/", target, "cache/", manifest)
    assert plan.server_side
    assert plan.egress(0.09).usd == 0.0
    report = await run_sync(plan, source, target, options=SMALL_PARTS)
    assert report.server_side_copies == 6
    assert report.bytes_uploaded == 0


async def test_egress_estimate_and_budget_refusal_come_before_any_copy() -> None:
    source, target = MemoryStore("src"), MemoryStore("dst", endpoint="other")
    fill(source, "v1/", {"a": b"x" * 1000})
    manifest = await build_manifest(source, "v1/")
    plan = await plan_sync(source, "v1/", target, "cache/", manifest)
    assert plan.egress(usd_per_gb=90.0).usd == pytest.approx(1000 / 1e9 * 90.0)
    with pytest.raises(SyncFailed, match="would cost"):
        await sync_version(source, "v1/", target, "cache/", manifest, usd_per_gb=1e6, max_usd=0.5)
    assert target.requests["put"] == 0


async def test_progress_reaches_the_totals_and_counts_up_to_date_objects_as_done() -> None:
    source, target = MemoryStore("src"), MemoryStore("dst", endpoint="other")
    fill(source, "v1/", some_files())
    manifest = await build_manifest(source, "v1/")
    await synced(source, target, manifest)
    source.write("v1/extra", b"12345")
    manifest = await build_manifest(source, "v1/")
    seen: list[SyncProgress] = []
    plan = await plan_sync(source, "v1/", target, "cache/", manifest)
    await run_sync(plan, source, target, progress=seen.append, options=SyncOptions(progress_interval_s=0.001))
    last = seen[-1]
    assert last.finished
    assert last.bytes_done == last.bytes_total == manifest.total_size_bytes
    assert last.objects_done == last.objects_total == 7
    assert last.eta_s == 0.0


class WaitClock:
    """A clock that moves only when the code under test waits on it: `sleep(s)` moves it `s`
    forward and returns at once. What a token bucket then asks for depends on the bytes alone, not
    on how fast the machine copies between two asks."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s

    async def sleep(self, seconds: float) -> None:
        self.now_s += seconds
        await asyncio.sleep(0)  # still a point where the other workers run, as a real wait is


async def test_bandwidth_cap_paces_every_byte_through_the_token_bucket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The copier's bucket, real in all but its clock (the copier takes none to pass on).
    clock = WaitClock()

    def bucket_on_the_wait_clock(rate_bytes_per_s: float, burst_bytes: float | None = None) -> TokenBucket:
        return TokenBucket(rate_bytes_per_s, burst_bytes, clock=clock, sleep=clock.sleep)

    monkeypatch.setattr(transfer, "TokenBucket", bucket_on_the_wait_clock)
    waits: list[tuple[int, float]] = []
    reserve = TokenBucket.reserve

    def recording(self: TokenBucket, size_bytes: int, now: float) -> float:
        wait = reserve(self, size_bytes, now)
        waits.append((size_bytes, wait))
        return wait

    monkeypatch.setattr(TokenBucket, "reserve", recording)
    source, target = MemoryStore("src"), MemoryStore("dst", endpoint="other")
    fill(source, "v1/", {f"{i}": b"x" * 100_000 for i in range(4)})
    manifest = await build_manifest(source, "v1/")
    plan = await plan_sync(source, "v1/", target, "cache/", manifest)
    await run_sync(plan, source, target, options=SyncOptions(bandwidth_bytes_per_s=1_000_000))
    assert sum(n for n, _ in waits) == 400_000
    # A 250 kB burst, then the rest at 1 MB/s: the bucket asked for 0.15 s of waiting in all...
    assert sum(w for _, w in waits) == pytest.approx(0.15, abs=0.05)
    assert sum(w for _, w in waits) == pytest.approx(0.15)
    # ...and the copy took that long on its clock: no byte went out early, none waited longer.
    assert clock.now_s == pytest.approx(0.15)


async def test_verify_finds_corruption_and_the_next_sync_repairs_it() -> None:
    source, target = MemoryStore("src"), MemoryStore("dst", endpoint="other")
    fill(source, "v1/", some_files())
    manifest = await build_manifest(source, "v1/")
    await synced(source, target, manifest)
    assert (await verify(target, "cache/", manifest)).ok
    # Bit rot: the bytes change but the ETag and size stay, so only reading finds it.
    data, etag, t = target.objects["cache/small/2.bin"]
    # Every bit of the first byte flipped: writing b"X" there left one random file in 256 as it was.
    target.objects["cache/small/2.bin"] = (bytes([data[0] ^ 0xFF]) + data[1:], etag, t)
    del target.objects["cache/small/3.bin"]
    report = await verify(target, "cache/", manifest)
    assert report.wrong_hash == ("small/2.bin",)
    assert report.missing == ("small/3.bin",)
    again = await synced(source, target, manifest)
    assert again.objects_copied == 2
    assert (await verify(target, "cache/", manifest)).ok


async def test_local_directory_store_round_trip(tmp_path: Path) -> None:
    source = LocalStore("src", tmp_path / "src")
    target = LocalStore("dst", tmp_path / "dst")
    files = some_files()
    for name, data in files.items():
        await source.put("v1/" + name, data)
    manifest = await build_manifest(source, "v1/")
    options = SyncOptions(multipart_threshold_bytes=64 * KIB, part_size_bytes=16 * KIB)
    # Two local directories are one "endpoint" for copying (a file copy), so force the streaming path
    # through a memory source as well.
    plan = await plan_sync(source, "v1/", target, "cache/", manifest)
    report = await run_sync(plan, source, target, options=options)
    assert report.objects_copied == len(files)
    memory = MemoryStore("mem")
    fill(memory, "v1/", files)
    plan = await plan_sync(memory, "v1/", target, "cache2/", manifest)
    report = await run_sync(plan, memory, target, options=options)
    assert report.parts_uploaded == 7
    for prefix in ("cache/", "cache2/"):
        assert (await verify(target, prefix, manifest)).ok
    assert not (await plan_sync(memory, "v1/", target, "cache2/", manifest)).to_copy
    listed = [m.path for m in await list_all(target, "cache2/")]
    assert "cache2/" + MARKER_NAME in listed
    assert not any(".multipart" in p for p in listed)


async def test_whole_objects_in_flight_are_held_to_max_buffered_bytes() -> None:
    # Objects under the multipart threshold are read whole and held until their PUT is done. With
    # eight workers and 48 KiB objects, eight at once would hold 384 KiB; the budget is 128 KiB.
    source, target = MemoryStore("src"), MemoryStore("dst", endpoint="other")
    fill(source, "v1/", {f"{i}.bin": os.urandom(48 * KIB) for i in range(24)})
    manifest = await build_manifest(source, "v1/")
    held, peak = 0, 0
    original_get, original_put = source.get, target.put
    two_held = asyncio.Event()

    async def counting_get(path: str, **kw: int | None) -> bytes:
        nonlocal held, peak
        data = await original_get(path, **kw)
        held += len(data)
        peak = max(peak, held)
        if held >= 2 * 48 * KIB:
            two_held.set()
        return data

    async def slow_put(path: str, data: Blob) -> str | None:
        nonlocal held
        # No object is let go before two are held at once (all the budget allows): the copier must
        # fill it. Bounded, so that a copier that holds only one fails the peak assert below.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(two_held.wait(), timeout=10)
        await asyncio.sleep(0)  # and the other workers run meanwhile, to ask for a third
        etag = await original_put(path, data)
        if not path.endswith(MARKER_NAME):
            held -= len(data)
        return etag

    # mypy refuses any assignment to a method (method-assign); it still checks the stand-in's signature.
    source.get = counting_get  # type: ignore[method-assign]
    target.put = slow_put  # type: ignore[method-assign]
    options = SyncOptions(
        multipart_threshold_bytes=256 * KIB,
        part_size_bytes=64 * KIB,
        max_buffered_bytes=128 * KIB,
        concurrency=8,
        retry=FAST_RETRY,
    )
    report = await synced(source, target, manifest, options=options)
    assert report.objects_copied == 24
    assert 96 * KIB <= peak <= 128 * KIB, peak  # two at a time: the budget is used, and never exceeded
    assert await contents(target, "cache/") == await contents(source, "v1/")


async def test_byte_budget_serves_in_order_lets_an_oversized_request_run_alone_and_survives_cancellation() -> (
    None
):
    budget = ByteBudget(100)
    first = await budget.acquire(60)
    big = asyncio.create_task(budget.acquire(500))  # over the capacity: waits for all of it
    small = asyncio.create_task(budget.acquire(10))  # fits now, but comes after the big one
    await asyncio.sleep(0)
    assert not big.done()
    assert not small.done()
    budget.release(first)
    assert await big == 100
    assert budget.held_bytes == 100
    await asyncio.sleep(0)
    assert not small.done()
    budget.release(100)
    assert await small == 10
    waiting = asyncio.create_task(budget.acquire(95))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await budget.acquire(90) == 90  # the cancelled waiter left nothing held or queued
    assert budget.held_bytes == 100


def test_folder_markers_come_first_by_depth_then_everything_else() -> None:
    paths = ["a/b/c.txt", "a/b/", "z.bin", "a/", "b/", "a/b/d/", "a/x.txt"]
    phases = folder_marker_phases(paths, lambda p: p)
    assert phases == [["a/", "b/"], ["a/b/"], ["a/b/d/"], ["a/b/c.txt", "z.bin", "a/x.txt"]]
    assert folder_marker_phases(["x", "y"], lambda p: p) == [["x", "y"]]
    assert folder_marker_phases([], lambda p: p) == []


async def test_no_object_is_written_before_or_beside_the_folder_markers_above_it() -> None:
    # SeaweedFS can drop a folder marker from its listings when a child under it is written at the same
    # time (folder_marker_phases). Every object here is empty, so the plan puts each marker next to its
    # children and eight workers would write them together; the copier must finish the markers first.
    source, target = MemoryStore("src"), MemoryStore("dst", endpoint="other")
    files: dict[str, bytes] = {}
    for i in range(6):
        files |= {f"d{i}/": b"", f"d{i}/sub/": b"", f"d{i}/sub/f": b"", f"d{i}/g": b""}
    fill(source, "v1/", files)
    manifest = await build_manifest(source, "v1/")
    finished: set[str] = set()
    early: list[tuple[str, str]] = []
    original_put = target.put

    async def watched_put(path: str, data: Blob) -> str | None:
        key = path.removeprefix("cache/")
        early.extend(
            (key, m)
            for m in files
            if m.endswith("/") and key.startswith(m) and key != m and m not in finished
        )
        # Long enough for the other workers to start theirs. What must not happen (a child written
        # beside its marker) has no signal to wait for, so this stays a short bounded wait; it
        # only gives a broken copier the chance to show itself, a correct one passes at any length.
        await asyncio.sleep(0.002)
        etag = await original_put(path, data)
        finished.add(key)
        return etag

    # mypy refuses any assignment to a method (method-assign); it still checks the stand-in's signature.
    target.put = watched_put  # type: ignore[method-assign]
    report = await synced(source, target, manifest, options=replace(SMALL_PARTS, concurrency=8))
    assert report.objects_copied == len(files)
    assert early == []
    assert await contents(target, "cache/") == await contents(source, "v1/")
