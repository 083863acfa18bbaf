"""Checking a copy later: cheaply against the record, fully by re-reading, and repairing what is bad.

A sync verifies each object as it copies it; these are the later checks that the copy is still intact
(bit rot, a tool or a third party that overwrote objects, a partial restore). Both are computed against
what the caller passes in (the manifest and the recorded ETags, from etcd), never against the target's
marker, which anyone who can write the bucket can edit:

- `check_copy`: one listing; every object must be listed with the manifest's size and the ETag recorded
  when it was verified. Finds deletions, overwrites and truncations; not bit rot under an unchanged ETag.
- `verify_copy` (`verify`): re-reads every object and compares its sha256 with the manifest's. Objects
  found bad are dropped from the marker too, so a planner without a record copies them again.
- `repair_copy`: copies the given objects again from the source, verified like any sync.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import structlog

from datasync.errors import ObjectNotFound, SourceChanged
from datasync.journal import JournalState
from datasync.manifest import is_internal, sha256_of
from datasync.marker import SyncState, VerifiedObject, normalize_etag, read_marker, write_marker
from datasync.model import Manifest, ManifestEntry
from datasync.plan import SyncPlan
from datasync.store import ObjectStore, list_all
from datasync.sync import SyncReport, run_sync
from datasync.transfer import SyncOptions

_log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class VerifyReport:
    objects_checked: int
    missing: tuple[str, ...]
    wrong_size: tuple[str, ...]
    wrong_hash: tuple[str, ...]
    # Objects under the copy's prefix that are not of the version (datasync's `.gpufed/` aside): a job
    # reading the directory would read them too. Not in `bad_paths` (nothing to copy again); a sync
    # deletes them.
    unexpected: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not (self.missing or self.wrong_size or self.wrong_hash or self.unexpected)

    @property
    def bad_paths(self) -> tuple[str, ...]:
        return tuple(sorted({*self.missing, *self.wrong_size, *self.wrong_hash}))


@dataclass(frozen=True, slots=True)
class CheckReport:
    """`check_copy`'s findings. `unrecorded`: objects present but with no recorded ETag to compare."""

    objects_checked: int
    missing: tuple[str, ...]
    wrong_size: tuple[str, ...]
    etag_changed: tuple[str, ...]
    unrecorded: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.wrong_size or self.etag_changed or self.unrecorded)

    @property
    def bad_paths(self) -> tuple[str, ...]:
        return tuple(sorted({*self.missing, *self.wrong_size, *self.etag_changed, *self.unrecorded}))


def _with_slash(prefix: str) -> str:
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


async def check_copy(
    target: ObjectStore,
    target_prefix: str,
    manifest: Manifest,
    recorded_etags: Mapping[str, str],
) -> CheckReport:
    """One listing of the copy against the manifest's sizes and the recorded ETags (no object read)."""
    target_prefix = _with_slash(target_prefix)
    listing = {m.path[len(target_prefix) :]: m for m in await list_all(target, target_prefix)}
    missing, wrong_size, changed, unrecorded = [], [], [], []
    for entry in manifest.entries:
        meta = listing.get(entry.path)
        recorded = normalize_etag(recorded_etags.get(entry.path))
        if meta is None:
            missing.append(entry.path)
        elif meta.size_bytes != entry.size_bytes:
            wrong_size.append(entry.path)
        elif recorded is None:
            unrecorded.append(entry.path)
        elif normalize_etag(meta.etag) != recorded:
            changed.append(entry.path)
    report = CheckReport(
        manifest.object_count, tuple(missing), tuple(wrong_size), tuple(changed), tuple(unrecorded)
    )
    _log.info(
        "copy_checked", target=target.name, prefix=target_prefix, ok=report.ok, bad=len(report.bad_paths)
    )
    return report


async def verify_copy(
    target: ObjectStore, target_prefix: str, manifest: Manifest, *, concurrency: int = 16
) -> VerifyReport:
    """Re-read and re-hash every object of the copy (`verify` under the name the federation uses)."""
    return await verify(target, target_prefix, manifest, concurrency=concurrency)


async def repair_copy(
    source: ObjectStore,
    source_prefix: str,
    target: ObjectStore,
    target_prefix: str,
    manifest: Manifest,
    bad_paths: Sequence[str],
    *,
    options: SyncOptions | None = None,
    owns_prefix: bool = False,
) -> SyncReport:
    """Copy `bad_paths` again from the source (whatever the target lists for them), verified as in any
    sync; with `owns_prefix` its closing listing also deletes objects under the copy that are not of
    the version (see `run_sync`). The
    other objects count as they are listed now (the caller has just re-hashed them); the report's
    `verified_etags` covers the whole copy as listed at the end."""
    wanted = manifest.by_path()
    bad = set(bad_paths)
    entries = [wanted[p] for p in sorted(bad) if p in wanted]
    target_prefix = _with_slash(target_prefix)
    listed = {m.path[len(target_prefix) :]: m for m in await list_all(target, target_prefix)}
    # Every other object of the version, as listed: the plan must cover the whole version, or the
    # sync's closing listing would take the objects it leaves out for strays.
    kept = {
        p: VerifiedObject(e.size_bytes, normalize_etag(listed[p].etag), e.sha256)
        for p, e in wanted.items()
        if p not in bad and p in listed and listed[p].size_bytes == e.size_bytes
    }
    entries += [e for p, e in wanted.items() if p not in bad and p not in kept]
    plan = SyncPlan(
        source_prefix=_with_slash(source_prefix),
        target_prefix=target_prefix,
        manifest_digest=manifest.digest,
        to_copy=tuple(sorted(entries, key=lambda e: (-e.size_bytes, e.path))),
        up_to_date=kept,
        to_delete=(),
        server_side=target.can_copy_from(source),
        total_bytes=manifest.total_size_bytes,
        total_objects=manifest.object_count,
        resume=JournalState(),
    )
    report = await run_sync(plan, source, target, options=options, owns_prefix=owns_prefix)
    _log.info("copy_repaired", target=target.name, prefix=target_prefix, objects=len(entries))
    return report


async def verify(
    target: ObjectStore,
    target_prefix: str,
    manifest: Manifest,
    *,
    concurrency: int = 16,
    update_marker: bool = True,
) -> VerifyReport:
    """Read every object of `manifest` under `target_prefix` and compare sizes and sha256s."""
    if target_prefix and not target_prefix.endswith("/"):
        target_prefix += "/"
    listing = {}
    async for page in target.list_prefix(target_prefix):
        for meta in page:
            listing[meta.path[len(target_prefix) :]] = meta
    missing: list[str] = []
    wrong_size: list[str] = []
    wrong_hash: list[str] = []
    slots = asyncio.Semaphore(concurrency)

    async def check(entry: ManifestEntry) -> None:
        meta = listing.get(entry.path)
        if meta is None:
            missing.append(entry.path)
            return
        if meta.size_bytes != entry.size_bytes:
            wrong_size.append(entry.path)
            return
        async with slots:
            try:
                digest = await sha256_of(target, target_prefix + entry.path, entry.size_bytes)
            except ObjectNotFound:
                missing.append(entry.path)
                return
            except SourceChanged:
                wrong_size.append(entry.path)
                return
        if digest != entry.sha256:
            wrong_hash.append(entry.path)

    await asyncio.gather(*(check(e) for e in manifest.entries))
    wanted = manifest.by_path()
    unexpected = tuple(sorted(p for p in listing if p not in wanted and not is_internal(p)))
    report = VerifyReport(
        manifest.object_count,
        tuple(sorted(missing)),
        tuple(sorted(wrong_size)),
        tuple(sorted(wrong_hash)),
        unexpected,
    )
    if not report.ok:
        _log.warning(
            "verification_failed",
            target=target.name,
            prefix=target_prefix,
            bad=len(report.bad_paths),
            unexpected=len(report.unexpected),
        )
        if update_marker:
            marker = await read_marker(target, target_prefix)
            if marker is not None:
                kept = {p: o for p, o in marker.objects.items() if p not in set(report.bad_paths)}
                await write_marker(target, target_prefix, SyncState(marker.manifest_digest, kept))
    else:
        _log.info(
            "verification_passed", target=target.name, prefix=target_prefix, objects=report.objects_checked
        )
    return report
