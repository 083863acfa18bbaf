"""The watch stream of our own (`federation.store.kv_etcd_watch`) on real etcd: many watches on one
stream, each with its own events in order; a cancel; a compaction under one watch; a caller
cancelled while its watch was being created; etcd restarted under a watch; the client closed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from federation.errors import StoreUnavailable
from federation.runtime.etcd_process import EtcdProcess
from federation.store.kv import EventType, WatchCompacted, WatchEvent
from federation.store.kv_etcd import EtcdKv
from federation.store.kv_etcd_watch import WatchStream

pytestmark = pytest.mark.integration

P = b"/test/watch-stream/"


def stream_of(kv: EtcdKv) -> WatchStream:
    stream = kv.endpoint_clients[kv._current].watches
    assert stream is not None
    return stream


async def take(watch: AsyncGenerator[WatchEvent, None], n: int) -> list[WatchEvent]:
    return [await anext(watch) for _ in range(n)]


@pytest.fixture
async def kv(etcd_process: EtcdProcess) -> AsyncGenerator[EtcdKv, None]:
    kv = await EtcdKv.connect(etcd_process.endpoint)
    await kv.delete_prefix(P)
    try:
        yield kv
    finally:
        await kv.delete_prefix(P)
        await kv.close()


async def test_many_watches_share_one_stream_and_each_gets_its_own_events_in_order(kv: EtcdKv) -> None:
    start = await kv.put(P + b"start", b"")
    prefixes = [P + f"w{i:02d}/".encode() for i in range(20)]
    # Two watches of one prefix: each gets every event of it.
    watches = [kv.watch_prefix(p, start_revision=start) for p in prefixes + prefixes[:1]]
    async with contextlib.AsyncExitStack() as stack:
        for w in watches:
            await stack.enter_async_context(contextlib.aclosing(w))
        async with asyncio.timeout(20):
            # Writes before and after the watches exist, and a delete: history, then live events.
            for round_ in range(3):
                for p in reversed(prefixes):
                    await kv.put(p + b"k", f"{round_}".encode())
            await kv.delete(prefixes[3] + b"k")
            got = [await take(w, 4 if i == 3 else 3) for i, w in enumerate(watches)]
        assert stream_of(kv).calls_opened == 1
    for i, events in enumerate(got):
        prefix = prefixes[i % len(prefixes)]
        assert [e.kv.key for e in events] == [prefix + b"k"] * len(events)
        assert [e.kv.value for e in events[:3]] == [b"0", b"1", b"2"]
        revisions = [e.kv.mod_revision for e in events]
        assert revisions == sorted(set(revisions))
    assert [e.type for e in got[3]] == [EventType.PUT] * 3 + [EventType.DELETE]
    assert got[0] == got[-1]
    # Closed, every watch was cancelled on the stream.
    assert stream_of(kv).watch_ids == frozenset()


async def test_a_cancelled_watch_leaves_the_stream_and_the_others_go_on(kv: EtcdKv) -> None:
    start = await kv.put(P + b"start", b"")
    kept = kv.watch_prefix(P + b"kept/", start_revision=start)
    dropped = kv.watch_prefix(P + b"dropped/", start_revision=start)
    async with contextlib.aclosing(kept), asyncio.timeout(10):
        await kv.put(P + b"dropped/a", b"1")
        await kv.put(P + b"kept/a", b"1")
        assert (await anext(dropped)).kv.key == P + b"dropped/a"
        assert (await anext(kept)).kv.key == P + b"kept/a"
        assert len(stream_of(kv).watch_ids) == 2
        await dropped.aclose()
        assert len(stream_of(kv).watch_ids) == 1
        await kv.put(P + b"dropped/b", b"2")
        await kv.put(P + b"kept/b", b"2")
        assert (await anext(kept)).kv.key == P + b"kept/b"


async def test_a_compaction_under_one_watch_fails_it_alone(kv: EtcdKv) -> None:
    first = await kv.put(P + b"c/a", b"1")
    live = kv.watch_prefix(P + b"live/", start_revision=first)
    async with contextlib.aclosing(live), asyncio.timeout(10):
        await kv.put(P + b"live/a", b"1")
        assert (await anext(live)).kv.value == b"1"
        now = await kv.put(P + b"c/a", b"2")
        await kv.compact(now)
        with pytest.raises(WatchCompacted):
            await take(kv.watch_prefix(P + b"c/", start_revision=first), 1)
        # The stream and the other watch on it go on.
        await kv.put(P + b"live/a", b"2")
        assert (await anext(live)).kv.value == b"2"
        assert stream_of(kv).calls_opened == 1
        assert len(stream_of(kv).watch_ids) == 1


async def test_a_caller_cancelled_while_its_watch_is_created_breaks_no_other_watch(kv: EtcdKv) -> None:
    start = await kv.put(P + b"start", b"")
    other = kv.watch_prefix(P + b"other/", start_revision=start)
    async with contextlib.aclosing(other), asyncio.timeout(10):
        await kv.put(P + b"other/a", b"1")
        assert (await anext(other)).kv.value == b"1"
        for _ in range(20):
            gone = kv.watch_prefix(P + b"gone/", start_revision=start)
            task = asyncio.ensure_future(anext(gone))
            await asyncio.sleep(0)  # its create is on its way
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await gone.aclose()
        await kv.put(P + b"other/b", b"2")
        assert (await anext(other)).kv.value == b"2"
        stream = stream_of(kv)
        assert stream.calls_opened == 1
        # The given-up creates' answers were strays: none of them is left on the stream.
        await kv.put(P + b"gone/x", b"")
        await kv.put(P + b"other/c", b"3")
        assert (await anext(other)).kv.value == b"3"
        assert len(stream.watch_ids) == 1


async def test_etcd_restarted_under_a_watch_fails_it_and_the_next_watch_loses_nothing(tmp_path: Path) -> None:
    etcd = EtcdProcess(tmp_path / "etcd")
    etcd.start()
    kv = await EtcdKv.connect(etcd.endpoint, timeout_s=2.0)
    try:
        start = await kv.put(P + b"a", b"1")
        watch = kv.watch_prefix(P, start_revision=start)
        seen: list[WatchEvent] = []
        async with contextlib.aclosing(watch), asyncio.timeout(20):
            seen.append(await anext(watch))
            await kv.put(P + b"b", b"2")
            seen.append(await anext(watch))
            etcd.kill()
            with pytest.raises(StoreUnavailable):
                await anext(watch)
        # A watch while etcd is away fails within the deadline, not for ever.
        with pytest.raises(StoreUnavailable):
            async with asyncio.timeout(10):
                await take(kv.watch_prefix(P, start_revision=seen[-1].kv.mod_revision + 1), 1)
        etcd.start()  # same data dir, same ports
        last = seen[-1].kv.mod_revision
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            try:
                written = await kv.put(P + b"c", b"3")
                break
            except StoreUnavailable:
                assert asyncio.get_running_loop().time() < deadline, "etcd never came back"
                await asyncio.sleep(0.2)
        while True:
            again = kv.watch_prefix(P, start_revision=last + 1)
            try:
                async with contextlib.aclosing(again), asyncio.timeout(5):
                    seen.append(await anext(again))
                break
            except StoreUnavailable:
                assert asyncio.get_running_loop().time() < deadline, "no watch after the restart"
                await asyncio.sleep(0.2)
        assert [(e.kv.key, e.kv.value) for e in seen] == [
            (P + b"a", b"1"),
            (P + b"b", b"2"),
            (P + b"c", b"3"),
        ]
        assert seen[-1].kv.mod_revision == written
    finally:
        await kv.close()
        etcd.stop()


async def test_closing_the_client_ends_its_watches_without_an_error(etcd_process: EtcdProcess) -> None:
    kv = await EtcdKv.connect(etcd_process.endpoint)
    start = await kv.put(P + b"a", b"1")
    watch = kv.watch_prefix(P, start_revision=start)
    async with contextlib.aclosing(watch), asyncio.timeout(10):
        assert (await anext(watch)).kv.value == b"1"
        pending = asyncio.ensure_future(anext(watch))
        # One turn of the loop takes it to the wait for the stream's next response (nothing is
        # queued for it); closed before or after, it ends the same way.
        await asyncio.sleep(0)
        await kv.close()
        with pytest.raises(StopAsyncIteration):
            await pending
