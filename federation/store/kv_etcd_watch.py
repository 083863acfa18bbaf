"""etcd's Watch stream, shared by every watch of one member's client, read straight off the gRPC stub.

Every job cache follows every job write through a watch (the lifecycle writes a job about eight
times), so what a watch event costs is paid by every process that holds a cache, for every write.
aetcd's watcher took each response under an asyncio lock, made an `Event` and a `KeyValue` of its
own for each event (looking its kind's name up in the protobuf descriptor), handed each event to a
callback that put it on a queue, and passed it through two async generators before `EtcdKv`'s own.
Here the stream's reader task hands each response's events, as the protobuf's own list, to the
watch they belong to in one step; the watch's generator (`EtcdKv.watch_prefix`) makes the
`KeyValue`s as it yields them.

The rules the watch keeps (the job and ledger caches build on them):
- A create names its watch id (`WATCH_IDS`, unique in the process), and a "created" answer is
  matched to its create by that id: an answer no create waits for (one that timed out under a
  loaded etcd) is cancelled, never taken by another create (issue 33: aetcd paired answers by order,
  and the job cache once followed the ledger's prefix for 13 minutes).
- Events come in the stream's order, which is etcd's revision order; none is dropped or repeated.
- A watch whose start revision is compacted fails with `WatchCompacted` (etcd cancels that watch
  alone: the others on the stream go on). A watch etcd cancels for any other reason fails with
  `StoreUnavailable`, so that its caller watches again, rather than waiting for ever.
- A stream that breaks (etcd gone, restarted, the connection lost) or that etcd ends fails every
  watch on it with `StoreUnavailable` or the gRPC error (which `EtcdKv` turns into one); the next
  watch opens a new stream. Closing the client ends every watch without an error.
- Requests (creates, cancels) go out through one writer task: a caller cancelled while its create
  was being written would otherwise cancel the whole gRPC call (gRPC's asyncio `write` does), and
  with it every other watch on the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

import grpc
from aetcd import rpc

from federation.errors import StoreUnavailable
from federation.store.kv import KvError, WatchCompacted

# Watch ids this process gives etcd: unique on every stream, and far above the ids etcd assigns by
# itself from 0, should anything on the stream ever leave the choice to it.
WATCH_IDS: Final = itertools.count(1 << 40)

# What a watch's queue holds: a response's events, an error to raise, or None (the stream closed).
_Item = Sequence[Any] | BaseException | None


class Watch:
    """One watch on a stream: its id, and what the stream's reader has handed it, in order."""

    __slots__ = ("_created", "_items", "_stream", "_waiter", "prefix", "watch_id")

    def __init__(self, stream: WatchStream, watch_id: int, prefix: bytes) -> None:
        self._stream = stream
        self.watch_id = watch_id
        self.prefix = prefix
        self._items: deque[_Item] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._created: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def push(self, item: _Item) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def answer_creation(self, error: BaseException | None) -> None:
        if not self._created.done():
            if error is None:
                self._created.set_result(None)
            else:
                self._created.set_exception(error)

    async def next_events(self) -> Sequence[Any] | None:
        """The next response's events (protobuf `Event`s, in revision order); None once the stream
        was closed by its client. Raises what ended the watch."""
        items = self._items
        while not items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = items.popleft()
        if isinstance(item, BaseException):
            # Raised again at every later call: a watch that failed stays failed.
            items.appendleft(item)
            raise item
        if item is None:
            items.appendleft(None)
        return item

    def cancel(self) -> None:
        """Stop the watch (idempotent; no await, so that a generator's `finally` may call it)."""
        self._stream.cancel(self)


class WatchStream:
    """One bidirectional Watch call to one etcd member, opened at the first watch and shared by all."""

    def __init__(self, stub: Any, *, endpoint: str, timeout_s: float, metadata: Any = None) -> None:
        self._stub = stub
        self.endpoint = endpoint
        self._timeout_s = timeout_s
        self._metadata = metadata
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._requests: asyncio.Queue[Any] = asyncio.Queue()
        # Watches whose "created" answer is awaited, and those etcd created, by id.
        self._pending: dict[int, Watch] = {}
        self._watches: dict[int, Watch] = {}
        self._closed = False
        # How many calls this stream has opened (tests: many watches share one).
        self.calls_opened = 0

    @property
    def watch_ids(self) -> frozenset[int]:
        """The ids of the watches etcd created and nobody cancelled (tests)."""
        return frozenset(self._watches)

    async def create(self, prefix: bytes, range_end: bytes, start_revision: int) -> Watch:
        """A watch of [prefix, range_end) from `start_revision` (0: from now), once etcd created it.

        Raises StoreUnavailable when etcd does not answer within the deadline (the create's answer,
        should it come later, is cancelled) and WatchCompacted when it refuses a compacted start."""
        if self._closed:
            raise StoreUnavailable(f"watch: the client for etcd at {self.endpoint} is closed")
        self._open()
        watch = Watch(self, next(WATCH_IDS), prefix)
        self._pending[watch.watch_id] = watch
        self.send(
            rpc.WatchRequest(
                create_request=rpc.WatchCreateRequest(
                    key=prefix, range_end=range_end, start_revision=start_revision, watch_id=watch.watch_id
                )
            )
        )
        try:
            async with asyncio.timeout(self._timeout_s):
                await watch._created
        except BaseException as e:
            # Given up on (the deadline, a cancelled caller) or refused: a created watch is
            # cancelled at once, and an answer still to come is a stray, cancelled when it comes.
            self.cancel(watch)
            if isinstance(e, TimeoutError):
                raise StoreUnavailable(
                    f"watch: etcd at {self.endpoint} did not answer the creation of a watch within "
                    f"{self._timeout_s} s"
                ) from e
            raise
        return watch

    def cancel(self, watch: Watch) -> None:
        self._pending.pop(watch.watch_id, None)
        if self._watches.pop(watch.watch_id, None) is not None and self._call is not None:
            self.send(rpc.WatchRequest(cancel_request=rpc.WatchCancelRequest(watch_id=watch.watch_id)))

    def send(self, request: Any) -> None:
        """Put `request` on the stream (through the writer task)."""
        self._requests.put_nowait(request)

    async def close(self) -> None:
        """End every watch (without an error) and the call, and wait for the stream's tasks."""
        self._closed = True
        tasks = (self._reader, self._writer)
        self._end(None)
        for task in tasks:
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    # ---- internals

    def _open(self) -> None:
        if self._call is not None:
            return
        self._call = self._stub.Watch(metadata=self._metadata)
        self.calls_opened += 1
        self._requests = asyncio.Queue()
        self._reader = asyncio.create_task(self._read(self._call), name=f"etcd-watch-read {self.endpoint}")
        self._writer = asyncio.create_task(
            self._write(self._call, self._requests), name=f"etcd-watch-write {self.endpoint}"
        )

    async def _write(self, call: Any, requests: asyncio.Queue[Any]) -> None:
        try:
            while True:
                await call.write(await requests.get())
        except asyncio.CancelledError:
            raise
        except Exception as e:
            # A call that has ended tells its reader why (etcd's status); anything else ends it here.
            if call is self._call and not call.done():
                self._end(StoreUnavailable(f"watch: could not write to etcd at {self.endpoint}: {e!r}"))

    async def _read(self, call: Any) -> None:
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    raise StoreUnavailable(f"watch: etcd at {self.endpoint} ended the watch stream")
                self._handle(response)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            # Handed to every watch on the stream: each raises it. etcd's status is left for
            # `EtcdKv` to name (compacted, unavailable, refused); anything else is etcd not
            # answering as it should: the caller watches again.
            if call is self._call:
                self._end(
                    e
                    if isinstance(e, grpc.aio.AioRpcError | StoreUnavailable)
                    else StoreUnavailable(f"watch: the stream from etcd at {self.endpoint} failed: {e!r}")
                )

    def _handle(self, response: Any) -> None:
        watch_id = response.watch_id
        if response.created:
            watch = self._pending.pop(watch_id, None)
            if watch is None:
                # A stray: the answer to a create given up on, or to none of ours.
                if not response.canceled:
                    self.send(rpc.WatchRequest(cancel_request=rpc.WatchCancelRequest(watch_id=watch_id)))
                return
            if response.canceled:
                watch.answer_creation(self._refusal(response))
                return
            self._watches[watch_id] = watch
            watch.answer_creation(None)
        watch = self._watches.get(watch_id)
        if watch is None:
            return  # what was on its way to a watch cancelled since
        if response.compact_revision:
            # etcd has cancelled this watch (and only this one).
            del self._watches[watch_id]
            watch.push(self._refusal(response))
            return
        if response.canceled:
            del self._watches[watch_id]
            watch.push(self._refusal(response))
            return
        events = response.events
        if events:
            watch.push(events)

    def _refusal(self, response: Any) -> BaseException:
        if response.compact_revision:
            return WatchCompacted(
                f"watch: etcd at {self.endpoint} compacted below {response.compact_revision}"
            )
        reason = response.cancel_reason or "no reason given"
        if "compacted" in reason:
            return WatchCompacted(f"watch: etcd at {self.endpoint}: {reason}")
        if "permission denied" in reason or "already" in reason:
            return KvError(f"watch: etcd at {self.endpoint} refused the watch: {reason}")
        return StoreUnavailable(
            f"watch: etcd at {self.endpoint} cancelled the watch: {reason}; watching again"
        )

    def _end(self, error: BaseException | None) -> None:
        """The call is over: every watch on it ends with `error` (None: closed by the client)."""
        call, self._call = self._call, None
        pending, self._pending = self._pending, {}
        watches, self._watches = self._watches, {}
        for task in (self._reader, self._writer):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._reader = self._writer = None
        if call is not None:
            call.cancel()
        gone = (
            error
            if error is not None
            else StoreUnavailable(f"watch: the client for etcd at {self.endpoint} is closed")
        )
        for watch in pending.values():
            watch.answer_creation(gone)
        for watch in watches.values():
            watch.push(error)
