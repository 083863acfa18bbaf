"""One bound on bytes in flight (issue 36): whole objects and multipart parts share `max_buffered_bytes`.

Before, parts and whole objects each had a budget of that size, so a sync copying both at once could
hold twice the bound. The stores here count every body fetched and not yet written (what the copier
holds); uploads yield to the loop many times, so the copier's other workers take all the budget lets
them take."""

from __future__ import annotations

import asyncio
import os

from datasync.errors import AccessDenied, SyncFailed
from datasync.manifest import build_manifest
from datasync.marker import MARKER_NAME
from datasync.plan import plan_sync
from datasync.store import Blob, PartInfo
from datasync.store_memory import MemoryStore
from datasync.sync import run_sync
from datasync.throttle import ByteBudget, RetryPolicy
from datasync.transfer import SyncOptions

KIB = 1024
FAST_RETRY = RetryPolicy(max_attempts=2, initial_backoff_s=0.001, max_backoff_s=0.002)


class Held:
    """Bytes read from the source and not yet written to the target (a part or a whole object)."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def add(self, n: int) -> None:
        self.now += n
        self.peak = max(self.peak, self.now)


def counted(source: MemoryStore, target: MemoryStore, held: Held, *, fail_part: int | None = None) -> None:
    original_get, original_put, original_part = source.get, target.put, target.put_part

    async def get(path: str, *, start: int | None = None, end: int | None = None) -> bytes:
        data = await original_get(path, start=start, end=end)
        held.add(len(data))
        return data

    async def slow(data: Blob) -> None:
        for _ in range(50):  # every other worker runs meanwhile and asks for more
            await asyncio.sleep(0)
        held.add(-len(data))

    async def put(path: str, data: Blob) -> str | None:
        if path.endswith(MARKER_NAME):
            return await original_put(path, data)
        await slow(data)
        return await original_put(path, data)

    async def put_part(path: str, upload_id: str, part_number: int, data: Blob) -> PartInfo:
        try:
            await slow(data)
        except BaseException:
            held.add(-len(data))
            raise
        if part_number == fail_part:
            raise AccessDenied("part refused")
        return await original_part(path, upload_id, part_number, data)

    source.get = get  # type: ignore[method-assign]
    target.put = put  # type: ignore[method-assign]
    target.put_part = put_part  # type: ignore[method-assign]


def mixed_source() -> MemoryStore:
    source = MemoryStore("src")
    for i in range(8):
        source.write(f"v1/whole/{i}.bin", os.urandom(48 * KIB))  # one GET and PUT each
    for i in range(3):
        source.write(f"v1/parts/{i}.bin", os.urandom(256 * KIB + 5))  # multipart, 32 KiB parts
    return source


OPTIONS = SyncOptions(
    multipart_threshold_bytes=64 * KIB,
    part_size_bytes=32 * KIB,
    max_buffered_bytes=128 * KIB,
    concurrency=8,
    retry=FAST_RETRY,
)


async def test_whole_objects_and_parts_together_never_hold_more_than_the_bound() -> None:
    source, target = mixed_source(), MemoryStore("dst", endpoint="other")
    manifest = await build_manifest(source, "v1/")
    held = Held()
    counted(source, target, held)
    plan = await plan_sync(source, "v1/", target, "cache/", manifest)
    report = await run_sync(plan, source, target, options=OPTIONS)
    assert report.objects_copied == 11
    assert report.failures == ()
    # The budget is used (more than one whole object and a part at once) and never exceeded: with a
    # budget for parts and another for whole objects this reached 240 KiB.
    assert 96 * KIB < held.peak <= OPTIONS.max_buffered_bytes, held.peak
    copied = {p: d for p, (d, _, _) in target.objects.items() if ".gpufed/" not in p}
    assert copied == {"cache/" + p[3:]: d for p, (d, _, _) in source.objects.items() if p.startswith("v1/")}


async def test_a_failed_multipart_upload_gives_back_all_it_held() -> None:
    # Part 3 of every large object is refused (permanent): the object's other parts, fetched or queued,
    # are cancelled. Whatever they held must come back, or the objects after it would wait forever
    # for a budget that leaked (a task cancelled before it started never ran its `finally`).
    source, target = mixed_source(), MemoryStore("dst", endpoint="other")
    manifest = await build_manifest(source, "v1/")
    held = Held()
    counted(source, target, held, fail_part=3)
    plan = await plan_sync(source, "v1/", target, "cache/", manifest)
    options = SyncOptions(
        multipart_threshold_bytes=64 * KIB,
        part_size_bytes=32 * KIB,
        max_buffered_bytes=64 * KIB,  # two parts: a leak of one would halve it
        concurrency=4,
        retry=FAST_RETRY,
    )

    try:
        await asyncio.wait_for(run_sync(plan, source, target, options=options), timeout=60)
    except SyncFailed as e:
        failed = {path for path, _ in e.failures}
    else:
        raise AssertionError("the refused parts should fail their objects")
    assert failed == {f"parts/{i}.bin" for i in range(3)}
    whole = {p for p in target.objects if p.startswith("cache/whole/")}
    assert len(whole) == 8  # the whole objects after the failures still found room
    assert held.peak <= 64 * KIB


async def test_read_ahead_takes_only_what_is_free_and_never_jumps_the_queue() -> None:
    budget = ByteBudget(100)
    first = budget.try_acquire(60)
    assert first == 60
    assert budget.try_acquire(50) is None  # does not fit
    waiting = asyncio.create_task(budget.acquire(30))
    await asyncio.sleep(0)
    assert waiting.done()  # fits beside the 60
    assert budget.try_acquire(10) == 10
    big = asyncio.create_task(budget.acquire(80))
    await asyncio.sleep(0)
    assert budget.try_acquire(1) is None  # someone waits: read-ahead does not overtake
    budget.release(first)
    budget.release(await waiting)
    budget.release(10)
    assert await big == 80
    assert budget.peak_bytes == 100
