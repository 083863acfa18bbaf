"""`KeyValueStore` over a real etcd, through aetcd: the only module that imports aetcd.

aetcd ships no types and raises its own exception tree; here they become frozen values,
`StoreUnavailable` (etcd did not answer) and `WatchCompacted`. aetcd's `transaction` drops the
response header (so the revision of a write is lost) and its `get_prefix` has neither limit nor
revision, so unary calls go straight to the gRPC stubs of aetcd's client; its watcher is used as is.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

import aetcd
import aetcd.exceptions
from aetcd import rpc

from federation.errors import GpufedError, StoreUnavailable
from federation.kv import (
    Compare,
    CompareOp,
    CompareTarget,
    Delete,
    EventType,
    KeyValue,
    KvError,
    LeaseNotFound,
    Op,
    Put,
    RangeResult,
    Txn,
    TxnResult,
    WatchCompacted,
    WatchEvent,
    check_batch_shape,
    check_txn_shape,
    prefix_end,
)

_UNAVAILABLE_CODES = frozenset(
    {
        rpc.StatusCode.UNAVAILABLE,
        rpc.StatusCode.DEADLINE_EXCEEDED,
        rpc.StatusCode.CANCELLED,
        rpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
_COMPARE_TARGETS = {
    CompareTarget.VERSION: rpc.Compare.VERSION,
    CompareTarget.CREATE: rpc.Compare.CREATE,
    CompareTarget.MOD: rpc.Compare.MOD,
    CompareTarget.VALUE: rpc.Compare.VALUE,
}
_COMPARE_OPS = {
    CompareOp.EQUAL: rpc.Compare.EQUAL,
    CompareOp.NOT_EQUAL: rpc.Compare.NOT_EQUAL,
    CompareOp.LESS: rpc.Compare.LESS,
    CompareOp.GREATER: rpc.Compare.GREATER,
}
_COMPARE_FIELDS = {
    CompareTarget.VERSION: "version",
    CompareTarget.CREATE: "create_revision",
    CompareTarget.MOD: "mod_revision",
    CompareTarget.VALUE: "value",
}
# Reconnect quickly after an etcd restart (gRPC's default backoff grows to two minutes); never go through
# an HTTP proxy from the environment; ping a quiet connection so a half-open one (a partition, not a crash)
# is noticed by a watch. etcd refuses pings more often than every 5 s.
# `min_reconnect_backoff_ms` is gRPC's minimum *connect timeout*, not a backoff: at 100 ms a restarted
# etcd that took longer than that to send its HTTP/2 SETTINGS (a busy 2-core machine) was given up
# on, again and again ("connection attempt timed out before receiving SETTINGS frame"). A refused
# connection still retries within `max_reconnect_backoff_ms`; only a slow handshake gets longer.
_CHANNEL_OPTIONS: dict[str, int] = {
    "grpc.enable_http_proxy": 0,
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 5_000,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
}


def _kv_from_pb(kv: Any) -> KeyValue:
    return KeyValue(
        key=kv.key,
        value=kv.value,
        create_revision=kv.create_revision,
        mod_revision=kv.mod_revision,
        version=kv.version,
        lease=kv.lease,
    )


class EtcdKv:
    """KeyValueStore over one aetcd client. Every call has a deadline, so a dead etcd fails fast."""

    def __init__(self, client: Any, endpoint: str, timeout_s: float) -> None:
        self._client = client
        self.endpoint = endpoint
        self._timeout_s = timeout_s
        self._closed = False

    @classmethod
    async def connect(cls, endpoint: str, *, timeout_s: float = 5.0) -> EtcdKv:
        """A client of "host:port"; raises StoreUnavailable if etcd does not answer a first read."""
        endpoint = endpoint.removeprefix("http://")
        host, _, port = endpoint.rpartition(":")
        client = aetcd.Client(host=host, port=int(port), timeout=timeout_s, options=dict(_CHANNEL_OPTIONS))
        kv = cls(client, endpoint, timeout_s)
        try:
            await kv.get(b"/")
        except BaseException:
            await kv.close()
            raise
        return kv

    def _error(self, what: str, e: BaseException) -> GpufedError:
        """The project error for anything aetcd or gRPC raised."""
        if isinstance(e, aetcd.exceptions.RevisionCompactedError):
            return WatchCompacted(f"{what}: etcd at {self.endpoint} compacted below {e.compacted_revision}")
        cause = e if isinstance(e, rpc.AioRpcError) else e.__cause__
        if isinstance(cause, rpc.AioRpcError):
            code, details = cause.code(), cause.details() or ""
            if code in _UNAVAILABLE_CODES:
                return StoreUnavailable(
                    f"{what}: etcd at {self.endpoint} did not answer: {code.name} {details}"
                )
            if "compacted" in details:
                return WatchCompacted(f"{what}: etcd at {self.endpoint}: {details}")
            if "lease not found" in details:
                return LeaseNotFound(f"{what}: etcd at {self.endpoint}: {details}")
            return KvError(f"{what}: etcd at {self.endpoint} refused: {code.name} {details}")
        if isinstance(
            e,
            aetcd.exceptions.ConnectionFailedError
            | aetcd.exceptions.ConnectionTimeoutError
            | aetcd.exceptions.WatchTimeoutError
            | TimeoutError
            | rpc.BaseError,
        ):
            return StoreUnavailable(f"{what}: etcd at {self.endpoint} did not answer: {e!r}")
        return KvError(f"{what}: etcd at {self.endpoint} failed: {e!r}")

    async def _unary(self, what: str, method: Callable[[Any], Any], request: Any) -> Any:
        """Call one unary RPC; `method` picks it from the connected client (its stubs exist only then)."""
        if self._closed:
            raise StoreUnavailable(f"{what}: the client for etcd at {self.endpoint} is closed")
        try:
            await self._client.connect()
            return await method(self._client)(
                request, timeout=self._timeout_s, metadata=self._client.metadata
            )
        except (aetcd.exceptions.ClientError, rpc.AioRpcError, rpc.BaseError, TimeoutError) as e:
            raise self._error(what, e) from e

    async def get(self, key: bytes) -> KeyValue | None:
        resp = await self._unary("get", lambda c: c.kvstub.Range, rpc.RangeRequest(key=key))
        return _kv_from_pb(resp.kvs[0]) if resp.kvs else None

    async def range_prefix(
        self, prefix: bytes, *, limit: int = 0, start: bytes | None = None, revision: int = 0
    ) -> RangeResult:
        req = rpc.RangeRequest(
            key=prefix if start is None else start,
            range_end=prefix_end(prefix),
            limit=limit,
            revision=revision,
            sort_order=rpc.RangeRequest.ASCEND,
            sort_target=rpc.RangeRequest.KEY,
        )
        resp = await self._unary("range", lambda c: c.kvstub.Range, req)
        return RangeResult(
            kvs=tuple(_kv_from_pb(kv) for kv in resp.kvs), revision=resp.header.revision, more=resp.more
        )

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        resp = await self._unary(
            "put", lambda c: c.kvstub.Put, rpc.PutRequest(key=key, value=value, lease=lease)
        )
        return int(resp.header.revision)

    async def delete(self, key: bytes) -> bool:
        resp = await self._unary("delete", lambda c: c.kvstub.DeleteRange, rpc.DeleteRangeRequest(key=key))
        return bool(resp.deleted)

    async def delete_prefix(self, prefix: bytes) -> int:
        req = rpc.DeleteRangeRequest(key=prefix, range_end=prefix_end(prefix))
        resp = await self._unary("delete prefix", lambda c: c.kvstub.DeleteRange, req)
        return int(resp.deleted)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        check_txn_shape(compares, success, failure)
        resp = await self._unary("txn", lambda c: c.kvstub.Txn, _txn_to_pb(compares, success, failure))
        return _txn_result(resp, resp.header.revision)

    async def txn_many(self, txns: Sequence[Txn]) -> list[TxnResult]:
        check_batch_shape(txns)
        if not txns:
            return []
        outer = rpc.TxnRequest(
            compare=[],
            success=[rpc.RequestOp(request_txn=_txn_to_pb(t.compares, t.success, t.failure)) for t in txns],
        )
        resp = await self._unary("txn", lambda c: c.kvstub.Txn, outer)
        return [_txn_result(r.response_txn, resp.header.revision) for r in resp.responses]

    async def watch_prefix(self, prefix: bytes, *, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
        if self._closed:
            raise StoreUnavailable(f"watch: the client for etcd at {self.endpoint} is closed")
        try:
            watch = await self._client.watch(
                prefix, range_end=prefix_end(prefix), start_revision=start_revision or None
            )
        except (aetcd.exceptions.ClientError, rpc.AioRpcError, TimeoutError) as e:
            raise self._error("watch", e) from e
        events = watch.__aiter__()
        try:
            async for ev in events:
                kv = _kv_from_pb(ev.kv)
                yield WatchEvent(EventType.PUT if ev.kind == "PUT" else EventType.DELETE, kv)
        except (aetcd.exceptions.ClientError, rpc.AioRpcError, TimeoutError) as e:
            raise self._error("watch", e) from e
        finally:
            # After a client close or a dead stream aetcd has already dropped the watch; nothing to cancel.
            with contextlib.suppress(aetcd.exceptions.ClientError, rpc.AioRpcError, AttributeError):
                await watch.cancel()
            await events.aclose()

    async def grant_lease(self, ttl_s: int) -> int:
        resp = await self._unary(
            "grant lease", lambda c: c.leasestub.LeaseGrant, rpc.LeaseGrantRequest(TTL=ttl_s)
        )
        if resp.error:
            raise KvError(f"grant lease: etcd at {self.endpoint}: {resp.error}")
        return int(resp.ID)

    async def keepalive(self, lease_id: int) -> int:
        if self._closed:
            raise StoreUnavailable(f"keepalive: the client for etcd at {self.endpoint} is closed")
        call = None
        try:
            await self._client.connect()
            call = self._client.leasestub.LeaseKeepAlive(
                [rpc.LeaseKeepAliveRequest(ID=lease_id)],
                timeout=self._timeout_s,
                metadata=self._client.metadata,
            )
            reply = await call.read()
        except (aetcd.exceptions.ClientError, rpc.AioRpcError, rpc.BaseError, TimeoutError) as e:
            raise self._error("keepalive", e) from e
        finally:
            if call is not None:
                call.cancel()
        if not isinstance(reply, rpc.LeaseKeepAliveResponse):  # gRPC's EOF: the stream closed empty
            raise StoreUnavailable(f"keepalive: etcd at {self.endpoint} closed the stream")
        return int(reply.TTL)

    async def revoke_lease(self, lease_id: int) -> None:
        # Already expired or revoked is the outcome the caller wanted.
        with contextlib.suppress(LeaseNotFound):
            await self._unary(
                "revoke lease", lambda c: c.leasestub.LeaseRevoke, rpc.LeaseRevokeRequest(ID=lease_id)
            )

    async def compact(self, revision: int) -> None:
        # Compacted at or past this revision already is fine.
        with contextlib.suppress(WatchCompacted):
            await self._unary("compact", lambda c: c.kvstub.Compact, rpc.CompactionRequest(revision=revision))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Closing the client of a dead etcd: nothing is left to release remotely.
        with contextlib.suppress(aetcd.exceptions.ClientError, rpc.AioRpcError, TimeoutError):
            await self._client.close()


def _txn_to_pb(compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> Any:
    return rpc.TxnRequest(
        compare=[
            rpc.Compare(
                key=c.key,
                target=_COMPARE_TARGETS[c.target],
                result=_COMPARE_OPS[c.op],
                **{_COMPARE_FIELDS[c.target]: c.operand},
            )
            for c in compares
        ],
        success=[_op_to_pb(op) for op in success],
        failure=[_op_to_pb(op) for op in failure],
    )


def _txn_result(resp: Any, revision: int) -> TxnResult:
    gets = tuple(
        _kv_from_pb(r.response_range.kvs[0]) if r.response_range.kvs else None
        for r in resp.responses
        if r.WhichOneof("response") == "response_range"
    )
    return TxnResult(succeeded=resp.succeeded, revision=revision, gets=gets)


def _op_to_pb(op: Op) -> Any:
    if isinstance(op, Put):
        return rpc.RequestOp(request_put=rpc.PutRequest(key=op.key, value=op.value, lease=op.lease))
    if isinstance(op, Delete):
        return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=op.key))
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=op.key))
