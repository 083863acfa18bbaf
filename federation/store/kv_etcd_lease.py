"""The leader's lease from a thread of its own, over gRPC's blocking API.

The lease keeper (`federation.scheduling.lease_keeper`) refreshes the lease from a thread with an event
loop of its own, so that a stalled server loop keeps the lease. Its client was `EtcdKv.twin`, an
asyncio client, and gRPC's asyncio API has one completion queue a process, polled by one thread of
gRPC's: every event loop that has made a call registers a reader on the same wake-up socket, and
whichever loop wakes first takes every completion and hands the others' to their loops. So the
keeper's loop, which makes two calls a second, was woken for every gRPC completion of the server
(its etcd calls, its API's calls), and handed each on: an idle loop beside 7,000 to 10,000 puts a
second woke 4,600 to 6,400 times a second (`bench/lease_keeper.py`), and in a lifecycle run at 100
clusters the keeper's thread switched 1,000 to 2,600 times a second, 5 % of the server's CPU in one
sample. A call of the blocking API has completion queues of its own, so the thread wakes for its own
calls only.

`BlockingLeaseClient` does what the keeper asks of etcd (refresh the lease, read the leader key,
revoke) with the same members, TLS, certificates and channel options as the server's client, each
member tried once a call as `EtcdKv` tries them, with the same errors. Its methods are coroutines
for the keeper's `refresh_until_lost`, but each call blocks the thread it is made on until etcd
answers or the deadline passes: the keeper's loop runs nothing else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc
from aetcd import rpc

from federation.errors import GpufedError, StoreUnavailable
from federation.store.kv import KeyValue, LeaseNotFound
from federation.store.kv_etcd import EtcdKv, error_from_status, kv_from_pb
from federation.store.kv_etcd_channel import EndpointClient

T = TypeVar("T")


class BlockingLeaseClient:
    """Lease keepalives, reads of one key and revokes, over blocking gRPC channels of its own."""

    def __init__(self, clients: Sequence[EndpointClient], timeout_s: float) -> None:
        self._clients = list(clients)
        self._timeout_s = timeout_s
        self._channels: dict[int, grpc.Channel] = {}
        self._current = 0
        self._closed = False

    @classmethod
    def twin_of(cls, kv: EtcdKv, *, timeout_s: float | None = None) -> BlockingLeaseClient:
        """A client of `kv`'s members (TLS, certificates and options as its), that waits `timeout_s`
        (else `kv`'s deadline) for each member's answer. Channels connect at the first call."""
        return cls(kv.endpoint_clients, kv.timeout_s if timeout_s is None else timeout_s)

    @property
    def endpoint(self) -> str:
        return ",".join(c.endpoint for c in self._clients)

    @property
    def members(self) -> int:
        return len(self._clients)

    @property
    def timeout_s(self) -> float:
        """The deadline for each member's answer."""
        return self._timeout_s

    async def keepalive(self, lease_id: int) -> int:
        """The lease's TTL left after the refresh (0 or less: it had expired)."""
        return self._on_a_member("keepalive", lambda index: self._keepalive_once(index, lease_id))

    async def get(self, key: bytes) -> KeyValue | None:
        def once(index: int) -> KeyValue | None:
            stub = rpc.KVStub(self._channel(index))
            request = rpc.RangeRequest(key=key)
            resp = stub.Range(request, timeout=self._timeout_s, metadata=self._metadata(index))
            return kv_from_pb(resp.kvs[0]) if resp.kvs else None

        return self._on_a_member("get", once)

    async def revoke_lease(self, lease_id: int) -> None:
        def once(index: int) -> None:
            stub = rpc.LeaseStub(self._channel(index))
            stub.LeaseRevoke(
                rpc.LeaseRevokeRequest(ID=lease_id), timeout=self._timeout_s, metadata=self._metadata(index)
            )

        # Already expired or revoked is the outcome the caller wanted.
        with contextlib.suppress(LeaseNotFound):
            self._on_a_member("revoke lease", once)

    async def close(self) -> None:
        self._closed = True
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            channel.close()

    def _keepalive_once(self, index: int, lease_id: int) -> int:
        stub = rpc.LeaseStub(self._channel(index))
        replies = stub.LeaseKeepAlive(
            iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]),
            timeout=self._timeout_s,
            metadata=self._metadata(index),
        )
        try:
            reply = next(replies, None)
        finally:
            replies.cancel()
        if reply is None:  # the stream closed with no answer
            raise StoreUnavailable(f"keepalive: etcd at {self._clients[index].endpoint} closed the stream")
        return int(reply.TTL)

    def _on_a_member(self, what: str, call: Callable[[int], T]) -> T:
        """`call` on the current member, moving on to the next while members do not answer; each is
        tried once (every call here is idempotent: a refresh, a read, a revoke)."""
        if self._closed:
            raise StoreUnavailable(f"{what}: the client for etcd at {self.endpoint} is closed")
        for attempt in range(len(self._clients)):
            index = self._current
            try:
                return call(index)
            except grpc.RpcError as e:
                error = self._error(what, e, index)
                if not isinstance(error, StoreUnavailable):
                    raise error from e
            except StoreUnavailable as e:
                error = e
            if self._current == index:
                self._current = (index + 1) % len(self._clients)
            if attempt == len(self._clients) - 1:
                raise error
        raise AssertionError("unreachable: the last attempt raises")

    def _error(self, what: str, e: grpc.RpcError, index: int) -> GpufedError:
        endpoint = self._clients[index].endpoint
        code: Any = e.code() if isinstance(e, grpc.Call) else None
        if code is None:
            return StoreUnavailable(f"{what}: etcd at {endpoint} did not answer: {e!r}")
        details = e.details() if isinstance(e, grpc.Call) else ""
        return error_from_status(what, code, details or "", endpoint)

    def _channel(self, index: int) -> grpc.Channel:
        channel = self._channels.get(index)
        if channel is None:
            channel = self._channels[index] = self._clients[index].blocking_channel()
        return channel

    def _metadata(self, index: int) -> Any:
        # aetcd's client keeps an auth token here once it has authenticated (None without etcd auth).
        return self._clients[index].metadata
