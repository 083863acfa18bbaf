"""Every key under a prefix, page by page, all read at the revision of the first page.

Why the pages grow: etcd 3.5 answers a range with a limit by walking its key index from the page's
start to the range's end (to count what is left for `more`), then reading the page's values. Paging
N keys in pages of P keys therefore walks about N²/2P index entries. Listing 100,000 jobs (1.2 KB
each) in pages of 1,000 cost etcd 2.3 to 2.7 s of CPU, more than our own decoding of them, and in
pages of 250 9 s; in pages of 3,000 1.2 s (`bench/etcd_paging.py`). So after the first page each
page asks for about `PAGE_TARGET_BYTES` by the mean size of the keys seen so far, within
[`FIRST_PAGE_KEYS`, `MAX_PAGE_KEYS`]. A page whose reply would pass the client's cap (records far
larger than the ones before) is asked for again at half as many keys.

The next page is asked for before the caller handles this one, so etcd reads while we decode.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence

from federation.store.kv import KeyValue, KeyValueStore, RangeResult, ReplyTooLarge, reply_bytes

FIRST_PAGE_KEYS = 1000
MAX_PAGE_KEYS = 50_000
# A reply of this size is cheap for etcd and for us; the client's cap on a reply is eight times it
# (federation.store.kv_etcd), so a page of keys up to eight times the mean seen still fits.
PAGE_TARGET_BYTES = 8 * 1024 * 1024


def next_page_keys(page: Sequence[KeyValue], target_bytes: int = PAGE_TARGET_BYTES) -> int:
    """How many keys the page after `page` asks for: about `target_bytes` at `page`'s mean size."""
    if not page:
        return FIRST_PAGE_KEYS
    mean = max(1, reply_bytes(page) // len(page))
    return max(FIRST_PAGE_KEYS, min(MAX_PAGE_KEYS, target_bytes // mean))


async def pages(
    kv: KeyValueStore, prefix: bytes, *, target_bytes: int = PAGE_TARGET_BYTES
) -> AsyncGenerator[tuple[tuple[KeyValue, ...], int], None]:
    """Yields (page, revision) until every key under `prefix` at the first page's revision is read.

    A compaction past that revision while paging raises `WatchCompacted`: the caller starts over."""
    page = await _read(kv, prefix, FIRST_PAGE_KEYS, None, 0)
    revision = page.revision
    while True:
        following: asyncio.Future[RangeResult] | None = None
        if page.more and page.kvs:
            following = asyncio.ensure_future(
                _read(kv, prefix, next_page_keys(page.kvs, target_bytes), page.kvs[-1].key + b"\0", revision)
            )
        try:
            # Yields to the loop first, so the request for the next page is on its way while the
            # caller handles this one.
            await asyncio.sleep(0)
            yield page.kvs, revision
        except BaseException:
            # The caller stopped early (or failed): the request in flight is not wanted.
            if following is not None:
                following.cancel()
                with contextlib.suppress(BaseException):
                    await following
            raise
        if following is None:
            return
        page = await following


async def _read(
    kv: KeyValueStore, prefix: bytes, limit: int, start: bytes | None, revision: int
) -> RangeResult:
    while True:
        try:
            return await kv.range_prefix(prefix, limit=limit, start=start, revision=revision)
        except ReplyTooLarge:
            if limit <= 1:
                raise
            limit //= 2
