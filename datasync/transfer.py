"""Copying objects: one GET and PUT, a multipart upload that resumes part by part, or a server-side copy.

Every copy is verified before it counts, whatever its size. Bytes that pass through this process are
hashed on the way and must give the manifest's sha256 (else the source changed: a permanent error). Then
the target must prove it holds them: its ETag must be exactly the one the upload implies (the MD5 of a
single PUT, `md5(part MD5s)-N` of our multipart upload). An MD5-shaped ETag that differs fails the copy;
an ETag that proves nothing (none, an opaque token, or a multipart ETag of parts the store chose itself)
means the object is read back from the target and hashed. Verification is never skipped. A
server-side copy (from the source's endpoint, or from another version's copy in the target store) moves
no bytes through us, so it is read back from the target and hashed. `readback=True` reads back every
copy. Memory is bounded by one budget of `max_buffered_bytes`: a whole object between its GET and its
PUT holds its size, a multipart part holds its length from before its GET until its upload is done
(parts read ahead only from what is free), so bodies in flight never exceed it together (one object
larger than the budget holds all of it and runs alone). Issue 36: there were two budgets of that size,
one for parts and one for whole objects, which let twice the bound be held.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from datasync.errors import DatasyncError, ObjectNotFound, SourceChanged, VerificationFailed
from datasync.journal import Journal, JournalState
from datasync.manifest import sha256_of
from datasync.marker import VerifiedObject, normalize_etag
from datasync.model import ManifestEntry
from datasync.plan import ReuseItem
from datasync.progress import ProgressTracker
from datasync.store import Blob, ObjectStore, PartInfo
from datasync.throttle import ByteBudget, Retrier, RetryPolicy, TokenBucket

_log = structlog.get_logger(__name__)
_MD5 = re.compile(r"^[0-9a-f]{32}$")
_MULTIPART = re.compile(r"^[0-9a-f]{32}-\d+$")
_MIB = 1024 * 1024
# Parts of one object fetched at once: the one being hashed and the next two.
_LOOKAHEAD_PARTS = 3

_Item = TypeVar("_Item")


def is_folder_marker(path: str) -> bool:
    """A key ending in "/": the zero-byte object the S3 console and many tools create for a folder."""
    return path.endswith("/")


def folder_marker_phases(items: Iterable[_Item], path: Callable[[_Item], str]) -> list[list[_Item]]:
    """The order to write `items` in so that every folder marker (a key ending in "/") is written before
    anything under it: the markers by depth, shallowest first, then everything else, each phase
    finished before the next starts.

    Why: a store that keeps folders as real directories (SeaweedFS's filer) makes the parent directory
    of `folder/inside.txt` implicitly. A PUT of `folder/` in flight at the same time can lose to that
    implicit directory: the marker still answers a GET but is left out of every listing, so the copy
    would not list what the source lists (2 of 200 concurrent pairs on SeaweedFS here). Written first,
    the marker's directory exists before any child needs it. Markers are zero bytes, so the extra
    phases cost a few round trips, not throughput."""
    markers: dict[int, list[_Item]] = {}
    rest: list[_Item] = []
    for item in items:
        key = path(item)
        if is_folder_marker(key):
            markers.setdefault(key.count("/"), []).append(item)
        else:
            rest.append(item)
    return [*(markers[depth] for depth in sorted(markers)), *([rest] if rest else [])]


async def _pool(phases: list[list[_Item]], width: int, handle: Callable[[_Item], Awaitable[None]]) -> None:
    """`handle` over each phase by `width` workers, one phase after the other."""

    async def worker(work: Iterator[_Item]) -> None:
        for item in work:
            await handle(item)

    for phase in phases:
        work = iter(phase)  # shared by the phase's workers: each takes the next item
        await asyncio.gather(*(worker(work) for _ in range(min(width, len(phase)))))


@dataclass(frozen=True, slots=True)
class SyncOptions:
    # 64 in flight measured no better than 32 on 20,000 x 4 KiB (bench/datasync.py, docs/datasync.md).
    concurrency: int = 32
    multipart_threshold_bytes: int = 32 * _MIB
    part_size_bytes: int = 16 * _MIB
    max_buffered_bytes: int = 256 * _MIB
    bandwidth_bytes_per_s: float | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    readback: bool = False
    delete_removed: bool = True
    progress_interval_s: float = 0.5


@dataclass
class TransferStats:
    objects_copied: int = 0
    bytes_read: int = 0
    bytes_uploaded: int = 0
    objects_put: int = 0
    parts_uploaded: int = 0
    parts_reused: int = 0
    server_side_copies: int = 0
    retries: int = 0
    objects_reused: int = 0
    bytes_reused: int = 0
    bytes_resumed: int = 0
    bytes_server_copied: int = 0
    readbacks: int = 0
    verified: dict[str, VerifiedObject] = field(default_factory=dict)
    failures: list[tuple[str, DatasyncError]] = field(default_factory=list)

    _COUNTERS = (
        "objects_copied",
        "bytes_read",
        "bytes_uploaded",
        "objects_put",
        "parts_uploaded",
        "objects_reused",
        "bytes_reused",
        "bytes_resumed",
        "bytes_server_copied",
        "readbacks",
    )

    def merge(self, other: TransferStats) -> None:
        for name in self._COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.parts_reused += other.parts_reused
        self.server_side_copies += other.server_side_copies
        self.retries += other.retries
        self.verified.update(other.verified)
        self.failures.extend(other.failures)


def _check_etag(etag: str | None, expected: str, what: str) -> None:
    """Fail when the store's ETag is of the comparable kind and differs from what we sent."""
    tag = normalize_etag(etag)
    if tag is not None and (_MD5.match(tag) or _MULTIPART.match(tag)) and tag != expected:
        raise VerificationFailed(f"{what}: target ETag {tag} differs from the {expected} sent")


def etag_proves(etag: str | None, expected: str, what: str) -> bool:
    """True when the target's ETag is exactly `expected` (the upload is proven); raises when it is of
    `expected`'s kind and differs (the target holds other bytes); False when it cannot tell, and the
    caller must read the object back. A plain MD5 where a multipart one was expected (or the reverse)
    cannot tell: the store may have assembled the object its own way."""
    tag = normalize_etag(etag)
    if tag == expected:
        return True
    if tag is None:
        return False
    same_kind = bool(_MD5.match(tag)) if _MD5.match(expected) else bool(_MULTIPART.match(tag))
    if same_kind and (_MD5.match(tag) or tag.rsplit("-", 1)[1] == expected.rsplit("-", 1)[1]):
        raise VerificationFailed(f"{what}: target ETag {tag} differs from the {expected} sent")
    return False


def _md5(data: Blob) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).digest()


def _hash_part(sha: hashlib._Hash, data: Blob) -> bytes:
    """Feed the object's sha256 and return the part's MD5: one thread hop per part (both release the GIL)."""
    sha.update(data)
    return hashlib.md5(data, usedforsecurity=False).digest()


def _digests(data: Blob) -> tuple[bytes, bytes]:
    return hashlib.sha256(data).digest(), hashlib.md5(data, usedforsecurity=False).digest()


class Copier:
    """Copies manifest entries from `source` to `target`; one instance per run (or per Ray shard)."""

    def __init__(
        self,
        source: ObjectStore,
        source_prefix: str,
        target: ObjectStore,
        target_prefix: str,
        *,
        options: SyncOptions,
        journal: Journal,
        resume: JournalState,
        tracker: ProgressTracker,
    ) -> None:
        self.source, self.target = source, target
        self.source_prefix, self.target_prefix = source_prefix, target_prefix
        self.options = options
        self.journal = journal
        self.resume = resume
        self.tracker = tracker
        self.stats = TransferStats()
        self._retry = Retrier(options.retry)
        self._bucket = (
            TokenBucket(options.bandwidth_bytes_per_s, max(options.bandwidth_bytes_per_s / 4, 64 * 1024))
            if options.bandwidth_bytes_per_s
            else None
        )
        # The one bound on bodies in flight: whole objects (one GET and PUT) and multipart parts alike.
        self.budget = ByteBudget(options.max_buffered_bytes)
        self._server_side = target.can_copy_from(source)

    async def run(self, entries: Iterable[ManifestEntry]) -> TransferStats:
        async def one(entry: ManifestEntry) -> None:
            try:
                obj = await self.copy(entry)
            except DatasyncError as e:
                _log.warning("object_sync_failed", path=entry.path, error=str(e), retryable=e.retryable)
                self.stats.failures.append((entry.path, e))
                self.tracker.object_failed()
                return
            self.stats.verified[entry.path] = obj
            self.stats.objects_copied += 1
            self.tracker.object_done()
            self.journal.object_finished(entry.path, obj)

        await _pool(folder_marker_phases(entries, lambda e: e.path), self.options.concurrency, one)
        self.stats.retries = self._retry.retries
        return self.stats

    async def reuse(self, items: Iterable[ReuseItem]) -> list[ManifestEntry]:
        """Server-side copies from existing copies in the target store; returns the entries that could
        not be reused (the caller copies those from the source instead)."""
        fallback: list[ManifestEntry] = []

        async def one(item: ReuseItem) -> None:
            dst = self.target_prefix + item.entry.path
            try:
                obj = await self._reuse_one(item, dst)
            except DatasyncError as e:
                _log.info("reuse_fell_back", path=item.entry.path, error=str(e))
                fallback.append(item.entry)
                return
            self.stats.verified[item.entry.path] = obj
            self.stats.objects_reused += 1
            self.stats.bytes_reused += item.entry.size_bytes
            self.tracker.add_reused(item.entry.size_bytes)
            self.tracker.object_done(reused=True)
            self.journal.object_finished(item.entry.path, obj)

        await _pool(folder_marker_phases(items, lambda i: i.entry.path), self.options.concurrency, one)
        self.stats.retries = self._retry.retries
        return fallback

    async def _reuse_one(self, item: ReuseItem, dst: str) -> VerifiedObject:
        """One server-side copy inside the target store, always read back and hashed: an equal ETag would
        not show bit rot in the copy it came from, and a reused object must not carry it into a new
        version. The read stays inside the target store (no egress). A bad copy is not retried here:
        the caller copies that object from the source instead."""
        etag = await self._retry(
            f"reuse {item.entry.path}",
            functools.partial(self.target.copy_from, self.target, item.from_path, dst),
        )
        self.stats.server_side_copies += 1
        return await self._readback(item.entry, dst, etag)

    async def copy(self, entry: ManifestEntry) -> VerifiedObject:
        src, dst = self.source_prefix + entry.path, self.target_prefix + entry.path
        if self._server_side:
            return await self._retry(f"copy {entry.path}", lambda: self._server_copy(entry, src, dst))
        if (
            entry.size_bytes > self.options.multipart_threshold_bytes
            and self.target.supports_resumable_multipart
        ):
            return await self._multipart(entry, src, dst)
        return await self._retry(f"put {entry.path}", lambda: self._single(entry, src, dst))

    async def _throttle(self, n: int) -> None:
        if self._bucket is not None:
            await self._bucket.acquire(n)

    async def _readback(self, entry: ManifestEntry, dst: str, etag: str | None) -> VerifiedObject:
        self.stats.readbacks += 1
        digest = await sha256_of(self.target, dst, entry.size_bytes)
        if digest != entry.sha256:
            raise VerificationFailed(
                f"{dst}: target sha256 {digest[:12]} is not the manifest's {entry.sha256[:12]}"
            )
        return VerifiedObject(entry.size_bytes, normalize_etag(etag), entry.sha256)

    async def _server_copy(self, entry: ManifestEntry, src: str, dst: str) -> VerifiedObject:
        etag = await self.target.copy_from(self.source, src, dst)
        self.stats.server_side_copies += 1
        obj = await self._readback(entry, dst, etag)
        self.stats.bytes_server_copied += entry.size_bytes
        self.tracker.add_server_copied(entry.size_bytes)
        return obj

    async def _single(self, entry: ManifestEntry, src: str, dst: str) -> VerifiedObject:
        cost = await self.budget.acquire(entry.size_bytes)
        try:
            return await self._single_held(entry, src, dst)
        finally:
            self.budget.release(cost)

    async def _single_held(self, entry: ManifestEntry, src: str, dst: str) -> VerifiedObject:
        data = await self.source.get(src)
        self.stats.bytes_read += len(data)
        if len(data) != entry.size_bytes:
            raise SourceChanged(f"{src}: {len(data)} bytes, the manifest says {entry.size_bytes}")
        sha, md5 = await asyncio.to_thread(_digests, data) if len(data) >= _MIB else _digests(data)
        if sha.hex() != entry.sha256:
            raise SourceChanged(f"{src}: content differs from the manifest (sha256 {sha.hex()[:12]})")
        await self._throttle(len(data))
        etag = await self.target.put(dst, data)
        self.stats.objects_put += 1
        self.stats.bytes_uploaded += len(data)
        if self.options.readback or not etag_proves(etag, md5.hex(), dst):
            obj = await self._readback(entry, dst, etag)
        else:
            obj = VerifiedObject(entry.size_bytes, normalize_etag(etag), entry.sha256)
        self.tracker.add_bytes(len(data))
        return obj

    async def _resumable_upload(self, entry: ManifestEntry, dst: str) -> tuple[str, dict[int, PartInfo]]:
        """The upload to continue (its id and the parts the target still holds), or a new one."""
        part_size = self.options.part_size_bytes
        state = self.resume.uploads.get(entry.path)
        if state is not None and state.part_size_bytes == part_size:
            try:
                held = await self._retry(
                    f"list parts {entry.path}", lambda: self.target.list_parts(dst, state.upload_id)
                )
            except ObjectNotFound:
                held = []
            by_number = {p.part_number: p for p in held}
            done = {
                n: p
                for n, p in state.parts.items()
                if n in by_number and normalize_etag(by_number[n].etag) == normalize_etag(p.etag)
            }
            if held:
                _log.info("upload_resumed", path=entry.path, parts_done=len(done))
                return state.upload_id, done
        if state is not None:
            # An upload we cannot continue (other part size, or the store dropped it): do not leave it
            # holding storage.
            with contextlib.suppress(DatasyncError):
                await self.target.abort_multipart(dst, state.upload_id)
        upload_id = await self._retry(
            f"create upload {entry.path}", lambda: self.target.create_multipart(dst)
        )
        self.journal.upload_started(entry.path, upload_id, part_size)
        return upload_id, {}

    async def _multipart(self, entry: ManifestEntry, src: str, dst: str) -> VerifiedObject:
        part_size = self.options.part_size_bytes
        upload_id, done = await self._resumable_upload(entry, dst)
        sha = hashlib.sha256()
        md5s: list[bytes] = []
        sent: list[asyncio.Task[PartInfo]] = []
        parts: dict[int, PartInfo] = {}
        ranges = [
            (index + 1, start, min(start + part_size, entry.size_bytes))
            for index, start in enumerate(range(0, entry.size_bytes, part_size))
        ]
        # The next parts' GETs run while this one is hashed and sent (the sha256 must go in order).
        # Each fetched part holds its length of the budget until its upload is done.
        fetches: dict[int, asyncio.Task[Blob]] = {}
        holding: dict[int, int] = {}  # part number -> the budget it holds, until `_send_part` takes it
        next_fetch = 0
        try:
            for number, _, _ in ranges:
                while next_fetch < len(ranges) and next_fetch < number + _LOOKAHEAD_PARTS:
                    ahead, start, end = ranges[next_fetch]
                    if ahead > number:
                        # Read ahead only from what is free now: waiting while holding could deadlock.
                        cost = self.budget.try_acquire(end - start)
                        if cost is None:
                            break
                    else:
                        cost = await self.budget.acquire(end - start)
                    holding[ahead] = cost
                    fetches[ahead] = asyncio.create_task(self._fetch_part(src, ahead, start, end))
                    next_fetch += 1
                data = await fetches.pop(number)
                self.stats.bytes_read += len(data)
                md5 = await asyncio.to_thread(_hash_part, sha, data)
                md5s.append(md5)
                reused = done.get(number)
                tag = normalize_etag(reused.etag) if reused is not None else None
                cost = holding.pop(number)
                if (
                    reused is not None
                    and reused.size_bytes == len(data)
                    and (not _MD5.match(tag or "") or tag == md5.hex())
                ):
                    self.budget.release(cost)
                    parts[number] = reused
                    self.stats.parts_reused += 1
                    self.stats.bytes_resumed += len(data)
                    self.tracker.add_resumed(len(data))
                    continue
                upload = asyncio.create_task(self._send_part(entry, dst, upload_id, number, data, md5))
                # Released when the upload ends, however it ends: a done callback runs even for a task
                # cancelled before it started (a `finally` inside it would not, and leak the bytes).
                upload.add_done_callback(functools.partial(self._release_part, cost))
                sent.append(upload)
            for part in await asyncio.gather(*sent):
                parts[part.part_number] = part
        except BaseException:
            for task in (*sent, *fetches.values()):
                task.cancel()
            await asyncio.gather(*sent, *fetches.values(), return_exceptions=True)
            for cost in holding.values():
                self.budget.release(cost)
            raise
        if sha.hexdigest() != entry.sha256:
            await self.target.abort_multipart(dst, upload_id)
            raise SourceChanged(f"{src}: content differs from the manifest (sha256 {sha.hexdigest()[:12]})")
        ordered = [parts[n] for n in sorted(parts)]
        etag = await self._retry(
            f"complete {entry.path}", lambda: self.target.complete_multipart(dst, upload_id, ordered)
        )
        expected = f"{hashlib.md5(b''.join(md5s), usedforsecurity=False).hexdigest()}-{len(md5s)}"
        if self.options.readback or not etag_proves(etag, expected, dst):
            return await self._readback(entry, dst, etag)
        return VerifiedObject(entry.size_bytes, normalize_etag(etag), entry.sha256)

    async def _fetch_part(self, src: str, number: int, start: int, end: int) -> Blob:
        data = await self._retry(
            f"get part {number} of {src}", functools.partial(self.source.get, src, start=start, end=end)
        )
        if len(data) != end - start:
            raise SourceChanged(f"{src}: part {number} has {len(data)} bytes, expected {end - start}")
        return data

    def _release_part(self, cost: int, _task: asyncio.Task[PartInfo]) -> None:
        self.budget.release(cost)

    async def _send_part(
        self, entry: ManifestEntry, dst: str, upload_id: str, number: int, data: Blob, md5: bytes
    ) -> PartInfo:
        await self._throttle(len(data))

        async def put() -> PartInfo:
            part = await self.target.put_part(dst, upload_id, number, data)
            _check_etag(part.etag, md5.hex(), f"{dst} part {number}")
            return part

        part = await self._retry(f"put part {number} of {entry.path}", put)
        self.stats.parts_uploaded += 1
        self.stats.bytes_uploaded += len(data)
        self.journal.part_finished(entry.path, upload_id, part)
        self.tracker.add_bytes(len(data))
        return part
