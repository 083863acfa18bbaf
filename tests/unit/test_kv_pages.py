"""Listing a prefix page by page (federation.store.kv_pages): one revision, pages that grow by
size (etcd 3.5 walks its index to the range's end for every page), and a page too large for the
client's reply cap asked for again smaller."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from federation.store.kv import KeyValue, RangeResult, ReplyTooLarge
from federation.store.kv_memory import MemoryKv
from federation.store.kv_pages import FIRST_PAGE_KEYS, MAX_PAGE_KEYS, next_page_keys, pages

P = b"/t/"


class CountingKv(MemoryKv):
    """MemoryKv that records the limit of every range it answers."""

    def __init__(self, **kwargs: int | None) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.limits: list[int] = []

    async def range_prefix(
        self, prefix: bytes, *, limit: int = 0, start: bytes | None = None, revision: int = 0
    ) -> RangeResult:
        self.limits.append(limit)
        return await super().range_prefix(prefix, limit=limit, start=start, revision=revision)


async def _fill(kv: MemoryKv, count: int, value_bytes: int, prefix: bytes = P) -> None:
    for i in range(count):
        await kv.put(prefix + f"{i:07d}".encode(), b"v" * value_bytes)


async def _all(kv: MemoryKv, prefix: bytes = P, **kwargs: int) -> tuple[list[KeyValue], int]:
    out: list[KeyValue] = []
    revision = 0
    async with contextlib.aclosing(pages(kv, prefix, **kwargs)) as listing:
        async for page, read_at in listing:
            out.extend(page)
            revision = read_at
    return out, revision


async def test_pages_grow_to_the_target_size_so_a_large_prefix_takes_few_requests() -> None:
    kv = CountingKv()
    await _fill(kv, 20_000, 1000)
    got, _ = await _all(kv, target_bytes=8_000_000)
    assert [kv.key for kv in got] == [P + f"{i:07d}".encode() for i in range(20_000)]
    # The first page is FIRST_PAGE_KEYS; the next ask for about 8 MB / 1010 bytes = 7,920 keys. In
    # pages of a thousand it would be 20 requests, each walking etcd's index to the prefix's end.
    assert kv.limits[0] == FIRST_PAGE_KEYS
    assert kv.limits[1] == 8_000_000 // 1010
    assert len(kv.limits) == 4


def test_the_next_page_is_sized_by_the_mean_of_the_last_within_bounds() -> None:
    small = [KeyValue(b"k", b"", 1, 1, 1, 0)] * 10
    assert next_page_keys(small, 8_000_000) == MAX_PAGE_KEYS
    huge = [KeyValue(b"k", b"x" * 1_000_000, 1, 1, 1, 0)] * 2
    assert next_page_keys(huge, 8_000_000) == FIRST_PAGE_KEYS
    assert next_page_keys([], 8_000_000) == FIRST_PAGE_KEYS


async def test_every_page_reads_the_first_pages_revision() -> None:
    kv = MemoryKv()
    await _fill(kv, FIRST_PAGE_KEYS + 10, 10)
    out: list[bytes] = []
    revisions = set()
    async with contextlib.aclosing(pages(kv, P)) as listing:
        async for page, revision in listing:
            revisions.add(revision)
            if not out:
                # Written after the first page: neither the new key nor the deletion shows.
                await kv.put(P + b"9999999", b"late")
                await kv.delete(P + f"{FIRST_PAGE_KEYS + 5:07d}".encode())
            out.extend(kv.key for kv in page)
    assert len(revisions) == 1
    assert out == [P + f"{i:07d}".encode() for i in range(FIRST_PAGE_KEYS + 10)]


async def test_a_page_too_large_for_the_reply_cap_is_asked_for_again_smaller() -> None:
    # Small keys first (so the next page asks for many), then keys a hundred times larger: the
    # second page would pass the cap and is read in halves until it fits.
    kv = CountingKv(max_reply_bytes=200_000)
    await _fill(kv, FIRST_PAGE_KEYS, 10)
    await _fill(kv, 300, 1000, prefix=P + b"z")
    got, _ = await _all(kv, target_bytes=100_000)
    assert len(got) == FIRST_PAGE_KEYS + 300
    assert len(set(got)) == len(got)
    # 100,000 / 20 bytes = 5,000 keys asked; halved until the page fits 200,000 bytes.
    assert kv.limits[1] == 5_000
    assert any(b < a for a, b in zip(kv.limits[1:], kv.limits[2:], strict=False))


async def test_a_single_key_larger_than_the_cap_fails_rather_than_looping() -> None:
    kv = MemoryKv(max_reply_bytes=1_000)
    await kv.put(P + b"big", b"x" * 5_000)
    with pytest.raises(ReplyTooLarge):
        await _all(kv)


async def test_stopping_early_cancels_the_page_in_flight() -> None:
    kv = MemoryKv()
    await _fill(kv, FIRST_PAGE_KEYS * 3, 10)
    before = set(asyncio.all_tasks())
    async with contextlib.aclosing(pages(kv, P)) as listing:
        async for _page, _revision in listing:
            break
    await asyncio.sleep(0)
    assert set(asyncio.all_tasks()) == before
