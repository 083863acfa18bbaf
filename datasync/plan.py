"""The diff: what a sync must copy and delete, from one listing of the target, its marker and the journal.

No HEAD per object. An object is up to date when the target lists it with the size and ETag recorded
when its sha256 was last verified (in the marker, or in the journal of a killed run) and that sha256 is
the manifest's. Anything else in the manifest is copied. Deletion rule: an object the marker says a sync
wrote, that the new manifest no longer lists, is deleted; objects under the prefix that no sync wrote are
never touched. The plan is a value, so the caller can show its size and egress cost before running it.
"""

from __future__ import annotations

from dataclasses import dataclass

from datasync.journal import Journal, JournalState
from datasync.manifest import is_internal
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

    @property
    def copy_bytes(self) -> int:
        return sum(e.size_bytes for e in self.to_copy)

    @property
    def is_noop(self) -> bool:
        return not self.to_copy and not self.to_delete

    def egress(self, usd_per_gb: float) -> EgressEstimate:
        """Bytes that cross between the two stores (none for a server-side copy) priced at `usd_per_gb`."""
        return EgressEstimate(0 if self.server_side else self.copy_bytes, usd_per_gb)


def _with_slash(prefix: str) -> str:
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def diff(
    manifest: Manifest,
    listing: dict[str, ObjectMeta],
    marker: SyncState | None,
    journal: JournalState,
) -> tuple[list[ManifestEntry], dict[str, VerifiedObject], list[str]]:
    """(to copy, up to date, to delete) with `listing` keyed by path relative to the target prefix."""
    verified = dict(marker.objects) if marker is not None else {}
    verified.update(journal.finished)
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
    written = set(marker.objects) if marker is not None else set()
    to_delete = sorted(p for p in written if p not in wanted and p in listing)
    return to_copy, up_to_date, to_delete


async def plan_sync(
    source: ObjectStore,
    source_prefix: str,
    target: ObjectStore,
    target_prefix: str,
    manifest: Manifest,
    *,
    journal: Journal | None = None,
) -> SyncPlan:
    """List the target once, read its marker once, and diff against the manifest."""
    source_prefix, target_prefix = _with_slash(source_prefix), _with_slash(target_prefix)
    listing: dict[str, ObjectMeta] = {}
    async for page in target.list_prefix(target_prefix):
        for meta in page:
            rel = meta.path[len(target_prefix) :]
            if not is_internal(rel):
                listing[rel] = meta
    marker = await read_marker(target, target_prefix)
    resume = journal.state() if journal is not None else JournalState()
    to_copy, up_to_date, to_delete = diff(manifest, listing, marker, resume)
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
    )
