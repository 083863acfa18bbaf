"""The typed key-value layer under the store: one protocol, real etcd through aetcd, and an in-memory twin.

aetcd ships no types and raises its own exception tree, so this is the only module that imports it: the
rest of federation sees frozen values, `StoreUnavailable` (etcd did not answer) and `WatchCompacted`.
`MemoryKv` keeps etcd's semantics (one global revision per write, create and mod revisions, versions,
leases, compare rules for missing keys, watch history with compaction) so that unit tests run the same
code paths as production; one contract test module runs against both.

aetcd's `transaction` drops the response header (so the revision of a write is lost) and its `get_prefix`
has neither limit nor revision, so unary calls go straight to the gRPC stubs of aetcd's client; its
watcher is used as is.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, TypeVar

import aetcd
import aetcd.exceptions
from aetcd import rpc

from federation.errors import GpufedError, StoreUnavailable

_Operand = TypeVar("_Operand", int, bytes)

# etcd's default --max-txn-ops: compares, success ops and failure ops are each capped at this.
MAX_TXN_OPS = 128


class WatchCompacted(GpufedError):
    """The revision a watch (or a pinned read) asked for is compacted away. Relist, then watch again."""

    retryable = True


class KvError(GpufedError):
    """etcd answered with an error this layer does not expect (for example too many ops in one txn)."""


class LeaseNotFound(KvError):
    """The lease expired or was revoked before a write that used it."""

    retryable = True


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class RangeResult:
    kvs: tuple[KeyValue, ...]
    # The store's revision when read. For a read at an older revision etcd still reports the current one,
    # so to page consistently, pass the first page's revision to every later page.
    revision: int
    # True when `limit` cut the range short.
    more: bool = False


class EventType(StrEnum):
    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    # For DELETE: the key and the revision of the deletion as mod_revision; value empty, versions 0.
    kv: KeyValue


class CompareTarget(StrEnum):
    VERSION = "VERSION"
    CREATE = "CREATE"
    MOD = "MOD"
    VALUE = "VALUE"


class CompareOp(StrEnum):
    EQUAL = "=="
    NOT_EQUAL = "!="
    LESS = "<"
    GREATER = ">"


@dataclass(frozen=True, slots=True)
class Compare:
    key: bytes
    target: CompareTarget
    op: CompareOp
    operand: int | bytes

    def __post_init__(self) -> None:
        if isinstance(self.operand, bytes) != (self.target is CompareTarget.VALUE):
            raise TypeError(
                f"a {self.target} compare takes {'bytes' if self.target is CompareTarget.VALUE else 'int'}"
            )

    @staticmethod
    def absent(key: bytes) -> Compare:
        return Compare(key, CompareTarget.VERSION, CompareOp.EQUAL, 0)

    @staticmethod
    def mod_revision_is(key: bytes, revision: int) -> Compare:
        return Compare(key, CompareTarget.MOD, CompareOp.EQUAL, revision)

    @staticmethod
    def created_at(key: bytes, create_revision: int) -> Compare:
        return Compare(key, CompareTarget.CREATE, CompareOp.EQUAL, create_revision)

    @staticmethod
    def value_is(key: bytes, value: bytes) -> Compare:
        return Compare(key, CompareTarget.VALUE, CompareOp.EQUAL, value)


@dataclass(frozen=True, slots=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: bytes


@dataclass(frozen=True, slots=True)
class Get:
    key: bytes


Op = Put | Delete | Get


@dataclass(frozen=True, slots=True)
class Txn:
    """One conditional transaction, for `txn_many`."""

    compares: tuple[Compare, ...]
    success: tuple[Op, ...]
    failure: tuple[Op, ...] = ()


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    # Store revision after the txn (unchanged when the branch that ran wrote nothing).
    revision: int
    # One entry per Get op of the branch that ran, in order.
    gets: tuple[KeyValue | None, ...]


class KeyValueStore(Protocol):
    async def get(self, key: bytes) -> KeyValue | None: ...

    async def range_prefix(
        self, prefix: bytes, *, limit: int = 0, start: bytes | None = None, revision: int = 0
    ) -> RangeResult:
        """Keys under prefix, sorted, from `start` (inclusive) if given, read at `revision` (0: latest).

        Raises WatchCompacted if `revision` was compacted.
        """
        ...

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int: ...

    async def delete(self, key: bytes) -> bool: ...

    async def delete_prefix(self, prefix: bytes) -> int: ...

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult: ...

    async def txn_many(self, txns: Sequence[Txn]) -> list[TxnResult]:
        """Independent transactions in one request: each commits or fails on its own compares.

        On etcd they are nested transactions of one request, applied at one revision, so a batch
        costs one round trip and one raft entry instead of one per transaction (group commit).
        No two of them may write the same key, and at most MAX_TXN_OPS may go in one call.
        """
        ...

    def watch_prefix(self, prefix: bytes, *, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
        """Events from start_revision (inclusive; 0: from now). Raises WatchCompacted when iterated."""
        ...

    async def grant_lease(self, ttl_s: int) -> int: ...

    async def keepalive(self, lease_id: int) -> int:
        """Refresh the lease; returns the TTL left in seconds, 0 or less once it has expired."""
        ...

    async def revoke_lease(self, lease_id: int) -> None: ...

    async def compact(self, revision: int) -> None: ...

    async def close(self) -> None: ...


def prefix_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with prefix (etcd's range_end for a prefix)."""
    s = bytearray(prefix)
    for i in reversed(range(len(s))):
        if s[i] < 0xFF:
            s[i] += 1
            return bytes(s[: i + 1])
    return b"\0"


def compare_holds(c: Compare, kv: KeyValue | None) -> bool:
    """etcd's rule: a missing key compares as all zeros, except that a VALUE compare on it always fails."""
    if isinstance(c.operand, bytes):  # a VALUE compare, as Compare checks on construction
        return kv is not None and _holds(c.op, kv.value, c.operand)
    if kv is None:
        return _holds(c.op, 0, c.operand)
    if c.target is CompareTarget.VERSION:
        return _holds(c.op, kv.version, c.operand)
    if c.target is CompareTarget.CREATE:
        return _holds(c.op, kv.create_revision, c.operand)
    return _holds(c.op, kv.mod_revision, c.operand)


def _holds(op: CompareOp, actual: _Operand, want: _Operand) -> bool:
    match op:
        case CompareOp.EQUAL:
            return actual == want
        case CompareOp.NOT_EQUAL:
            return actual != want
        case CompareOp.LESS:
            return actual < want
        case CompareOp.GREATER:
            return actual > want


def check_txn_shape(compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> None:
    """The requests etcd rejects outright, checked up front so both kvs fail alike."""
    for name, items in (("compares", compares), ("success ops", success), ("failure ops", failure)):
        if len(items) > MAX_TXN_OPS:
            raise KvError(f"txn has {len(items)} {name}; etcd allows at most {MAX_TXN_OPS}")
    for branch in (success, failure):
        written = [op.key for op in branch if not isinstance(op, Get)]
        if len(set(written)) != len(written):
            raise KvError("txn writes the same key twice in one branch; etcd rejects that")


def check_batch_shape(txns: Sequence[Txn]) -> None:
    """What etcd refuses in a batch of nested transactions: too many, or two writing one key."""
    if len(txns) > MAX_TXN_OPS:
        raise KvError(f"batch has {len(txns)} transactions; etcd allows at most {MAX_TXN_OPS}")
    written: set[bytes] = set()
    for t in txns:
        check_txn_shape(t.compares, t.success, t.failure)
        keys = {op.key for op in (*t.success, *t.failure) if not isinstance(op, Get)}
        if written & keys:
            raise KvError("two transactions in one batch write the same key; etcd rejects that")
        written |= keys


# ---- etcd, through aetcd ------------------------------------------------------------------------

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
_CHANNEL_OPTIONS: dict[str, int] = {
    "grpc.enable_http_proxy": 0,
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
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


# ---- in memory ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Lease:
    ttl_s: int
    expires_at: float
    keys: set[bytes]


@dataclass(frozen=True, slots=True)
class _Change:
    revision: int
    event: WatchEvent
    # The key's value before this change, so that a read at an older revision can undo it.
    prev: KeyValue | None


def _revision_of(c: _Change) -> int:
    return c.revision


class MemoryKv:
    """KeyValueStore in memory with etcd's semantics, for unit tests and single-process runs.

    Leases expire on the injectable clock, checked at the start of every call (nothing runs in the
    background). The change history behind watches and pinned reads is cut to `history_limit` changes,
    as etcd's compaction would; `compact` cuts it explicitly.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, history_limit: int = 100_000) -> None:
        self._clock = clock
        self._history_limit = history_limit
        self._revision = 1  # etcd starts at 1 with an empty store
        self._compacted = 0
        self._data: dict[bytes, KeyValue] = {}
        self._keys: list[bytes] = []  # sorted
        self._history: list[_Change] = []
        self._leases: dict[int, _Lease] = {}
        self._next_lease = 0x6A5F_0000
        self._changed = asyncio.Event()
        self._closed = False

    @property
    def revision(self) -> int:
        return self._revision

    # -- internals: every write goes through _write, at the revision the caller bumped to

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable("the in-memory kv is closed")
        self._expire_leases()

    def _expire_leases(self) -> None:
        now = self._clock()
        for lease_id in [i for i, lease in self._leases.items() if lease.expires_at <= now]:
            self._drop_lease(lease_id)

    def _drop_lease(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id)
        if lease.keys:
            self._revision += 1
            for key in sorted(lease.keys):
                self._write(key, None)
            self._notify()

    def _write(self, key: bytes, new: KeyValue | None) -> None:
        prev = self._data.get(key)
        if prev is not None and prev.lease and prev.lease in self._leases:
            self._leases[prev.lease].keys.discard(key)
        if new is None:
            del self._data[key]
            del self._keys[bisect.bisect_left(self._keys, key)]
            event = WatchEvent(EventType.DELETE, KeyValue(key, b"", 0, self._revision, 0))
        else:
            if prev is None:
                bisect.insort(self._keys, key)
            self._data[key] = new
            if new.lease:
                self._leases[new.lease].keys.add(key)
            event = WatchEvent(EventType.PUT, new)
        self._history.append(_Change(self._revision, event, prev))

    def _put_kv(self, key: bytes, value: bytes, lease: int) -> None:
        prev = self._data.get(key)
        created = prev.create_revision if prev is not None else self._revision
        version = prev.version + 1 if prev is not None else 1
        self._write(key, KeyValue(key, value, created, self._revision, version, lease))

    def _notify(self) -> None:
        if len(self._history) > self._history_limit:
            self._compact_to(self._history[len(self._history) - self._history_limit].revision)
        self._changed.set()
        self._changed = asyncio.Event()

    def _compact_to(self, revision: int) -> None:
        self._compacted = max(self._compacted, revision)
        del self._history[: bisect.bisect_left(self._history, revision, key=_revision_of)]

    def _check_lease(self, lease: int) -> None:
        if lease and lease not in self._leases:
            raise LeaseNotFound(f"lease {lease:x} not found: expired or revoked")

    # -- KeyValueStore

    async def get(self, key: bytes) -> KeyValue | None:
        self._check_open()
        return self._data.get(key)

    async def range_prefix(
        self, prefix: bytes, *, limit: int = 0, start: bytes | None = None, revision: int = 0
    ) -> RangeResult:
        self._check_open()
        lo, hi = prefix if start is None else max(start, prefix), prefix_end(prefix)
        if revision > self._revision:
            raise KvError(f"range at revision {revision}: a future revision (now {self._revision})")
        if revision and revision < self._compacted:
            raise WatchCompacted(f"range at revision {revision}: compacted below {self._compacted}")
        if revision in (0, self._revision):
            i, j = bisect.bisect_left(self._keys, lo), bisect.bisect_left(self._keys, hi)
            if limit and j - i > limit:
                return RangeResult(
                    tuple(self._data[k] for k in self._keys[i : i + limit]), self._revision, True
                )
            return RangeResult(tuple(self._data[k] for k in self._keys[i:j]), self._revision)
        # An older revision: undo, newest first, the changes made after it.
        past = {k: self._data[k] for k in self._keys[bisect.bisect_left(self._keys, lo) :] if k < hi}
        after = bisect.bisect_right(self._history, revision, key=_revision_of)
        for change in reversed(self._history[after:]):
            key = change.event.kv.key
            if lo <= key < hi:
                if change.prev is None:
                    past.pop(key, None)
                else:
                    past[key] = change.prev
        kvs = [past[k] for k in sorted(past)]
        more = bool(limit) and len(kvs) > limit
        # Like etcd, report the store's current revision, not the one read at.
        return RangeResult(tuple(kvs[:limit] if more else kvs), self._revision, more)

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        self._check_open()
        self._check_lease(lease)
        self._revision += 1
        self._put_kv(key, value, lease)
        self._notify()
        return self._revision

    async def delete(self, key: bytes) -> bool:
        self._check_open()
        if key not in self._data:
            return False
        self._revision += 1
        self._write(key, None)
        self._notify()
        return True

    async def delete_prefix(self, prefix: bytes) -> int:
        self._check_open()
        hi = prefix_end(prefix)
        doomed = self._keys[bisect.bisect_left(self._keys, prefix) : bisect.bisect_left(self._keys, hi)]
        if doomed:
            self._revision += 1
            for key in doomed:
                self._write(key, None)
            self._notify()
        return len(doomed)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        self._check_open()
        check_txn_shape(compares, success, failure)
        return self._apply_txns([Txn(tuple(compares), tuple(success), tuple(failure))])[0]

    async def txn_many(self, txns: Sequence[Txn]) -> list[TxnResult]:
        self._check_open()
        check_batch_shape(txns)
        return self._apply_txns(txns)

    def _apply_txns(self, txns: Sequence[Txn]) -> list[TxnResult]:
        """As etcd does: every compare is read before any write, and all writes share one revision."""
        outcomes = [all(compare_holds(c, self._data.get(c.key)) for c in t.compares) for t in txns]
        branches = [t.success if ok else t.failure for t, ok in zip(txns, outcomes, strict=True)]
        for branch in branches:
            for op in branch:
                if isinstance(op, Put):
                    self._check_lease(op.lease)
        writes = any(
            isinstance(op, Put) or (isinstance(op, Delete) and op.key in self._data)
            for branch in branches
            for op in branch
        )
        if writes:
            self._revision += 1
        all_gets: list[tuple[KeyValue | None, ...]] = []
        for branch in branches:
            gets: list[KeyValue | None] = []
            for op in branch:
                if isinstance(op, Get):
                    gets.append(self._data.get(op.key))
                elif isinstance(op, Put):
                    self._put_kv(op.key, op.value, op.lease)
                elif op.key in self._data:
                    self._write(op.key, None)
            all_gets.append(tuple(gets))
        if writes:
            self._notify()
        return [TxnResult(ok, self._revision, gets) for ok, gets in zip(outcomes, all_gets, strict=True)]

    async def watch_prefix(self, prefix: bytes, *, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
        self._check_open()
        lo, hi = prefix, prefix_end(prefix)
        next_revision = start_revision if start_revision > 0 else self._revision + 1
        while True:
            # Taken before the scan: a write while we are suspended in a yield sets it, so none is missed.
            changed = self._changed
            if next_revision < self._compacted:
                raise WatchCompacted(f"watch from {next_revision}: compacted below {self._compacted}")
            i = bisect.bisect_left(self._history, next_revision, key=_revision_of)
            batch = self._history[i:]
            for change in batch:
                if lo <= change.event.kv.key < hi:
                    yield change.event
            if batch:
                next_revision = batch[-1].revision + 1
            if self._closed:
                return
            await changed.wait()

    async def grant_lease(self, ttl_s: int) -> int:
        self._check_open()
        self._next_lease += 1
        self._leases[self._next_lease] = _Lease(ttl_s, self._clock() + ttl_s, set())
        return self._next_lease

    async def keepalive(self, lease_id: int) -> int:
        self._check_open()
        lease = self._leases.get(lease_id)
        if lease is None:
            return 0
        lease.expires_at = self._clock() + lease.ttl_s
        return lease.ttl_s

    async def revoke_lease(self, lease_id: int) -> None:
        self._check_open()
        if lease_id in self._leases:
            self._drop_lease(lease_id)

    async def compact(self, revision: int) -> None:
        self._check_open()
        if revision > self._revision:
            raise KvError(f"compact to {revision}: a future revision (now {self._revision})")
        self._compact_to(revision)

    async def close(self) -> None:
        # Wakes watchers so that they end, as a closed etcd client ends its watches.
        self._closed = True
        self._changed.set()
