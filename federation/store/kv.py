"""The typed key-value layer under the store: values, the `KeyValueStore` protocol, and its rules.

Two implementations meet the protocol: `kv_etcd.EtcdKv` (real etcd through aetcd) and
`kv_memory.MemoryKv` (an in-memory twin with etcd's semantics). Everything above them sees only the
frozen values and errors defined here, and the shape checks that both apply the same way.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple, Protocol, TypeVar

from federation.errors import GpufedError

_Operand = TypeVar("_Operand", int, bytes)
_T = TypeVar("_T")

# etcd's default --max-txn-ops: compares, success ops and failure ops are each capped at this.
MAX_TXN_OPS = 128


def cut_by_size(
    items: Sequence[_T], size_of: Callable[[_T], int], max_bytes: int, max_count: int | None = None
) -> list[list[_T]]:
    """`items` in order, cut into runs of about `max_bytes` (and at most `max_count` items) each;
    an item larger than `max_bytes` makes a run of its own."""
    out: list[list[_T]] = []
    current: list[_T] = []
    size = 0
    for item in items:
        item_size = size_of(item)
        if current and (len(current) == max_count or size + item_size > max_bytes):
            out.append(current)
            current, size = [], 0
        current.append(item)
        size += item_size
    if current:
        out.append(current)
    return out


class WatchCompacted(GpufedError):
    """The revision a watch (or a pinned read) asked for is compacted away. Relist, then watch again."""

    retryable = True


class KvError(GpufedError):
    """etcd answered with an error this layer does not expect (for example too many ops in one txn)."""


class ReplyTooLarge(KvError):
    """etcd's reply to a read was larger than the client accepts: ask for fewer keys."""


def reply_bytes(kvs: Iterable[KeyValue]) -> int:
    """The keys' and values' bytes of a range's answer: what a reply cap (`ReplyTooLarge`) and the
    size of the next page (`federation.store.kv_pages`) count."""
    return sum(len(kv.key) + len(kv.value) for kv in kvs)


class LeaseNotFound(KvError):
    """The lease expired or was revoked before a write that used it."""

    retryable = True


class KeyValue(NamedTuple):
    """One key as etcd holds it. A named tuple rather than a frozen dataclass (immutable all the
    same): a restart makes one per key in etcd, 200,000 at a busy federation, and a frozen
    dataclass's `__init__` (one `object.__setattr__` per field) took four times as long, about a
    tenth of a restart's listing (issue 19)."""

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
    def mod_revision_less(key: bytes, revision: int) -> Compare:
        return Compare(key, CompareTarget.MOD, CompareOp.LESS, revision)

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


def txn_ops(txn: Txn) -> int:
    """What etcd's ops limit counts of a transaction: the longest of its three lists."""
    return max(len(txn.compares), len(txn.success), len(txn.failure))


def check_batch_shape(txns: Sequence[Txn]) -> None:
    """What etcd refuses in a batch of nested transactions: too many, or two writing one key."""
    if len(txns) > MAX_TXN_OPS:
        raise KvError(f"batch has {len(txns)} transactions; etcd allows at most {MAX_TXN_OPS}")
    written: set[bytes] = set()
    # etcd gives each nested transaction what the request's own ops leave of the limit.
    room = MAX_TXN_OPS - len(txns)
    for t in txns:
        check_txn_shape(t.compares, t.success, t.failure)
        if txn_ops(t) > room:
            raise KvError(
                f"a transaction nested with {len(txns) - 1} others has more than {room} ops;"
                " etcd refuses that"
            )
        keys = {op.key for op in (*t.success, *t.failure) if not isinstance(op, Get)}
        if written & keys:
            raise KvError("two transactions in one batch write the same key; etcd rejects that")
        written |= keys
