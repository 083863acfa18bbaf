"""Running a sync: plan, copy through an executor, delete what the new version dropped, write the marker.

This is the module federation calls (see docs/datasync.md):

    plan = await plan_sync(source, "datasets/imagenet/v3/", target, "cache/imagenet/v3/", manifest)
    plan.egress(usd_per_gb=0.09).usd          # before starting
    report = await run_sync(plan, source, target, progress=show, journal=LocalJournal.for_sync(...))

The executor decides where the copies run: `LocalExecutor` (asyncio in this process, the default) or
`datasync.ray_executor.RayExecutor` (shards on Ray workers). Everything else (the marker, deletions,
progress, the journal's end) happens here, once, whatever the executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import structlog

from datasync.errors import DatasyncError, SyncFailed
from datasync.journal import Journal, JournalState, MemoryJournal
from datasync.manifest import is_internal, sha256_of
from datasync.marker import SyncState, VerifiedObject, normalize_etag, write_marker
from datasync.model import Manifest, ManifestEntry
from datasync.plan import EgressEstimate, ExistingCopy, SyncPlan, plan_sync
from datasync.progress import ProgressCallback, ProgressTracker, SyncProgress
from datasync.store import ObjectMeta, ObjectStore, list_all
from datasync.transfer import Copier, SyncOptions, TransferStats

_log = structlog.get_logger(__name__)

# How many times a sync copies again what its closing listing found missing or changed (a third party
# deleting or overwriting objects under the copy while it ran) before it fails, retryable.
CONFIRM_ROUNDS = 3


@dataclass(frozen=True, slots=True)
class SyncReport:
    objects_total: int
    objects_copied: int
    objects_up_to_date: int
    objects_deleted: int
    bytes_total: int
    bytes_copied: int
    bytes_uploaded: int
    parts_uploaded: int
    parts_reused: int
    server_side_copies: int
    retries: int
    duration_s: float
    failures: tuple[tuple[str, str], ...] = ()
    # What this run did, by kind (see `SyncProgress`): objects copied server-side from another version's
    # copy in the target store, bytes of parts a killed run had uploaded, bytes copied server-side from
    # the source, objects read back to verify them.
    objects_reused: int = 0
    bytes_reused: int = 0
    bytes_resumed: int = 0
    bytes_server_copied: int = 0
    readbacks: int = 0
    # path -> ETag of every object of the version verified at the target (up to date, copied or reused):
    # what the caller records (etcd) and passes back as `recorded_etags` to plan or check the copy.
    verified_etags: dict[str, str] = field(default_factory=dict)
    progress: SyncProgress | None = None

    @property
    def objects_failed(self) -> int:
        return len(self.failures)

    @property
    def rate_bytes_per_s(self) -> float:
        """Bytes sent to the target through this process, over this run's duration."""
        return self.bytes_uploaded / self.duration_s if self.duration_s > 0 else 0.0


class Executor(Protocol):
    """Runs the copies of a plan and returns what was verified. Must not write the marker."""

    async def copy(
        self,
        plan: SyncPlan,
        source: ObjectStore,
        target: ObjectStore,
        options: SyncOptions,
        journal: Journal,
        tracker: ProgressTracker,
    ) -> TransferStats: ...


class LocalExecutor:
    """All copies in this process's event loop, `options.concurrency` at a time."""

    async def copy(
        self,
        plan: SyncPlan,
        source: ObjectStore,
        target: ObjectStore,
        options: SyncOptions,
        journal: Journal,
        tracker: ProgressTracker,
    ) -> TransferStats:
        copier = Copier(
            source,
            plan.source_prefix,
            target,
            plan.target_prefix,
            options=options,
            journal=journal,
            resume=plan.resume,
            tracker=tracker,
        )
        return await copier.run(plan.to_copy)


async def _reuse(
    plan: SyncPlan,
    source: ObjectStore,
    target: ObjectStore,
    options: SyncOptions,
    journal: Journal,
    tracker: ProgressTracker,
) -> tuple[SyncPlan, TransferStats]:
    """Server-side copies from existing copies in the target store, here whatever the executor (they
    move no bytes through any worker); what could not be reused joins the plan's copies from the source."""
    copier = Copier(
        source,
        plan.source_prefix,
        target,
        plan.target_prefix,
        options=options,
        journal=journal,
        resume=plan.resume,
        tracker=tracker,
    )
    fallback = await copier.reuse(plan.to_reuse)
    if fallback:
        to_copy = tuple(sorted((*plan.to_copy, *fallback), key=lambda e: (-e.size_bytes, e.path)))
        plan = replace(plan, to_copy=to_copy, to_reuse=())
    return plan, copier.stats


async def _report_progress(tracker: ProgressTracker, callback: ProgressCallback, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        callback(tracker.snapshot())


async def _fill_missing_etags(target: ObjectStore, prefix: str, objects: dict[str, VerifiedObject]) -> None:
    """Stores that do not return an ETag on write get it from one listing, so the marker can match."""
    if all(o.etag is not None for o in objects.values()):
        return
    async for page in target.list_prefix(prefix):
        for meta in page:
            rel = meta.path[len(prefix) :]
            known = objects.get(rel)
            if known is not None and known.etag is None and meta.size_bytes == known.size_bytes:
                objects[rel] = VerifiedObject(known.size_bytes, normalize_etag(meta.etag), known.sha256)


def _wanted(plan: SyncPlan) -> dict[str, ManifestEntry]:
    """Every object of the plan's version, by path: copied, reused or already up to date."""
    wanted = {e.path: e for e in plan.to_copy}
    wanted.update((r.entry.path, r.entry) for r in plan.to_reuse)
    for path, known in plan.up_to_date.items():
        wanted.setdefault(path, ManifestEntry(path, known.size_bytes, known.sha256))
    return wanted


@dataclass(frozen=True, slots=True)
class ListingCheck:
    """A listing of the copy against what the sync verified. `unconfirmed`: not listed, or listed with
    another size (copy again); `etag_changed`: listed with another ETag than the write returned (read
    back to tell an overwrite from a store that reports ETags its own way); `strays`: listed under the
    copy's prefix but not of the version (datasync's `.gpufed/` aside)."""

    unconfirmed: tuple[ManifestEntry, ...]
    etag_changed: tuple[ManifestEntry, ...]
    strays: tuple[str, ...]


def compare_listing(
    wanted: Mapping[str, ManifestEntry],
    verified: dict[str, VerifiedObject],
    listing: Mapping[str, ObjectMeta],
) -> ListingCheck:
    """Hold the listing to what the sync verified. An object whose ETag the store did not return on
    write takes the listed one (fills `verified` in place)."""
    unconfirmed, changed = [], []
    for path, entry in sorted(wanted.items()):
        meta, known = listing.get(path), verified.get(path)
        if meta is None or known is None or meta.size_bytes != entry.size_bytes:
            unconfirmed.append(entry)
            continue
        listed = normalize_etag(meta.etag)
        if known.etag is None and listed is not None:
            verified[path] = VerifiedObject(known.size_bytes, listed, known.sha256)
        elif known.etag != listed:
            changed.append(entry)
    strays = sorted(p for p in listing if p not in wanted and not is_internal(p))
    return ListingCheck(tuple(unconfirmed), tuple(changed), tuple(strays))


async def _read_back(
    target: ObjectStore,
    prefix: str,
    entries: Sequence[ManifestEntry],
    listing: Mapping[str, ObjectMeta],
    verified: dict[str, VerifiedObject],
) -> list[ManifestEntry]:
    """Re-hash the objects listed with an unexpected ETag: those that still hold the version's bytes
    count as verified under the listed ETag; the others are returned, to copy again."""
    bad = []
    for entry in entries:
        try:
            digest = await sha256_of(target, prefix + entry.path, entry.size_bytes)
        except DatasyncError:  # gone or truncated meanwhile
            digest = None
        if digest == entry.sha256:
            listed = normalize_etag(listing[entry.path].etag)
            verified[entry.path] = VerifiedObject(entry.size_bytes, listed, entry.sha256)
        else:
            bad.append(entry)
    return bad


async def _confirm_by_listing(
    wanted: Mapping[str, ManifestEntry],
    verified: dict[str, VerifiedObject],
    plan: SyncPlan,
    source: ObjectStore,
    target: ObjectStore,
    options: SyncOptions,
    executor: Executor,
    journal: Journal,
    tracker: ProgressTracker,
    stats: TransferStats,
    *,
    delete_strays: bool,
) -> int:
    """List the copy after the sync's last write and hold it to what the sync verified: what a third
    party deleted or overwrote meanwhile is copied again, and with `delete_strays` objects under the
    prefix that are not of the version are deleted, then the copy is listed again. A copy counts as
    verified only once such a listing matches; after `CONFIRM_ROUNDS` rounds of changes the sync fails
    (retryable), with what is still wrong in `stats.failures`. Returns the strays deleted."""
    deleted = 0
    found = ListingCheck((), (), ())
    for round_no in range(CONFIRM_ROUNDS + 1):
        listing = {m.path[len(plan.target_prefix) :]: m for m in await list_all(target, plan.target_prefix)}
        found = compare_listing(wanted, verified, listing)
        again = [
            *found.unconfirmed,
            *await _read_back(target, plan.target_prefix, found.etag_changed, listing, verified),
        ]
        strays = found.strays if delete_strays else ()
        if not again and not strays:
            return deleted
        _log.warning(
            "copy_listing_mismatched",
            target=target.name,
            target_prefix=plan.target_prefix,
            unconfirmed=len(again),
            strays=len(strays),
            round=round_no,
        )
        for entry in again:
            verified.pop(entry.path, None)
        if round_no == CONFIRM_ROUNDS:
            break
        if strays:
            await target.delete([plan.target_prefix + p for p in strays])
            deleted += len(strays)
        if again:
            # No longer done: the progress counts them again as they are copied again (never past
            # the version's totals).
            tracker.bytes_done -= sum(e.size_bytes for e in again)
            tracker.objects_done -= len(again)
            # The journal says these were finished: this round must not trust it.
            redo = replace(plan, to_copy=tuple(again), to_reuse=(), resume=JournalState())
            more = await executor.copy(redo, source, target, options, journal, tracker)
            stats.merge(more)
            verified.update(more.verified)
            if more.failures:
                return deleted
        await write_marker(target, plan.target_prefix, SyncState(plan.manifest_digest, verified))
    for entry in again:
        gone = DatasyncError(f"{entry.path}: not listed as copied after {CONFIRM_ROUNDS} copies again")
        gone.retryable = True
        stats.failures.append((entry.path, gone))
    if strays:
        stray = DatasyncError(f"objects not of the version stay under the copy: {', '.join(strays[:5])}")
        stray.retryable = True
        stats.failures.append((strays[0], stray))
    return deleted


async def run_sync(
    plan: SyncPlan,
    source: ObjectStore,
    target: ObjectStore,
    *,
    options: SyncOptions | None = None,
    executor: Executor | None = None,
    journal: Journal | None = None,
    progress: ProgressCallback | None = None,
    reuse_etags_vouched: bool = False,
    owns_prefix: bool = False,
) -> SyncReport:
    """Execute `plan`. Raises `SyncFailed` (with `.report`) when some objects could not be copied.

    The copy is verified by a listing taken after the sync's last write (`_confirm_by_listing`).
    `owns_prefix`: nothing but this copy belongs under the target prefix (the federation's cache
    copies), so objects there that are not of the version are deleted; otherwise they are left alone.

    `reuse_etags_vouched` is accepted for callers written against an earlier draft and has no effect:
    every reused object is read back and hashed, whatever its ETag says."""
    del reuse_etags_vouched
    options = options or SyncOptions()
    executor = executor or LocalExecutor()
    journal = journal if journal is not None else MemoryJournal()
    started = time.monotonic()
    # Before any reuse that fails over to a copy from the source rewrites the plan.
    wanted = _wanted(plan)
    tracker = ProgressTracker(
        plan.total_bytes,
        plan.total_objects,
        bytes_done=sum(o.size_bytes for o in plan.up_to_date.values()),
        objects_done=len(plan.up_to_date),
    )
    _log.info(
        "sync_started",
        source=source.name,
        target=target.name,
        target_prefix=plan.target_prefix,
        objects_to_copy=len(plan.to_copy),
        bytes_to_copy=plan.copy_bytes,
        up_to_date=len(plan.up_to_date),
        server_side=plan.server_side,
    )
    reporter = (
        asyncio.create_task(_report_progress(tracker, progress, options.progress_interval_s))
        if progress is not None and (plan.to_copy or plan.to_reuse)
        else None
    )
    try:
        reused = TransferStats()
        if plan.to_reuse:
            plan, reused = await _reuse(plan, source, target, options, journal, tracker)
        stats = (
            await executor.copy(plan, source, target, options, journal, tracker)
            if plan.to_copy
            else TransferStats()
        )
        stats.merge(reused)
    finally:
        if reporter is not None:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
    deleted = 0
    if options.delete_removed and plan.to_delete:
        await target.delete([plan.target_prefix + p for p in plan.to_delete])
        deleted = len(plan.to_delete)
    verified = {**plan.up_to_date, **stats.verified}
    if plan.to_copy or plan.to_delete or stats.failures or stats.verified:
        await _fill_missing_etags(target, plan.target_prefix, verified)
        # A resume hint for a planner without the caller's record; never trusted on its own.
        await write_marker(target, plan.target_prefix, SyncState(plan.manifest_digest, verified))
    if not stats.failures:
        deleted += await _confirm_by_listing(
            wanted,
            verified,
            plan,
            source,
            target,
            options,
            executor,
            journal,
            tracker,
            stats,
            delete_strays=owns_prefix and options.delete_removed,
        )
    if not stats.failures:
        journal.clear()
    final = tracker.snapshot(finished=True)
    if progress is not None:
        progress(final)
    report = SyncReport(
        objects_total=plan.total_objects,
        objects_copied=stats.objects_copied,
        objects_up_to_date=len(plan.up_to_date),
        objects_deleted=deleted,
        bytes_total=plan.total_bytes,
        bytes_copied=sum(o.size_bytes for o in stats.verified.values()),
        bytes_uploaded=stats.bytes_uploaded,
        parts_uploaded=stats.parts_uploaded,
        parts_reused=stats.parts_reused,
        server_side_copies=stats.server_side_copies,
        retries=stats.retries,
        duration_s=time.monotonic() - started,
        failures=tuple((p, str(e)) for p, e in stats.failures),
        objects_reused=stats.objects_reused,
        bytes_reused=stats.bytes_reused,
        bytes_resumed=stats.bytes_resumed,
        bytes_server_copied=stats.bytes_server_copied,
        readbacks=stats.readbacks,
        verified_etags={p: o.etag for p, o in verified.items() if o.etag is not None},
        progress=final,
    )
    _log.info(
        "sync_finished",
        source=source.name,
        target=target.name,
        target_prefix=plan.target_prefix,
        objects_copied=report.objects_copied,
        objects_reused=report.objects_reused,
        objects_deleted=deleted,
        bytes_uploaded=report.bytes_uploaded,
        failures=len(report.failures),
        duration_s=round(report.duration_s, 3),
    )
    if stats.failures:
        error = SyncFailed(stats.failures)
        error.report = report
        raise error
    return report


async def sync_version(
    source: ObjectStore,
    source_prefix: str,
    target: ObjectStore,
    target_prefix: str,
    manifest: Manifest,
    *,
    options: SyncOptions | None = None,
    executor: Executor | None = None,
    journal: Journal | None = None,
    progress: ProgressCallback | None = None,
    usd_per_gb: float = 0.0,
    max_usd: float | None = None,
    recorded_etags: Mapping[str, str] | None = None,
    reuse: Sequence[ExistingCopy] = (),
) -> tuple[SyncReport, EgressEstimate]:
    """Plan and run in one call; refuses (before copying anything) when the egress would exceed max_usd."""
    plan = await plan_sync(
        source,
        source_prefix,
        target,
        target_prefix,
        manifest,
        journal=journal,
        recorded_etags=recorded_etags,
        reuse=reuse,
    )
    estimate = plan.egress(usd_per_gb)
    if max_usd is not None and estimate.usd > max_usd:
        raise SyncFailed([("*", _over_budget(estimate, max_usd))])
    report = await run_sync(
        plan,
        source,
        target,
        options=options,
        executor=executor,
        journal=journal,
        progress=progress,
    )
    return report, estimate


def _over_budget(estimate: EgressEstimate, max_usd: float) -> DatasyncError:
    err = DatasyncError(
        f"egress of {estimate.bytes_crossing} bytes would cost ${estimate.usd:.2f} > ${max_usd:.2f}"
    )
    err.retryable = False
    return err
