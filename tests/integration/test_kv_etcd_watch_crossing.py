"""A watch is never paired with another watch's "created" answer, on real etcd.

aetcd kept one create pending per stream and took the next "created" answer as its own. When a
create timed out (a loaded etcd), its answer still came, and the next create on the stream took it:
that watch then followed the other prefix. The job cache once followed the ledger's prefix that way
and saw no job for 13 minutes (issue 33). The stream of our own (`kv_etcd_watch`) matches answers by
watch id. Here an earlier, abandoned create is put on the stream just ahead of the watch's own, so
its answer comes first, as it does after a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from aetcd import rpc

from federation.runtime.etcd_process import EtcdProcess
from federation.store.kv import prefix_end
from federation.store.kv_etcd import EtcdKv

pytestmark = pytest.mark.integration

P = b"/test/watch-crossing/"
OTHER = b"/test/watch-crossing-other/"
ABANDONED = 7


async def test_a_watch_follows_its_own_prefix_when_an_abandoned_creation_is_answered_first(
    etcd_process: EtcdProcess,
) -> None:
    kv = await EtcdKv.connect(etcd_process.endpoint)
    try:
        await kv.delete_prefix(P)
        start = await kv.put(P + b"a", b"1")
        await kv.put(OTHER + b"x", b"not mine")
        client = kv.endpoint_clients[kv._current]
        await client.connect()
        stream = client.watches
        assert stream is not None
        # The stream is open once a watch was made; the abandoned create goes on it first.
        warm = kv.watch_prefix(P, start_revision=start)
        async with contextlib.aclosing(warm), asyncio.timeout(10):
            await anext(warm)
        stream.send(
            rpc.WatchRequest(
                create_request=rpc.WatchCreateRequest(
                    key=OTHER, range_end=prefix_end(OTHER), watch_id=ABANDONED
                )
            )
        )

        watch = kv.watch_prefix(P, start_revision=start)
        async with contextlib.aclosing(watch), asyncio.timeout(10):
            first = await anext(watch)
            await kv.put(OTHER + b"y", b"not mine either")
            await kv.put(P + b"b", b"2")
            second = await anext(watch)
            # The abandoned watch was cancelled, not left to follow OTHER on the stream.
            assert ABANDONED not in stream.watch_ids
        assert [first.kv.key, second.kv.key] == [P + b"a", P + b"b"]
    finally:
        await kv.delete_prefix(P)
        await kv.delete_prefix(OTHER)
        await kv.close()
