"""Fan-out with Ray: the same sync, its copies split into shards that Ray tasks execute.

For datasets too large for one machine's bandwidth. The plan, marker and deletions stay with the caller
(`run_sync`); each shard is a list of manifest entries, balanced by bytes, that a Ray task copies with the
same `Copier` as the local executor, building its own store clients from the store configs (clients do
not travel between processes; credentials are read on the worker from its environment). Progress is
coarse: it advances as shards finish. Each shard journals to `journal_dir/<shard>.jsonl` on the worker,
so a shard retried on the same node resumes; a shard moved to another node starts its objects over.

Ray is imported only when a RayExecutor copies, so `import datasync` does not import ray.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from datasync.errors import DatasyncError, StoreUnavailable
from datasync.journal import Journal, JournalState, LocalJournal, MemoryJournal
from datasync.model import ManifestEntry
from datasync.plan import SyncPlan
from datasync.progress import ProgressTracker
from datasync.store import ObjectStore
from datasync.store_config import StoreConfig, open_store
from datasync.sync import LocalExecutor
from datasync.transfer import Copier, SyncOptions, TransferStats, is_folder_marker


def split_into_shards(entries: Sequence[ManifestEntry], shard_count: int) -> list[list[ManifestEntry]]:
    """Greedy by size (largest first onto the lightest shard): shards of nearly equal bytes."""
    shards: list[list[ManifestEntry]] = [[] for _ in range(max(1, shard_count))]
    loads = [0] * len(shards)
    for entry in sorted(entries, key=lambda e: (-e.size_bytes, e.path)):
        lightest = loads.index(min(loads))
        shards[lightest].append(entry)
        loads[lightest] += max(entry.size_bytes, 1)
    return [s for s in shards if s]


@dataclass(frozen=True, slots=True)
class ShardJob:
    source_name: str
    source: StoreConfig
    source_prefix: str
    target_name: str
    target: StoreConfig
    target_prefix: str
    entries: tuple[ManifestEntry, ...]
    options: SyncOptions
    journal_path: str | None
    resume: JournalState


def run_shard(job: ShardJob) -> TransferStats:
    """What one Ray task runs (also callable directly: it is plain Python)."""

    async def go() -> TransferStats:
        source = open_store(job.source_name, job.source)
        target = open_store(job.target_name, job.target)
        journal: Journal = LocalJournal(Path(job.journal_path)) if job.journal_path else MemoryJournal()
        tracker = ProgressTracker(sum(e.size_bytes for e in job.entries), len(job.entries))
        try:
            copier = Copier(
                source,
                job.source_prefix,
                target,
                job.target_prefix,
                options=job.options,
                journal=journal,
                resume=job.resume,
                tracker=tracker,
            )
            stats = await copier.run(job.entries)
        finally:
            await source.close()
            await target.close()
        if not stats.failures:
            journal.clear()
        # Exceptions cross the process boundary as text with their retryable flag kept.
        stats.failures = [(p, _portable(e)) for p, e in stats.failures]
        return stats

    return asyncio.run(go())


def _portable(e: DatasyncError) -> DatasyncError:
    copy = DatasyncError(str(e))
    copy.retryable = e.retryable
    return copy


class RayExecutor:
    """Runs a plan's copies as `shard_count` Ray tasks. Needs `ray.init()` done by the caller."""

    def __init__(
        self,
        *,
        source_name: str,
        source: StoreConfig,
        target_name: str,
        target: StoreConfig,
        shard_count: int = 4,
        journal_dir: Path | None = None,
        num_cpus_per_shard: float = 1.0,
    ) -> None:
        self._source_name, self._source = source_name, source
        self._target_name, self._target = target_name, target
        self._shard_count = shard_count
        self._journal_dir = journal_dir
        self._num_cpus = num_cpus_per_shard

    async def copy(
        self,
        plan: SyncPlan,
        source: ObjectStore,
        target: ObjectStore,
        options: SyncOptions,
        journal: Journal,
        tracker: ProgressTracker,
    ) -> TransferStats:
        import ray

        remote: Any = ray.remote(num_cpus=self._num_cpus, max_retries=0)(run_shard)
        # Folder markers are written here, before any shard starts: a shard writing `folder/inside.txt`
        # beside another writing `folder/` can leave the marker out of the store's listings
        # (folder_marker_phases says why). They are zero bytes, so no worker is needed for them.
        markers = [e for e in plan.to_copy if is_folder_marker(e.path)]
        total = TransferStats()
        if markers:
            only_markers = replace(plan, to_copy=tuple(markers))
            total.merge(await LocalExecutor().copy(only_markers, source, target, options, journal, tracker))
        rest = [e for e in plan.to_copy if not is_folder_marker(e.path)]
        shards = split_into_shards(rest, self._shard_count)
        jobs = [
            ShardJob(
                self._source_name,
                self._source,
                plan.source_prefix,
                self._target_name,
                self._target,
                plan.target_prefix,
                tuple(shard),
                options,
                str(self._journal_dir / f"{plan.manifest_digest[:16]}-shard-{i}.jsonl")
                if self._journal_dir
                else None,
                plan.resume,
            )
            for i, shard in enumerate(shards)
        ]
        pending = {remote.remote(job): job for job in jobs}
        while pending:
            done, _ = await asyncio.to_thread(ray.wait, list(pending), num_returns=1)
            ref = done[0]
            job = pending.pop(ref)
            try:
                stats: TransferStats = await asyncio.to_thread(ray.get, ref)
            except Exception as e:  # a worker that died: every object of its shard failed, retryably
                failure = StoreUnavailable(f"ray shard failed: {type(e).__name__}")
                stats = TransferStats(failures=[(entry.path, failure) for entry in job.entries])
            total.merge(stats)
            for path in stats.verified:
                journal.object_finished(path, stats.verified[path])
                tracker.object_done()
            for _ in stats.failures:
                tracker.object_failed()
            # What the shard really did, by kind: resumed parts are not bytes moved now.
            tracker.add_bytes(stats.bytes_uploaded)
            tracker.add_resumed(stats.bytes_resumed)
            tracker.add_server_copied(stats.bytes_server_copied)
        return total
