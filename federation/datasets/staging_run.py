"""The leader's background syncs: each requested copy of a dataset version runs as its own asyncio task,
so a long transfer never holds up a reconciler tick or the scheduling cycle.

A sync record in `requested` or `running` state with no task in this process is started (or restarted):
that covers a new request and a sync a previous leader was running when it died. The restart resumes
from the journal under `<state-dir>/datasync/` (finished objects and uploaded parts are not sent again)
and from the target's marker, which a finished object's listing must match.

Before copying, the cache's capacity in the target store is made room for: unpinned copies go least
recently used first (`datasync.plan_eviction`); when pinned copies leave no room the sync fails as
retryable, and the job waits in the queue for a copy to be released.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import structlog

from datasync import (
    CopyKey,
    DatasetName,
    DatasyncError,
    LocalJournal,
    ObjectStore,
    StoreName,
    SyncFailed,
    SyncOptions,
    SyncProgress,
    SyncReport,
    VersionId,
    plan_eviction,
    plan_sync,
    record_copy,
    run_sync,
)
from datasync.store import list_all
from federation.datasets.executor import Executors
from federation.datasets.fence import CopyBusy, Fence, fenced
from federation.datasets.registry import CopyEtags, DatasetRegistry, cache_prefix
from federation.datasets.stores import StoreDirectory
from federation.datasets.syncs import SyncRecord, SyncRecords, SyncState, encode_record, sync_key
from federation.datasets.trust import Scrubber, check_cached
from federation.errors import Conflict
from federation.store.kv import Compare, Put
from federation.store.records import SchedulingSettings

log = structlog.get_logger("gpufed.staging")

PROGRESS_WRITE_S = 1.0


class StageFailed(Exception):
    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class FenceLost(StageFailed):
    """The sync's fence expired (or was taken) before it recorded the copy: it records nothing."""


def egress_rate(settings: SchedulingSettings, source: str, target: str) -> float:
    for rate in settings.egress_rates:
        if rate.source_store == source and rate.destination_store == target:
            return rate.usd_per_gb
    return settings.policy.default_egress_usd_per_gb


class SyncRunner:
    def __init__(
        self,
        *,
        registry: DatasetRegistry,
        syncs: SyncRecords,
        stores: StoreDirectory,
        settings: Callable[[], Awaitable[SchedulingSettings]],
        journal_dir: Path,
        options: SyncOptions | None = None,
        executors: Executors | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._options = options
        self._executors = executors
        self._registry = registry
        self._kv = registry.kv
        self._syncs = syncs
        self._stores = stores
        self._settings = settings
        self._journal_dir = journal_dir
        self._clock = clock
        self._tasks: dict[tuple[str, str, str], asyncio.Task[None]] = {}
        self._scrubber: Scrubber | None = None

    async def settings(self) -> SchedulingSettings:
        """The federation's settings, as the runner reads them (the config's `datasets:` among them)."""
        return await self._settings()

    async def start_missing(self) -> None:
        """Start a task for every active sync record that has none here."""
        for record in await self._syncs.list():
            key = (record.store, record.dataset, record.version)
            task = self._tasks.get(key)
            if not record.state.active or (task is not None and not task.done()):
                continue
            if record.state is SyncState.RUNNING:
                log.info("sync_resumed", dataset=record.dataset, version=record.version, store=record.store)
            self._tasks[key] = asyncio.create_task(self._run(record), name=f"sync-{'/'.join(key)}")

    async def check(self, key: CopyKey) -> tuple[str, ...]:
        """The cached copy's objects that do not match etcd's record (see `federation.datasets.trust`)."""
        return await check_cached(self._registry, self._stores, key)

    def scrub_tick(self) -> None:
        if self._scrubber is None:
            interval = 0.0 if self._executors is None else self._executors.settings.scrub_interval_s
            self._scrubber = Scrubber(self._registry, self._stores, interval_s=interval, clock=self._clock)
        self._scrubber.tick()

    async def stop(self) -> None:
        if self._scrubber is not None:
            await self._scrubber.stop()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    async def _write(self, record: SyncRecord) -> SyncRecord:
        """Write our view, keeping job ids that joined meanwhile (the dispatcher adds them)."""
        held = await self._syncs.get(record.store, record.dataset, record.version)
        jobs = record.job_ids if held is None else tuple(dict.fromkeys((*held[0].job_ids, *record.job_ids)))
        fresh = replace(record, job_ids=jobs, updated_at_s=self._clock())
        await self._syncs.put(fresh)
        return fresh

    async def _run(self, record: SyncRecord) -> None:
        key = CopyKey(StoreName(record.store), DatasetName(record.dataset), VersionId(record.version))
        try:
            async with fenced(self._kv, key, "sync") as fence:
                done = await self._fenced_run(record, fence)
                with contextlib.suppress(Exception):
                    await self._write(done)
        except CopyBusy as busy:
            # Another leader's sync or an eviction holds the copy: the record stays asked for, and
            # the next tick starts this again once the fence is free.
            log.info("sync_deferred", dataset=record.dataset, store=record.store, reason=str(busy))
            return
        log.info(
            "sync_ended",
            dataset=record.dataset,
            version=record.version,
            store=record.store,
            state=done.state.value,
            error=done.error,
        )

    async def _fenced_run(self, record: SyncRecord, fence: Fence) -> SyncRecord:
        try:
            return await self._copy(record, fence)
        except asyncio.CancelledError:
            raise
        except FenceLost as error:
            # Not the data's fault, nor the job's: asked for again, it runs once the fence is free.
            log.warning("sync_fence_lost", dataset=record.dataset, store=record.store)
            return replace(record, state=SyncState.REQUESTED, error=str(error), verified=False)
        except StageFailed as error:
            return replace(record, state=SyncState.FAILED, error=str(error), retryable=error.retryable)
        except DatasyncError as error:
            return replace(record, state=SyncState.FAILED, error=str(error)[:1000], retryable=error.retryable)
        except Exception as error:  # a bug or an SDK surprise must fail the sync, not hang its jobs
            log.exception("sync_crashed", dataset=record.dataset, store=record.store)
            return replace(
                record, state=SyncState.FAILED, error=f"{type(error).__name__}: {error}", retryable=True
            )

    async def _copy(self, record: SyncRecord, fence: Fence) -> SyncRecord:
        stored = await self._registry.get(record.dataset)
        version = None if stored is None else stored.value.version(VersionId(record.version))
        manifest = await self._registry.manifest(record.dataset, record.version)
        if version is None or manifest is None:
            raise StageFailed(f"dataset {record.dataset}@{record.version} is not registered", retryable=False)
        if manifest.digest != version.manifest_digest:
            raise StageFailed(
                f"manifest of {record.dataset}@{record.version} does not match its record", retryable=False
            )
        source = await self._stores.client(version.home.store)
        target = await self._stores.client(record.store)
        await self._make_room(record, version.size_bytes, target)
        key = CopyKey(StoreName(record.store), DatasetName(record.dataset), VersionId(record.version))
        # etcd's record of the copy is the truth the plan trusts; without one, the target's marker is
        # only a hint datasync re-hashes before counting an object as there.
        recorded = await self._registry.copy_etags(key)
        reuse = await self._registry.reusable(record.store, record.dataset, record.version)
        journal = LocalJournal.for_sync(self._journal_dir, version.home.store, record.store, manifest.digest)
        try:
            prefix = cache_prefix(record.dataset, record.version)
            plan = await plan_sync(
                source,
                version.home.prefix,
                target,
                prefix,
                manifest,
                journal=journal,
                recorded_etags=None if recorded is None else recorded.etags,
                reuse=reuse,
            )
            rate = egress_rate(await self._settings(), version.home.store, record.store)
            estimate = plan.egress(rate)
            running = await self._write(
                replace(
                    record,
                    state=SyncState.RUNNING,
                    source_store=version.home.store,
                    bytes_total=plan.total_bytes,
                    objects_total=plan.total_objects,
                    bytes_to_copy=plan.copy_bytes,
                    objects_to_copy=len(plan.to_copy),
                    egress_usd=estimate.usd,
                    egress_usd_per_gb=rate,
                    error="",
                    verified=False,
                )
            )
            executor = (
                None
                if self._executors is None
                else await self._executors.for_sync(
                    plan,
                    await self._stores.require(version.home.store),
                    await self._stores.require(record.store),
                )
            )
            latest: list[SyncProgress] = []
            writer = asyncio.create_task(self._progress_writer(running, latest))
            try:
                report = await run_sync(
                    plan,
                    source,
                    target,
                    options=self._options,
                    executor=executor,
                    journal=journal,
                    progress=latest.append,
                    reuse_etags_vouched=bool(reuse),
                    # The cache prefix is the copy's alone: what else is there goes.
                    owns_prefix=True,
                )
            except SyncFailed as error:
                failed = error.report.progress if isinstance(error.report, SyncReport) else None
                if failed is not None:
                    with contextlib.suppress(Exception):
                        await self._write(_with_progress(running, failed))
                raise StageFailed(str(error)[:1000], retryable=error.retryable) from error
            finally:
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer
            await self._record_copy(record, version.size_bytes, report.verified_etags, fence)
            last = report.progress or (latest[-1] if latest else None)
            final = running if last is None else _with_progress(running, last)
            return replace(final, state=SyncState.DONE, bytes_copied=report.bytes_copied, verified=True)
        finally:
            # Kept on disk for a resume when the copy did not finish; the file itself must not leak.
            journal.close()

    async def _progress_writer(self, running: SyncRecord, latest: list[SyncProgress]) -> None:
        while True:
            await asyncio.sleep(PROGRESS_WRITE_S)
            if latest:
                with contextlib.suppress(Exception):
                    await self._write(_with_progress(running, latest[-1]))
                del latest[:-1]

    async def _record_copy(
        self, record: SyncRecord, size_bytes: int, etags: dict[str, str], fence: Fence
    ) -> None:
        """Record the copy with what was verified, only while the fence is still ours: a sync that lost
        it (its lease expired while it was paused) must not vouch for objects another may have touched."""
        key = CopyKey(StoreName(record.store), DatasetName(record.dataset), VersionId(record.version))
        verified = CopyEtags(dict(etags), self._clock())
        for _ in range(10):
            held = await self._registry.get_copy(key)
            state = await self._registry.copies(record.store)
            copy = record_copy(state, key, size_bytes, self._clock()).get(key)
            assert copy is not None
            if await self._registry.put_copy(
                copy,
                expect_revision=None if held is None else held[1],
                etags=verified,
                also=[fence.held],
            ):
                return
            holder = await self._kv.get(fence.key)
            if holder is None or holder.value != fence.value:
                raise FenceLost(
                    f"lost the fence of the copy of {record.dataset} in {record.store}; not recorded",
                    retryable=True,
                )
        raise StageFailed(f"could not record the copy of {record.dataset} in {record.store}", retryable=True)

    async def _make_room(self, record: SyncRecord, size_bytes: int, target: ObjectStore) -> None:
        store = await self._stores.require(record.store)
        if store.capacity_bytes is None:
            return
        state = await self._registry.copies(record.store)
        key = CopyKey(StoreName(record.store), DatasetName(record.dataset), VersionId(record.version))
        incoming = 0 if state.get(key) is not None else size_bytes
        decision = plan_eviction(state, StoreName(record.store), store.capacity_bytes, incoming)
        if not decision.fits:
            raise StageFailed(
                f"no room for {record.dataset}@{record.version}: {decision.reason}", retryable=True
            )
        for evicted in decision.evict:
            held = await self._registry.get_copy(evicted)
            if held is None:
                continue
            try:
                await evict_copy(self._registry, self._syncs, target, evicted, held[1])
            except (Conflict, CopyBusy) as error:
                raise StageFailed(str(error), retryable=True) from error
            log.info("copy_evicted", store=evicted.store, dataset=evicted.dataset, version=evicted.version)


async def evict_copy(
    registry: DatasetRegistry, syncs: SyncRecords, target: ObjectStore, key: CopyKey, revision: int
) -> None:
    """Delete the copy's record, then its objects, holding the copy's fence so no sync or repair of it
    runs meanwhile (`CopyBusy` when one does). The record goes first, by compare-and-swap on the revision
    the decision read, so a job that pinned the copy meanwhile keeps it; a finished sync's record says
    `evicted` with it, so status no longer says done and verified. A crash before the objects go leaves
    them for the next sync of the version, which re-hashes what only its marker vouches for."""
    async with fenced(registry.kv, key, "evict") as fence:
        extra, also = [], [fence.held]
        held = await syncs.get(key.store, key.dataset, key.version)
        if held is not None and not held[0].state.active:
            skey = sync_key(key.store, key.dataset, key.version)
            gone = replace(held[0], state=SyncState.EVICTED, verified=False, updated_at_s=time.time())
            also.append(Compare.mod_revision_is(skey, held[1]))
            extra.append(Put(skey, encode_record(gone)))
        if not await registry.delete_copy(key, expect_revision=revision, also=also, extra=extra):
            raise Conflict(
                f"the copy of {key.dataset}@{key.version} in {key.store} changed (a job pinned it?)"
            )
        objects = await list_all(target, cache_prefix(key.dataset, key.version))
        if objects:
            await target.delete([o.path for o in objects])


def _with_progress(record: SyncRecord, p: SyncProgress) -> SyncRecord:
    return replace(
        record,
        objects_up_to_date=p.objects_up_to_date,
        objects_copied=p.objects_copied,
        objects_reused=p.objects_reused,
        objects_failed=p.objects_failed,
        bytes_transferred=p.bytes_transferred,
        bytes_server_copied=p.bytes_server_copied,
        bytes_reused=p.bytes_reused,
        bytes_resumed=p.bytes_resumed,
        bytes_done=p.bytes_done,
        bytes_total=p.bytes_total,
        objects_done=p.objects_done,
        objects_total=p.objects_total,
        rate_bytes_per_s=p.rate_bytes_per_s,
        eta_s=p.eta_s,
        elapsed_s=p.elapsed_s,
    )
