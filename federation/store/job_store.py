"""Federation's state in a key-value store: jobs, idempotency keys, configuration, tokens, wait reasons.

`JobStore` is what the API, the scheduler and the reconcilers consume; `KvStore` implements it over any
`KeyValueStore` (real etcd in production, `MemoryKv` in unit tests), so both run the same transactions.
Every write that must be atomic is one etcd transaction: a job and its idempotency key are created
together or not at all, and scheduling decisions commit by compare-and-swap on the revisions they read,
fenced by the leader's lease key so that a deposed leader cannot write.

Layout, all under PREFIX: jobs/<job_id>, idem/<tenant>/<sha256 of the client's key>, tenants/<name>,
clusters/<name>, users/<name>, tokens/<sha256 of the token>, waits/<job_id>, approvals/<id>, settings,
leader, ledger/<job_id>/<attempt>. Values are compact
JSON through the explicit codecs in federation.store.jobs and federation.store.records, each
document stamped with its schema version and checked on read (federation.store.schema_version).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import threading
import time
import zlib
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar

import structlog

from federation.errors import IdempotencyConflict, JobIdTaken, NotFound, NotLeader
from federation.store.group_commit import DEFAULT_MAX_BATCH, GroupCommit
from federation.store.intervals import LEDGER_PREFIX, LedgerInterval, interval_from_json, interval_to_dict
from federation.store.jobs import JobHead, JobRecord, job_from_json, job_head_from_json, job_to_dict
from federation.store.kv import (
    MAX_TXN_OPS,
    Compare,
    Delete,
    EventType,
    Get,
    KeyValue,
    KeyValueStore,
    Put,
    Txn,
    WatchCompacted,
    cut_by_size,
)
from federation.store.kv_memory import MemoryKv
from federation.store.kv_pages import pages
from federation.store.records import (
    ApprovalRecord,
    ClusterRecord,
    SchedulingSettings,
    TenantRecord,
    UserRecord,
    approval_from_dict,
    approval_to_dict,
    cluster_from_dict,
    cluster_to_dict,
    settings_from_dict,
    settings_to_dict,
    tenant_from_dict,
    tenant_to_dict,
    user_from_dict,
    user_to_dict,
)
from federation.store.schema_version import SchemaTooNew, check_json, loads, stamped
from federation.store.written import WrittenRecords
from placement.model import ClusterName, GpuType, JobId, TenantId, WaitCode, WaitReason

T = TypeVar("T")
log = structlog.get_logger(__name__)

PREFIX = b"/gpufed/"
JOBS = PREFIX + b"jobs/"
IDEM = PREFIX + b"idem/"
TENANTS = PREFIX + b"tenants/"
CLUSTERS = PREFIX + b"clusters/"
USERS = PREFIX + b"users/"
TOKENS = PREFIX + b"tokens/"
APPROVALS = PREFIX + b"approvals/"
SETTINGS_KEY = PREFIX + b"settings"
WAITS = PREFIX + b"waits/"
LEADER_KEY = PREFIX + b"leader"

# One compare per job, plus the fence, must fit etcd's per-txn cap.
MAX_COMMIT_UPDATES = MAX_TXN_OPS - 1
# A compaction racing a paginated list makes it start over; more than this in a row is not a race.
_LIST_ATTEMPTS = 5


class Stored(Generic[T]):
    """A value as read from the store, and the revision it was read at (pass that back to `commit`
    to update only if nobody wrote in between). Equal and hashed by both.

    `Stored.decoded_on_read` keeps the value's stored bytes and decodes them on the first read of
    `value`: a restart lists every ended job in etcd, which no one may read before the archiver
    moves it to SQL, and decoding them all was most of the time a restart took to serve (issue 19).
    A read from any thread gets the decoded value; two threads reading at once may both decode,
    to equal values. Not assigned to after it is made (by convention: it is no longer a frozen
    dataclass, so that the decoded value can be kept)."""

    __slots__ = ("_mod_revision", "_pending", "_value")

    def __init__(self, value: T, mod_revision: int) -> None:
        self._value = value
        self._mod_revision = mod_revision
        # The bytes and their decoder while `value` is not decoded yet: one attribute, so that a
        # reader on another thread sees both or neither.
        self._pending: tuple[bytes, Callable[[bytes], T]] | None = None

    @classmethod
    def decoded_on_read(cls, raw: bytes, decode: Callable[[bytes], T], mod_revision: int) -> Stored[T]:
        stored: Stored[T] = cls.__new__(cls)
        stored._mod_revision = mod_revision
        stored._pending = (raw, decode)
        return stored

    @property
    def value(self) -> T:
        pending = self._pending
        if pending is not None:
            raw, decode = pending
            # A record the decoder refuses raises here, on every read, as it would have in the list.
            self._value = decode(raw)
            # The value first, then the bytes gone: a reader that finds none finds the value.
            self._pending = None
        return self._value

    @property
    def mod_revision(self) -> int:
        return self._mod_revision

    @property
    def decoded(self) -> bool:
        """Whether `value` was built already (tests; nothing decides by it)."""
        return self._pending is None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Stored):
            return NotImplemented
        return self._mod_revision == other._mod_revision and self.value == other.value

    def __hash__(self) -> int:
        return hash((self.value, self._mod_revision))

    def __repr__(self) -> str:
        return f"Stored(value={self.value!r}, mod_revision={self._mod_revision!r})"


# A job as the job cache lists it: what its index files it by, and the job.
JobEntry = tuple[JobHead, Stored[JobRecord]]


@dataclass(frozen=True, slots=True)
class Fence:
    """The leader's fencing token: its lease key and the revision that created it.

    A write carrying it also compares the key's create revision, so it fails once the lease has expired
    or another leader has taken the key, even if the old leader has not noticed yet.
    """

    key: bytes
    create_revision: int

    def compare(self) -> Compare:
        return Compare.created_at(self.key, self.create_revision)


@dataclass(frozen=True, slots=True)
class LedgerRemoved:
    """A ledger interval deleted from etcd: the archiver moved it to the history store."""

    key: bytes


class JobEventType(StrEnum):
    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class JobEvent:
    type: JobEventType
    job_id: JobId
    # None for DELETE.
    job: JobRecord | None
    mod_revision: int


class JobStore(Protocol):
    # Whether wait reasons are written compressed (`encode_wait_reasons`, `put_encoded_wait_reasons`).
    compress_wait_reasons: bool

    async def create_job(
        self, job: JobRecord, *, idempotency_key: str, manifest_digest: str
    ) -> tuple[Stored[JobRecord], bool]:
        """Create the job unless the tenant used the idempotency key before; True when created now.

        A key reused with the same manifest digest returns the job it created first; with another
        digest it raises IdempotencyConflict.
        """
        ...

    async def get_job(self, job_id: JobId) -> Stored[JobRecord] | None: ...

    async def list_jobs(self) -> tuple[list[Stored[JobRecord]], int]:
        """Every job, and the revision they were all read at (watch from revision + 1)."""
        ...

    async def list_job_entries(self) -> tuple[list[JobEntry], int]:
        """`list_jobs` for the job cache: each job with its head (what the cache files it by), an
        ended job's record decoded only when first read (`Stored.decoded_on_read`). A record of a
        newer schema version than this build's is left out, with an error logged (`_job_entry`)."""
        ...

    async def commit(
        self,
        updates: Sequence[tuple[JobRecord, int]],
        *,
        fence: Fence | None = None,
        ledger: Sequence[LedgerInterval] = (),
    ) -> int | None:
        """Write all jobs if each is still at the given mod revision (and the fence holds), and the
        ledger entries with them in the same transaction.

        Returns the new revision, or None when any compare failed and nothing was written.
        """
        ...

    async def list_ledger(self) -> tuple[list[LedgerInterval], int]:
        """Every ledger interval, and the revision they were read at."""
        ...

    async def list_ledger_by_key(self) -> tuple[dict[bytes, LedgerInterval], int]:
        """Every ledger interval by its key (`LedgerInterval.key`, which it is stored under), and the
        revision they were read at: the ledger cache's map, without working out 100,000 keys again."""
        ...

    def watch_ledger(self, *, start_revision: int) -> AsyncGenerator[LedgerInterval | LedgerRemoved, None]:
        """Ledger intervals as they are written, and their removal once archived (only closed
        intervals of ended jobs are ever removed, after the history store has them)."""
        ...

    def watch_jobs(self, *, start_revision: int) -> AsyncGenerator[JobEvent, None]: ...

    async def put_wait_reasons(
        self, job_id: JobId, reasons: Sequence[WaitReason], *, fence: Fence | None = None
    ) -> None: ...

    async def put_encoded_wait_reasons(
        self, values: Sequence[tuple[JobId, bytes | None]], *, fence: Fence | None = None
    ) -> None:
        """Several jobs' reasons as `encode_wait_reasons` made them (None deletes), in one fenced
        transaction: at most WAIT_WRITES_PER_TXN (`cut_wait_writes`)."""
        ...

    async def get_wait_reasons(self, job_id: JobId) -> tuple[WaitReason, ...]: ...

    async def list_wait_reasons(self) -> dict[JobId, tuple[WaitReason, ...]]:
        """Every job's stored wait reasons (jobs with none are absent)."""
        ...

    async def put_tenant(self, t: TenantRecord) -> None: ...

    async def get_tenant(self, name: str) -> TenantRecord | None: ...

    async def list_tenants(self) -> list[TenantRecord]: ...

    async def delete_tenant(self, name: str) -> bool: ...

    async def put_cluster(self, c: ClusterRecord) -> None: ...

    async def get_cluster(self, name: str) -> ClusterRecord | None: ...

    async def list_clusters(self) -> list[ClusterRecord]: ...

    async def put_user(self, u: UserRecord) -> None: ...

    async def get_user(self, name: str) -> UserRecord | None: ...

    async def list_users(self) -> list[UserRecord]: ...

    async def put_approval(self, a: ApprovalRecord) -> None: ...

    async def list_approvals(self) -> list[ApprovalRecord]: ...

    async def delete_approval(self, approval_id: str) -> bool: ...

    async def put_settings(self, s: SchedulingSettings) -> None: ...

    async def get_settings(self) -> SchedulingSettings:
        """The stored settings, or the defaults when none were ever written."""
        ...

    async def put_token(self, token: str, user: str) -> None:
        """Remember that token authenticates user. Only the token's SHA-256 is stored."""
        ...

    async def resolve_token(self, token: str) -> UserRecord | None: ...

    async def revoke_token(self, token: str) -> bool: ...


# `schema_version.dumps`'s and the lists' encoder, kept: `json.dumps` with separators builds a new
# encoder at every call, a tenth of encoding a job's record, which every write of a job pays. The
# same arguments, so the same bytes (tests/unit/test_job_store_encoding.py).
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def _dumps(d: Any) -> bytes:
    """A document stamped with its schema version; a list (wait reasons) as it is."""
    if isinstance(d, dict):
        return _ENCODE(stamped(d)).encode()
    return _ENCODE(d).encode()


def idempotency_digest(key: str) -> str:
    """The digest a client's idempotency key is stored under (its SHA-256, hex), never the key."""
    return hashlib.sha256(key.encode()).hexdigest()


def idempotency_key_of(tenant: str, digest: str) -> bytes:
    """The etcd key of a tenant's idempotency key with this digest (`JobRecord.idempotency_digest`)."""
    return IDEM + tenant.encode() + b"/" + digest.encode()


def _sha256(text: str) -> bytes:
    return hashlib.sha256(text.encode()).hexdigest().encode()


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector off for the block (if it was on). Decoding 100,000 records makes
    millions of objects, none of them garbage; the collector's passes over the growing heap would
    otherwise cost about as much as the decoding (measured: 1.15 s against 0.63 s for 10,000 jobs).
    Reference counting still frees what dies; the collector runs again after.

    When the blocks made many objects (`FREEZE_AFTER_OBJECTS`: a cache of every job or interval,
    not a page), they are frozen (`gc.freeze`) before the collector comes back on: it would walk
    them all once per generation they are promoted through (half a second each at 100,000 jobs, on
    the restart's critical path) and find no garbage, as the records hold no cycles. Reference
    counting still frees them when the cache drops them."""
    global _gc_pauses, _gc_was_on
    # Counted: the job and ledger lists run side by side, and the first done must not turn it on.
    # Under a lock: the scheduler's cycle and the archiver pause it on worker threads while the
    # event loop's caches may, and a count that two threads raced on could leave it off for good.
    with _gc_pause_lock:
        if _gc_pauses == 0:
            _gc_was_on = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_pause_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_on:
                if gc.get_count()[0] >= FREEZE_AFTER_OBJECTS:
                    gc.freeze()
                gc.enable()


_gc_pauses = 0
_gc_was_on = True
_gc_pause_lock = threading.Lock()
# Objects made under `paused_gc` from which they are frozen rather than handed to the collector.
FREEZE_AFTER_OBJECTS = 200_000


def job_key(job_id: str) -> bytes:
    return JOBS + job_id.encode()


def _stored_job(value: bytes, mod_revision: int, key: bytes | None = None) -> Stored[JobRecord]:
    try:
        return Stored(job_from_json(value, key), mod_revision)
    except SchemaTooNew as e:
        # The newer record's own word for its tenant, if it still says it the old way: the API
        # tells only that tenant (and admins) why; unknown reads as another tenant's.
        doc = json.loads(value)
        tenant = doc.get("tenant") if isinstance(doc, dict) else None
        e.tenant = tenant if isinstance(tenant, str) else None
        raise


def _refused(error: SchemaTooNew) -> None:
    # Once per list or event: the server keeps serving every other job while an operator upgrades.
    log.error("stored_record_refused", key=error.key, schema=error.version, error=str(error))


def _job_entry(kv: KeyValue) -> JobEntry | None:
    """A listed job for the cache: its head decoded now; the rest of an ended job's record when
    first read (`Stored.decoded_on_read`), of a live one now (the leader reads it at once).

    None for a record newer than this build: left out of the cache, so that nothing here acts on
    (or rewrites) what it cannot read; a read of that job asks etcd, and says to upgrade."""
    try:
        check_json(kv.value, kv.key)
    except SchemaTooNew as e:
        _refused(e)
        return None
    head = job_head_from_json(kv.value)
    if head is None:
        # The head alone would not decode: decode the lot the usual way (or fail as it would).
        job = job_from_json(kv.value, kv.key)
        return JobHead(job.job_id, job.tenant, job.phase, job.submitted_at_s), Stored(job, kv.mod_revision)
    if head.phase.is_terminal:
        return head, Stored.decoded_on_read(kv.value, job_from_json, kv.mod_revision)
    return head, Stored(job_from_json(kv.value, kv.key), kv.mod_revision)


# The figures of a wait reason beside its code and message; absent keys read as None, so reasons
# written before a field existed still load.
_WAIT_FIGURES = (
    "tenant",
    "limit_gpus",
    "held_gpus",
    "needed_gpus",
    "free_gpus",
    "largest_free_node_gpus",
    "at_s",
)


def wait_to_dict(r: WaitReason) -> dict[str, Any]:
    d: dict[str, Any] = {
        "code": r.code.value,
        "message": r.message,
        "cluster": r.cluster,
        "gpu_type": r.gpu_type,
    }
    d.update({k: getattr(r, k) for k in _WAIT_FIGURES if getattr(r, k) is not None})
    return d


def wait_from_dict(d: dict[str, Any]) -> WaitReason:
    return WaitReason(
        code=WaitCode(d["code"]),
        message=d["message"],
        cluster=None if d["cluster"] is None else ClusterName(d["cluster"]),
        gpu_type=None if d["gpu_type"] is None else GpuType(d["gpu_type"]),
        tenant=None if d.get("tenant") is None else TenantId(d["tenant"]),
        limit_gpus=d.get("limit_gpus"),
        held_gpus=d.get("held_gpus"),
        needed_gpus=d.get("needed_gpus"),
        free_gpus=d.get("free_gpus"),
        largest_free_node_gpus=d.get("largest_free_node_gpus"),
        at_s=d.get("at_s"),
    )


# How etcd keeps a job's wait reasons: their JSON list, zlib-compressed. A job that waits for room
# has a reason for every cluster, 10 KiB of JSON at 50 clusters and 460 bytes compressed: a million
# queued jobs' reasons were 10 GiB in etcd, more than its quota and most of what a restart lists.
# Level 1: as small as 6 on these repetitive lists, and faster.
WAITS_ZLIB_LEVEL = 1
# One fenced transaction writes this many jobs' reasons: the group commit nests up to 64
# transactions in one request, and etcd leaves each of them 128 less that many ops.
WAIT_WRITES_PER_TXN = MAX_TXN_OPS - DEFAULT_MAX_BATCH
# And about this many bytes, well inside etcd's request limit beside the batch's other writes.
WAIT_WRITES_TXN_BYTES = 256 * 1024


def cut_wait_writes(values: Sequence[tuple[JobId, bytes | None]]) -> list[list[tuple[JobId, bytes | None]]]:
    """`values` in runs that `put_encoded_wait_reasons` takes, each one transaction."""
    return cut_by_size(
        values,
        lambda v: len(v[0]) + len(WAITS) + (0 if v[1] is None else len(v[1])),
        WAIT_WRITES_TXN_BYTES,
        WAIT_WRITES_PER_TXN,
    )


def encode_wait_reasons(reasons: Sequence[WaitReason], *, compressed: bool) -> bytes:
    """A job's wait reasons as etcd keeps them: their JSON list, `compressed` or not
    (`WAITS_ZLIB_LEVEL`); `waits_from_json` reads both.

    This release reads the compressed form and writes it only when the server is told to
    (`gpufed serve --compress-wait-reasons`): a server of the release before reads only the list,
    and a leader of it that met a compressed value would fail its every cycle (its list of the
    stored reasons raises). So the form follows docs/deploy.md's read-ahead rule: written only once
    no server of an earlier release is left, and by default from the next release on."""
    listed = _dumps([wait_to_dict(r) for r in reasons])
    return zlib.compress(listed, WAITS_ZLIB_LEVEL) if compressed else listed


def waits_from_json(raw: bytes | str) -> tuple[WaitReason, ...]:
    """A job's stored wait reasons: a JSON list of `wait_to_dict`s, as SQL keeps them and etcd did
    before they were compressed (a list: unversioned), or that list compressed (`encode_wait_reasons`)."""
    if isinstance(raw, bytes) and raw[:1] != b"[":
        try:
            raw = zlib.decompress(raw)
        except zlib.error as e:
            raise ValueError(f"stored wait reasons are neither a JSON list nor compressed: {e}") from e
    return tuple(wait_from_dict(d) for d in json.loads(raw))


class KvStore:
    """JobStore over any KeyValueStore."""

    def __init__(self, kv: KeyValueStore, *, compress_wait_reasons: bool = False) -> None:
        self._kv = kv
        # Whether wait reasons are written compressed (`encode_wait_reasons`).
        self.compress_wait_reasons = compress_wait_reasons
        # Submissions, admissions and transitions are independent transactions: under load they
        # share etcd requests instead of paying a round trip each.
        self._group = GroupCommit(kv)
        # The job records this process wrote, by key, until its watch shows them (`_written`).
        self._written = WrittenRecords()

    @property
    def kv(self) -> KeyValueStore:
        return self._kv

    # ---- jobs

    async def create_job(
        self, job: JobRecord, *, idempotency_key: str, manifest_digest: str
    ) -> tuple[Stored[JobRecord], bool]:
        digest = idempotency_digest(idempotency_key)
        idem = idempotency_key_of(job.tenant, digest)
        # The record names its key, so that the archiver removes it by name (a listing of the
        # tenant's keys grew with its live jobs). A caller that named it already is not copied.
        if job.idempotency_digest != digest:
            job = replace(job, idempotency_digest=digest)
        key = job_key(job.job_id)
        value = _dumps(job_to_dict(job))
        self._written.add(key, value, job)
        result = await self._written.settled(
            self._group.run(
                Txn(
                    (Compare.absent(idem), Compare.absent(key)),
                    (Put(idem, _dumps({"job_id": job.job_id, "digest": manifest_digest})), Put(key, value)),
                    (Get(idem), Get(key)),
                )
            ),
            ((key, value),),
        )
        if result.succeeded:
            return Stored(job, result.revision), True
        idem_kv, job_kv = result.gets
        if idem_kv is None:
            raise JobIdTaken(f"job {job.job_id} already exists under another idempotency key")
        first = loads(idem_kv.value, idem_kv.key)
        if first["digest"] != manifest_digest:
            raise IdempotencyConflict(
                f"idempotency key {idempotency_key!r} was used before with a different manifest "
                f"(job {first['job_id']})"
            )
        if first["job_id"] != job.job_id:
            job_kv = await self._kv.get(job_key(first["job_id"]))
        if job_kv is None:
            raise NotFound(f"job {first['job_id']} of idempotency key {idempotency_key!r} no longer exists")
        return _stored_job(job_kv.value, job_kv.mod_revision, job_kv.key), False

    async def get_job(self, job_id: JobId) -> Stored[JobRecord] | None:
        kv = await self._kv.get(job_key(job_id))
        return None if kv is None else _stored_job(kv.value, kv.mod_revision, kv.key)

    async def list_jobs(self) -> tuple[list[Stored[JobRecord]], int]:
        return await self._list(JOBS, lambda kv: _stored_job(kv.value, kv.mod_revision, kv.key))

    async def list_job_entries(self) -> tuple[list[JobEntry], int]:
        entries, revision = await self._list(JOBS, _job_entry)
        return [e for e in entries if e is not None], revision

    async def _list(self, prefix: bytes, decode: Callable[[KeyValue], T]) -> tuple[list[T], int]:
        """Every value under prefix, page by page, all read at the revision of the first page.

        A restart lists every job and interval in etcd (100,000 of each at a busy federation) before
        it serves, so this is on the restart's critical path: pages grow by size and the next is
        asked for before this one is decoded (`federation.store.kv_pages`), and the cyclic garbage
        collector is held off while the records are built (`paused_gc`)."""
        for attempt in range(_LIST_ATTEMPTS):
            try:
                with paused_gc():
                    return await self._list_once(prefix, decode)
            except WatchCompacted:
                if attempt == _LIST_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    async def _list_once(self, prefix: bytes, decode: Callable[[KeyValue], T]) -> tuple[list[T], int]:
        out: list[T] = []
        revision = 0
        async with contextlib.aclosing(pages(self._kv, prefix)) as listing:
            async for page, read_at in listing:
                out.extend(map(decode, page))
                revision = read_at
        return out, revision

    async def commit(
        self,
        updates: Sequence[tuple[JobRecord, int]],
        *,
        fence: Fence | None = None,
        ledger: Sequence[LedgerInterval] = (),
    ) -> int | None:
        if len(updates) + len(ledger) > MAX_COMMIT_UPDATES:
            raise ValueError(f"{len(updates)} updates in one commit; etcd allows {MAX_COMMIT_UPDATES}")
        compares = [Compare.mod_revision_is(job_key(job.job_id), rev) for job, rev in updates]
        if fence is not None:
            compares.append(fence.compare())
        records = tuple((job_key(job.job_id), _dumps(job_to_dict(job)), job) for job, _ in updates)
        for key, value, job in records:
            self._written.add(key, value, job)
        puts = tuple(Put(key, value) for key, value, _ in records) + tuple(
            # Ledger entries ride in the transition's own transaction: written exactly once, with it.
            Put(iv.key, _dumps(interval_to_dict(iv)))
            for iv in ledger
        )
        result = await self._written.settled(
            self._group.run(Txn(tuple(compares), puts)), tuple((key, value) for key, value, _ in records)
        )
        return result.revision if result.succeeded else None

    async def list_ledger(self) -> tuple[list[LedgerInterval], int]:
        return await self._list(LEDGER_PREFIX, lambda kv: interval_from_json(kv.value, kv.key))

    async def list_ledger_by_key(self) -> tuple[dict[bytes, LedgerInterval], int]:
        pairs, revision = await self._list(
            LEDGER_PREFIX, lambda kv: (kv.key, interval_from_json(kv.value, kv.key))
        )
        return dict(pairs), revision

    async def watch_ledger(
        self, *, start_revision: int
    ) -> AsyncGenerator[LedgerInterval | LedgerRemoved, None]:
        events = self._kv.watch_prefix(LEDGER_PREFIX, start_revision=start_revision)
        async with contextlib.aclosing(events):
            async for ev in events:
                if ev.type is EventType.PUT:
                    yield interval_from_json(ev.kv.value, ev.kv.key)
                else:
                    yield LedgerRemoved(ev.kv.key)

    async def watch_jobs(self, *, start_revision: int) -> AsyncGenerator[JobEvent, None]:
        events = self._kv.watch_prefix(JOBS, start_revision=start_revision)
        async with contextlib.aclosing(events):
            async for ev in events:
                job_id = JobId(ev.kv.key[len(JOBS) :].decode())
                if ev.type is EventType.PUT:
                    # A record this process wrote is the one it holds: not decoded again.
                    mine = self._written.take(ev.kv.key, ev.kv.value)
                    if mine is not None:
                        yield JobEvent(JobEventType.PUT, job_id, mine, ev.kv.mod_revision)
                        continue
                    try:
                        job = job_from_json(ev.kv.value, ev.kv.key)
                    except SchemaTooNew as e:
                        # As the list leaves it out (`_job_entry`): gone from the cache's view.
                        _refused(e)
                        yield JobEvent(JobEventType.DELETE, job_id, None, ev.kv.mod_revision)
                        continue
                    yield JobEvent(JobEventType.PUT, job_id, job, ev.kv.mod_revision)
                else:
                    self._written.forget(ev.kv.key)
                    yield JobEvent(JobEventType.DELETE, job_id, None, ev.kv.mod_revision)

    # ---- why jobs wait (written by the scheduler each cycle, read by `gpufed describe`)

    async def put_wait_reasons(
        self, job_id: JobId, reasons: Sequence[WaitReason], *, fence: Fence | None = None
    ) -> None:
        """Replace the job's wait reasons; none deletes them. With a fence, raises NotLeader if it fails."""
        key = WAITS + job_id.encode()
        if fence is None:
            if reasons:
                await self._kv.put(key, encode_wait_reasons(reasons, compressed=self.compress_wait_reasons))
            else:
                await self._kv.delete(key)
            return
        op = (
            Put(key, encode_wait_reasons(reasons, compressed=self.compress_wait_reasons))
            if reasons
            else Delete(key)
        )
        result = await self._group.run(Txn((fence.compare(),), (op,)))
        if not result.succeeded:
            raise NotLeader(
                f"leader key {fence.key!r} is no longer ours; wait reasons of {job_id} not written"
            )

    async def put_encoded_wait_reasons(
        self, values: Sequence[tuple[JobId, bytes | None]], *, fence: Fence | None = None
    ) -> None:
        """Several jobs' wait reasons (`encode_wait_reasons`; None deletes them) in one transaction,
        fenced: at most WAIT_WRITES_PER_TXN (`cut_wait_writes` cuts a longer list). One write per job
        was one nested transaction each in the group commit, and most of a deep queue's first pass.
        With a fence, raises NotLeader if it fails (nothing is written)."""
        if len(values) > WAIT_WRITES_PER_TXN:
            raise ValueError(f"{len(values)} jobs' wait reasons in one write; at most {WAIT_WRITES_PER_TXN}")
        if not values:
            return
        ops = tuple(
            Delete(WAITS + job_id.encode()) if value is None else Put(WAITS + job_id.encode(), value)
            for job_id, value in values
        )
        result = await self._group.run(Txn(() if fence is None else (fence.compare(),), ops))
        if not result.succeeded:
            assert fence is not None  # nothing else is compared
            raise NotLeader(
                f"leader key {fence.key!r} is no longer ours; wait reasons of {len(values)} jobs not written"
            )

    async def get_wait_reasons(self, job_id: JobId) -> tuple[WaitReason, ...]:
        kv = await self._kv.get(WAITS + job_id.encode())
        return () if kv is None else waits_from_json(kv.value)

    async def list_wait_reasons(self) -> dict[JobId, tuple[WaitReason, ...]]:
        # Jobs that wait for the same reasons have the same stored bytes: decoded once and shared,
        # so that a new leader holds one tuple per distinct wait, not 50 reasons per queued job.
        decoded: dict[bytes, tuple[WaitReason, ...]] = {}

        def decode(kv: KeyValue) -> tuple[JobId, tuple[WaitReason, ...]]:
            reasons = decoded.get(kv.value)
            if reasons is None:
                reasons = decoded[kv.value] = waits_from_json(kv.value)
            return JobId(kv.key[len(WAITS) :].decode()), reasons

        pairs, _ = await self._list(WAITS, decode)
        return dict(pairs)

    # ---- configuration

    async def _get(self, key: bytes, decode: Callable[[dict[str, Any]], T]) -> T | None:
        kv = await self._kv.get(key)
        return None if kv is None else decode(loads(kv.value, kv.key))

    async def _list_values(self, prefix: bytes, decode: Callable[[dict[str, Any]], T]) -> list[T]:
        values, _ = await self._list(prefix, lambda kv: decode(loads(kv.value, kv.key)))
        return values

    async def put_tenant(self, t: TenantRecord) -> None:
        await self._kv.put(TENANTS + t.name.encode(), _dumps(tenant_to_dict(t)))

    async def get_tenant(self, name: str) -> TenantRecord | None:
        return await self._get(TENANTS + name.encode(), tenant_from_dict)

    async def list_tenants(self) -> list[TenantRecord]:
        return await self._list_values(TENANTS, tenant_from_dict)

    async def delete_tenant(self, name: str) -> bool:
        return await self._kv.delete(TENANTS + name.encode())

    async def put_cluster(self, c: ClusterRecord) -> None:
        await self._kv.put(CLUSTERS + c.name.encode(), _dumps(cluster_to_dict(c)))

    async def get_cluster(self, name: str) -> ClusterRecord | None:
        return await self._get(CLUSTERS + name.encode(), cluster_from_dict)

    async def list_clusters(self) -> list[ClusterRecord]:
        return await self._list_values(CLUSTERS, cluster_from_dict)

    async def put_user(self, u: UserRecord) -> None:
        await self._kv.put(USERS + u.name.encode(), _dumps(user_to_dict(u)))

    async def get_user(self, name: str) -> UserRecord | None:
        return await self._get(USERS + name.encode(), user_from_dict)

    async def list_users(self) -> list[UserRecord]:
        return await self._list_values(USERS, user_from_dict)

    async def put_approval(self, a: ApprovalRecord) -> None:
        await self._kv.put(APPROVALS + a.approval_id.encode(), _dumps(approval_to_dict(a)))

    async def list_approvals(self) -> list[ApprovalRecord]:
        return await self._list_values(APPROVALS, approval_from_dict)

    async def delete_approval(self, approval_id: str) -> bool:
        return await self._kv.delete(APPROVALS + approval_id.encode())

    async def put_settings(self, s: SchedulingSettings) -> None:
        await self._kv.put(SETTINGS_KEY, _dumps(settings_to_dict(s)))

    async def get_settings(self) -> SchedulingSettings:
        stored = await self._get(SETTINGS_KEY, settings_from_dict)
        return stored if stored is not None else SchedulingSettings()

    # ---- API tokens: the token itself never reaches the store, so a copy of etcd holds no credential

    async def put_token(self, token: str, user: str) -> None:
        await self._kv.put(TOKENS + _sha256(token), _dumps({"user": user}))

    async def resolve_token(self, token: str) -> UserRecord | None:
        """The token's user as stored now, so a changed role or tenant applies at once."""
        kv = await self._kv.get(TOKENS + _sha256(token))
        if kv is None:
            return None
        record = loads(kv.value, kv.key)
        expires = record.get("expires_at_s")
        if expires is not None and float(expires) <= time.time():
            return None
        return await self.get_user(record["user"])

    async def revoke_token(self, token: str) -> bool:
        return await self._kv.delete(TOKENS + _sha256(token))


def InMemoryJobStore(kv: MemoryKv | None = None) -> KvStore:  # noqa: N802 - reads as the fake's class name
    """The in-memory JobStore for unit tests: the real KvStore over a MemoryKv."""
    return KvStore(kv if kv is not None else MemoryKv())
