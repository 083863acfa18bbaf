"""Trusting a cached copy: a cheap check before each dispatch, a full verify (and repair) on demand or
by the leader's periodic scrub.

etcd is the truth about a copy: its record and the ETags its objects had when last verified
(`/gpufed/copy-etags/...`). Anyone who can write the target bucket can delete or overwrite an object, or
forge the marker datasync leaves there, so the marker is never consulted here:

- `check_cached`: one listing of the copy against the manifest's sizes and the recorded ETags (datasync's
  `check_copy`). Run before a job is dispatched to the copy; a copy that fails it is re-synced (the plan
  trusts the record, so only the missing or changed objects are copied again) before the job runs.
- `verify_cached`: re-reads and re-hashes every object (`verify_copy`), and with `repair` copies the bad
  ones again from the home store (`repair_copy`), then records the copy's new ETags. It holds the
  copy's fence, so it never runs alongside a sync or an eviction of the same copy.
- `Scrubber`: on the leader, every `scrub_interval_s` verifies and repairs the copy verified longest ago.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import structlog

from datasync import CopyKey, check_copy, repair_copy, verify_copy
from datasync.marker import normalize_etag
from datasync.store import list_all
from federation.datasets.fence import CopyBusy, fenced
from federation.datasets.registry import CopyEtags, DatasetRegistry, cache_prefix
from federation.datasets.stores import StoreDirectory
from federation.errors import FailedPrecondition

log = structlog.get_logger("gpufed.datasets")


@dataclass(frozen=True, slots=True)
class VerifyOutcome:
    objects_checked: int
    missing: tuple[str, ...]
    wrong_size: tuple[str, ...]
    wrong_hash: tuple[str, ...]
    repaired: tuple[str, ...] = ()
    # Objects under the copy's prefix that are not of the version, and those of them the repair deleted.
    unexpected: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the copy is whole now (found so, or repaired), with nothing else under its prefix."""
        bad = {*self.missing, *self.wrong_size, *self.wrong_hash}
        return bad <= set(self.repaired) and set(self.unexpected) <= set(self.removed)


async def check_cached(registry: DatasetRegistry, stores: StoreDirectory, key: CopyKey) -> tuple[str, ...]:
    """The copy's objects that do not match etcd's record (empty: it matches). A copy without a record
    of its ETags (recorded before they were kept) counts as unchecked: every object is named."""
    manifest = await registry.manifest(key.dataset, key.version)
    if manifest is None:
        return ("(no manifest)",)
    recorded = await registry.copy_etags(key)
    if recorded is None:
        return tuple(e.path for e in manifest.entries)
    target = await stores.client(key.store)
    report = await check_copy(target, cache_prefix(key.dataset, key.version), manifest, recorded.etags)
    if not report.ok:
        log.warning(
            "copy_check_failed",
            store=key.store,
            dataset=key.dataset,
            version=key.version,
            missing=len(report.missing),
            wrong_size=len(report.wrong_size),
            etag_changed=len(report.etag_changed),
            unrecorded=len(report.unrecorded),
        )
    return report.bad_paths


async def verify_cached(
    registry: DatasetRegistry,
    stores: StoreDirectory,
    key: CopyKey,
    *,
    repair: bool,
    clock: Callable[[], float] = time.time,
) -> VerifyOutcome:
    """Re-hash every object of the cached copy `key`; with `repair`, copy the bad ones again and record
    the copy's ETags anew. Raises NotFound-like FailedPrecondition when there is no such copy, and
    `CopyBusy` when a sync or an eviction of it runs."""
    async with fenced(registry.kv, key, "verify") as fence:
        held = await registry.get_copy(key)
        stored = await registry.get(key.dataset)
        version = None if stored is None else stored.value.version(key.version)
        manifest = await registry.manifest(key.dataset, key.version)
        if held is None or version is None or manifest is None:
            raise FailedPrecondition(f"store: no copy of {key.dataset}@{key.version} in {key.store}")
        target = await stores.client(key.store)
        prefix = cache_prefix(key.dataset, key.version)
        report = await verify_copy(target, prefix, manifest)
        outcome = VerifyOutcome(
            report.objects_checked,
            report.missing,
            report.wrong_size,
            report.wrong_hash,
            unexpected=report.unexpected,
        )
        listing = {m.path[len(prefix) :]: normalize_etag(m.etag) for m in await list_all(target, prefix)}
        good = {
            p: e
            for p, e in listing.items()
            if e is not None and p in manifest.by_path() and p not in set(report.bad_paths)
        }
        if (report.bad_paths or report.unexpected) and repair:
            source = await stores.client(version.home.store)
            fixed = await repair_copy(
                source, version.home.prefix, target, prefix, manifest, report.bad_paths, owns_prefix=True
            )
            good.update(fixed.verified_etags)
            # Its verified ETags cover the whole copy as listed at its end: repaired are the bad ones.
            # Its closing listing deleted the strays (it fails when it could not).
            outcome = replace(
                outcome,
                repaired=tuple(sorted(set(report.bad_paths) & set(fixed.verified_etags))),
                removed=report.unexpected,
            )
        # The record keeps only objects found good: one still bad (a repair failed, or none was asked
        # for) has no recorded ETag, so the next dispatch's check fails on it even when bit rot left its
        # ETag unchanged, and re-syncs it. Only a whole copy counts as verified now.
        copy, revision = held
        before = await registry.copy_etags(key)
        at_s = clock() if outcome.ok else (0.0 if before is None else before.verified_at_s)
        if not await registry.put_copy(
            copy, expect_revision=revision, etags=CopyEtags(good, at_s), also=[fence.held]
        ):
            log.info("copy_verify_not_recorded", store=key.store, dataset=key.dataset)
        log.info(
            "copy_verified",
            store=key.store,
            dataset=key.dataset,
            version=key.version,
            bad=len(report.bad_paths),
            repaired=len(outcome.repaired),
            unexpected=len(report.unexpected),
        )
        return outcome


class Scrubber:
    """Verifies and repairs one cached copy every `interval_s` (the one verified longest ago), in the
    background on the leader, so scrubbing never holds up a dispatcher tick."""

    def __init__(
        self,
        registry: DatasetRegistry,
        stores: StoreDirectory,
        *,
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._registry = registry
        self._stores = stores
        self._interval_s = interval_s
        self._clock = clock
        self._last_s = clock()
        self._task: asyncio.Task[None] | None = None

    def tick(self) -> None:
        if self._interval_s <= 0 or (self._task is not None and not self._task.done()):
            return
        if self._clock() - self._last_s < self._interval_s:
            return
        self._last_s = self._clock()
        self._task = asyncio.create_task(self._scrub_one(), name="dataset-scrub")

    async def _scrub_one(self) -> None:
        oldest: tuple[float, CopyKey] | None = None
        for copy in (await self._registry.copies()).copies:
            etags = await self._registry.copy_etags(copy.key)
            at = 0.0 if etags is None else etags.verified_at_s
            if oldest is None or at < oldest[0]:
                oldest = (at, copy.key)
        if oldest is None:
            return
        try:
            await verify_cached(self._registry, self._stores, oldest[1], repair=True, clock=self._clock)
        except (CopyBusy, FailedPrecondition) as error:
            log.info("scrub_skipped", store=oldest[1].store, dataset=oldest[1].dataset, reason=str(error))
        except Exception:  # a store down must not end the scrub for good
            log.exception("scrub_failed", store=oldest[1].store, dataset=oldest[1].dataset)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
