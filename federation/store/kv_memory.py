"""`KeyValueStore` in memory with etcd's semantics, for unit tests and single-process runs.

It keeps one global revision per write, create and mod revisions, versions, leases, the compare
rules for missing keys, and a watch history with compaction, so that unit tests run the same code
paths as production; one contract test module runs against both this and `kv_etcd.EtcdKv`.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass

from federation.errors import StoreUnavailable
from federation.store.kv import (
    Compare,
    Delete,
    EventType,
    Get,
    KeyValue,
    KvError,
    LeaseNotFound,
    Op,
    Put,
    RangeResult,
    ReplyTooLarge,
    Txn,
    TxnResult,
    WatchCompacted,
    WatchEvent,
    check_batch_shape,
    check_txn_shape,
    compare_holds,
    prefix_end,
    reply_bytes,
)


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

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        history_limit: int = 100_000,
        max_reply_bytes: int | None = None,
    ) -> None:
        self._clock = clock
        # As etcd's client caps a reply (`EtcdKv.connect`): a range whose keys and values pass it
        # raises ReplyTooLarge. None: no cap.
        self._max_reply_bytes = max_reply_bytes
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
                return self._reply(tuple(self._data[k] for k in self._keys[i : i + limit]), True)
            return self._reply(tuple(self._data[k] for k in self._keys[i:j]), False)
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
        return self._reply(tuple(kvs[:limit] if more else kvs), more)

    def _reply(self, kvs: tuple[KeyValue, ...], more: bool) -> RangeResult:
        if self._max_reply_bytes is not None:
            size = reply_bytes(kvs)
            if size > self._max_reply_bytes:
                raise ReplyTooLarge(
                    f"range: a reply of {size} bytes, larger than max {self._max_reply_bytes}"
                )
        return RangeResult(kvs, self._revision, more)

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
