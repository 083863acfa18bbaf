"""The diff: what a sync must copy, reuse and delete, from the expected manifest and a listing of the target.

No HEAD per object. An object is up to date when the target lists it with the manifest's size and the
ETag recorded when its sha256 was verified, and the record is one we trust: `recorded_etags` (kept by the
caller, in etcd, from the `SyncReport` of a verified sync) or the journal of a killed run (a file in our
own state dir). The target's marker is only a hint: anyone who can write the bucket can write it, so an
object only the marker vouches for is re-read and hashed at the target while planning (no egress) before
it counts as up to date. Anything else in the manifest is copied, or, when `reuse` names a copy of
another version in the same target store holding the same content, copied server-side from it.
Deletion rule: an object a sync wrote (per the record, else the marker) that the new manifest no longer
lists is deleted; others under the prefix are never touched. The plan is a value, so the caller can
show its size and egress cost before running it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from datasync.errors import DatasyncError
from datasync.journal import Journal, JournalState
from datasync.manifest import is_internal, sha256_of
from datasync.marker import SyncState, VerifiedObject, normalize_etag, read_marker
from datasync.model import Manifest, ManifestEntry
from datasync.store import ObjectMeta, ObjectStore

_BYTES_PER_GB = 1e9


@dataclass(frozen=True, slots=True)
class EgressEstimate:
    bytes_crossing: int
    usd_per_gb: float

    @property
    def usd(self) -> float:
        return self.bytes_crossing / _BYTES_PER_GB * self.usd_per_gb


@dataclass(frozen=True, slots=True)
class ExistingCopy:
    """A copy of some version already in the target store: its prefix, its manifest and, when the caller
    recorded them, the ETags its objects had when verified (then an object listed with another ETag is
    not reused). A reused object is verified again once copied, so a wrong record costs a fallback to
    copying from the source, never a wrong object."""

    prefix: str
    manifest: Manifest
    etags: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class ReuseItem:
    """Copy `entry` server-side from `from_path` (a full key in the target store, same content)."""

    entry: ManifestEntry
    from_path: str
    from_etag: str | None


@dataclass(frozen=True, slots=True)
class SyncPlan:
    source_prefix: str
    target_prefix: str
    manifest_digest: str
    to_copy: tuple[ManifestEntry, ...]
    up_to_date: dict[str, VerifiedObject]
    to_delete: tuple[str, ...]
    server_side: bool
    total_bytes: int
    total_objects: int
    resume: JournalState
    to_reuse: tuple[ReuseItem, ...] = ()

    @property
    def copy_bytes(self) -> int:
        """Bytes to copy from the source (the ones that cross to the target on a cross-store sync)."""
        return sum(e.size_bytes for e in self.to_copy)

    @property
    def reuse_bytes(self) -> int:
        return sum(r.entry.size_bytes for r in self.to_reuse)

    @property
    def is_noop(self) -> bool:
        return not self.to_copy and not self.to_delete and not self.to_reuse

    @property
    def verified_etags(self) -> dict[str, str]:
        """path -> ETag of the objects already up to date (what the caller records for the next plan)."""
        return {p: o.etag for p, o in self.up_to_date.items() if o.etag is not None}

    def egress(self, usd_per_gb: float) -> EgressEstimate:
        """Bytes that cross between the two stores (none for a server-side copy) priced at `usd_per_gb`."""
        return EgressEstimate(0 if self.server_side else self.copy_bytes, usd_per_gb)


def _with_slash(prefix: str) -> str:
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def recorded_objects(manifest: Manifest, recorded_etags: Mapping[str, str]) -> dict[str, VerifiedObject]:
    """The caller's record (path -> ETag of a verified copy of this manifest) as verified objects."""
    wanted = manifest.by_path()
    return {
        p: VerifiedObject(wanted[p].size_bytes, normalize_etag(etag), wanted[p].sha256)
        for p, etag in recorded_etags.items()
        if p in wanted
    }


def diff(
    manifest: Manifest,
    listing: dict[str, ObjectMeta],
    marker: SyncState | None,
    journal: JournalState,
    recorded_etags: Mapping[str, str] | None = None,
) -> tuple[list[ManifestEntry], dict[str, VerifiedObject], list[str]]:
    """(to copy, up to date per some record, to delete) with `listing` keyed by path relative to the
    target prefix. Records: the marker's claims, then the journal, then the caller's (later ones win);
    `unconfirmed` tells which of the up-to-date ones only the marker vouches for."""
    verified = dict(marker.objects) if marker is not None else {}
    verified.update(journal.finished)
    if recorded_etags is not None:
        verified.update(recorded_objects(manifest, recorded_etags))
    to_copy: list[ManifestEntry] = []
    up_to_date: dict[str, VerifiedObject] = {}
    for entry in manifest.entries:
        seen, known = listing.get(entry.path), verified.get(entry.path)
        if (
            seen is not None
            and known is not None
            and known.sha256 == entry.sha256
            and known.size_bytes == entry.size_bytes == seen.size_bytes
            and known.etag is not None
            and known.etag == normalize_etag(seen.etag)
        ):
            up_to_date[entry.path] = known
        else:
            to_copy.append(entry)
    wanted = manifest.by_path()
    if recorded_etags is not None:
        written = set(recorded_etags)
    else:
        written = set(marker.objects) if marker is not None else set()
    to_delete = sorted(p for p in written if p not in wanted and p in listing)
    return to_copy, up_to_date, to_delete


def unconfirmed(
    up_to_date: Mapping[str, VerifiedObject],
    journal: JournalState,
    recorded_etags: Mapping[str, str] | None,
) -> list[str]:
    """Paths that only the marker vouches for: neither the caller's record nor our journal has them
    with the ETag the target lists now."""
    out = []
    for path, obj in up_to_date.items():
        by_journal = journal.finished.get(path)
        if by_journal is not None and by_journal == obj:
            continue
        if recorded_etags is not None and normalize_etag(recorded_etags.get(path)) == obj.etag:
            continue
        out.append(path)
    return sorted(out)


def plan_reuse(
    to_copy: Sequence[ManifestEntry],
    candidates: Mapping[tuple[str, int], tuple[str, str | None]],
) -> tuple[list[ManifestEntry], list[ReuseItem]]:
    """Split `to_copy` into (still to copy from the source, to copy server-side from an existing copy).
    `candidates` maps (sha256, size) to a full key in the target store and its listed ETag."""
    left: list[ManifestEntry] = []
    reuse: list[ReuseItem] = []
    for entry in to_copy:
        found = candidates.get((entry.sha256, entry.size_bytes))
        if found is None:
            left.append(entry)
        else:
            reuse.append(ReuseItem(entry, found[0], found[1]))
    return left, reuse


async def _list_relative(store: ObjectStore, prefix: str) -> dict[str, ObjectMeta]:
    listing: dict[str, ObjectMeta] = {}
    async for page in store.list_prefix(prefix):
        for meta in page:
            rel = meta.path[len(prefix) :]
            if not is_internal(rel):
                listing[rel] = meta
    return listing


async def reuse_candidates(
    target: ObjectStore, copies: Sequence[ExistingCopy]
) -> dict[tuple[str, int], tuple[str, str | None]]:
    """(sha256, size) -> (key, ETag) of objects the existing copies hold, each copy listed once: an object
    counts only if listed with its manifest's size (and, when recorded, its recorded ETag)."""
    out: dict[tuple[str, int], tuple[str, str | None]] = {}
    for copy in copies:
        prefix = _with_slash(copy.prefix)
        listing = await _list_relative(target, prefix)
        for entry in copy.manifest.entries:
            meta = listing.get(entry.path)
            if meta is None or meta.size_bytes != entry.size_bytes:
                continue
            etag = normalize_etag(meta.etag)
            if copy.etags is not None and normalize_etag(copy.etags.get(entry.path)) != etag:
                continue
            out.setdefault((entry.sha256, entry.size_bytes), (prefix + entry.path, etag))
    return out


async def _confirm(
    target: ObjectStore,
    prefix: str,
    manifest: Manifest,
    paths: Sequence[str],
    concurrency: int,
) -> set[str]:
    """The paths whose bytes at the target hash to the manifest's sha256 (read at the target only)."""
    wanted = manifest.by_path()
    slots = asyncio.Semaphore(concurrency)
    good: set[str] = set()

    async def one(path: str) -> None:
        entry = wanted[path]
        async with slots:
            try:
                digest = await sha256_of(target, prefix + path, entry.size_bytes)
            except DatasyncError:
                return
        if digest == entry.sha256:
            good.add(path)

    await asyncio.gather(*(one(p) for p in paths))
    return good


async def plan_sync(
    source: ObjectStore,
    source_prefix: str,
    target: ObjectStore,
    target_prefix: str,
    manifest: Manifest,
    *,
    journal: Journal | None = None,
    recorded_etags: Mapping[str, str] | None = None,
    reuse: Sequence[ExistingCopy] = (),
    confirm_concurrency: int = 16,
) -> SyncPlan:
    """List the target once and diff against `manifest` (the expected content, from etcd).

    `recorded_etags`: path -> ETag of this version's copy at `target_prefix` as last verified (the
    `SyncReport.verified_etags` the caller stored). Objects the target's marker vouches for but the
    record does not are re-hashed at the target before they count. `reuse`: copies of other versions in
    the target store; objects with the same content are copied from them server-side."""
    source_prefix, target_prefix = _with_slash(source_prefix), _with_slash(target_prefix)
    listing = await _list_relative(target, target_prefix)
    # With the caller's record the marker adds nothing (it is a hint for when there is no record).
    marker = await read_marker(target, target_prefix) if recorded_etags is None else None
    resume = journal.state() if journal is not None else JournalState()
    to_copy, up_to_date, to_delete = diff(manifest, listing, marker, resume, recorded_etags)
    hinted = unconfirmed(up_to_date, resume, recorded_etags)
    if hinted:
        good = await _confirm(target, target_prefix, manifest, hinted, confirm_concurrency)
        wanted = manifest.by_path()
        for path in hinted:
            if path not in good:
                del up_to_date[path]
                to_copy.append(wanted[path])
    to_reuse: list[ReuseItem] = []
    if reuse and to_copy and target.can_copy_from(target):
        to_copy, to_reuse = plan_reuse(to_copy, await reuse_candidates(target, reuse))
    # Large objects first, so the run does not end waiting on one big transfer started last.
    to_copy.sort(key=lambda e: (-e.size_bytes, e.path))
    return SyncPlan(
        source_prefix=source_prefix,
        target_prefix=target_prefix,
        manifest_digest=manifest.digest,
        to_copy=tuple(to_copy),
        up_to_date=up_to_date,
        to_delete=tuple(to_delete),
        server_side=target.can_copy_from(source),
        total_bytes=manifest.total_size_bytes,
        total_objects=manifest.object_count,
        resume=resume,
        to_reuse=tuple(to_reuse),
    )
