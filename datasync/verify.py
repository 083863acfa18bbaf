"""Verification: re-read a copy at the target and check every object against the manifest's sha256.

A sync verifies each object as it copies it; `verify` is the later check that the copy is still intact
(bit rot, a tool that overwrote objects, a partial restore). Objects found bad are dropped from the
target's marker, so the next sync copies them again even if their size and ETag look unchanged.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import structlog

from datasync.errors import ObjectNotFound, SourceChanged
from datasync.manifest import sha256_of
from datasync.marker import SyncState, read_marker, write_marker
from datasync.model import Manifest, ManifestEntry
from datasync.store import ObjectStore

_log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class VerifyReport:
    objects_checked: int
    missing: tuple[str, ...]
    wrong_size: tuple[str, ...]
    wrong_hash: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.wrong_size or self.wrong_hash)

    @property
    def bad_paths(self) -> tuple[str, ...]:
        return tuple(sorted({*self.missing, *self.wrong_size, *self.wrong_hash}))


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
    report = VerifyReport(
        manifest.object_count, tuple(sorted(missing)), tuple(sorted(wrong_size)), tuple(sorted(wrong_hash))
    )
    if not report.ok:
        _log.warning(
            "verification_failed", target=target.name, prefix=target_prefix, bad=len(report.bad_paths)
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
