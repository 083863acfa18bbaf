"""A watch is never paired with another watch's "created" answer, on real etcd.

aetcd keeps one create pending per stream and takes the next "created" answer as its own. When a
create times out (a loaded etcd), its answer still comes, and the next create on the stream takes it:
that watch then follows the other prefix. The job cache once followed the ledger's prefix that way
and saw no job for 13 minutes (issue 33). Here the earlier, abandoned create is put on the stream
just ahead of the watch's own, through aetcd's own request path, so its answer comes first, as it
does after a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from federation.runtime.etcd_process import EtcdProcess
from federation.store.kv import prefix_end
from federation.store.kv_etcd import EtcdKv

pytestmark = pytest.mark.integration

P = b"/test/watch-crossing/"
OTHER = b"/test/watch-crossing-other/"


def abandoned_create_first(watcher: Any) -> None:
    """The next create on `watcher`'s stream is preceded by one for OTHER that nobody waits for."""
    original: Callable[..., Awaitable[None]] = watcher._enqueue_watch_create

    async def stale_then_own(*args: Any, **kwargs: Any) -> None:
        watcher._enqueue_watch_create = original
        await original(OTHER, range_end=prefix_end(OTHER), watch_id=7)
        await original(*args, **kwargs)

    watcher._enqueue_watch_create = stale_then_own


async def test_a_watch_follows_its_own_prefix_when_an_abandoned_creation_is_answered_first(
    etcd_process: EtcdProcess,
) -> None:
    kv = await EtcdKv.connect(etcd_process.endpoint)
    try:
        await kv.delete_prefix(P)
        start = await kv.put(P + b"a", b"1")
        await kv.put(OTHER + b"x", b"not mine")
        client: Any = kv._clients[kv._current]
        await client._watcher.setup()
        abandoned_create_first(client._watcher)

        watch = kv.watch_prefix(P, start_revision=start)
        async with contextlib.aclosing(watch), asyncio.timeout(10):
            first = await anext(watch)
            await kv.put(OTHER + b"y", b"not mine either")
            await kv.put(P + b"b", b"2")
            second = await anext(watch)
        assert [first.kv.key, second.kv.key] == [P + b"a", P + b"b"]
        # The abandoned watch was cancelled, not left to follow OTHER on the stream.
        assert 7 not in client._watcher._callbacks
    finally:
        await kv.delete_prefix(P)
        await kv.delete_prefix(OTHER)
        await kv.close()
