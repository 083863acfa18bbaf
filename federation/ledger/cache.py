"""The usage ledger in memory, kept current by list-then-watch, for budgets, fair share and reports.

Reports over a month of intervals must answer in well under a second, and the scheduler reads every
tenant's usage each few seconds: neither can afford to list the ledger from etcd each time. Entries
are put (opened, then closed) and deleted only once the archiver has moved them to the history
store (closed intervals of ended jobs), so the cache is a map from key to the latest interval, and
a deletion drops the entry: what the cache holds is etcd's part of the ledger, never SQL's. A
broken watch (etcd away, or compaction) lists everything again.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from federation.errors import StoreUnavailable
from federation.store.intervals import LEDGER_PREFIX, LedgerInterval
from federation.store.job_store import JobStore, LedgerRemoved
from federation.store.kv import WatchCompacted

log = structlog.get_logger(__name__)

_BACKOFF_START_S = 0.2
_BACKOFF_MAX_S = 5.0


class LedgerCache:
    def __init__(self, store: JobStore) -> None:
        self._store = store
        self._intervals: dict[bytes, LedgerInterval] = {}
        # Job id -> its intervals' keys: a job's cost on GetJob without walking 100,000 intervals.
        self._by_job: dict[str, set[bytes]] = {}
        self._revision = 0
        self._synced = False
        self._task: asyncio.Task[None] | None = None
        # Bumped on every change, so that derived figures can be cached until the ledger moves.
        self.version = 0

    @property
    def synced(self) -> bool:
        return self._synced

    async def start(self) -> None:
        if self._task is not None:
            return
        await self._relist()
        self._task = asyncio.create_task(self._follow(), name="ledger-cache-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._synced = False

    def intervals(self) -> list[LedgerInterval]:
        return list(self._intervals.values())

    def for_job(self, job_id: str) -> list[LedgerInterval]:
        """The job's intervals etcd holds (none once the job is archived), in attempt order."""
        keys = self._by_job.get(job_id, ())
        return [self._intervals[k] for k in sorted(keys) if k in self._intervals]

    def _index(self, key: bytes, *, present: bool) -> None:
        job_id = _job_of(key)
        if present:
            self._by_job.setdefault(job_id, set()).add(key)
            return
        keys = self._by_job.get(job_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_job[job_id]

    async def _relist(self) -> None:
        # Keyed as etcd holds them (each interval's `key`, which a removal names): a restart's
        # 100,000 keys are not formatted again from the intervals.
        intervals, revision = await self._store.list_ledger_by_key()
        self._intervals = intervals
        self._by_job = {}
        for key in intervals:
            self._index(key, present=True)
        self._revision = revision
        self._synced = True
        self.version += 1

    async def _follow(self) -> None:
        backoff_s = _BACKOFF_START_S
        while True:
            try:
                if not self._synced:
                    await self._relist()
                    backoff_s = _BACKOFF_START_S
                events = self._store.watch_ledger(start_revision=self._revision + 1)
                async with contextlib.aclosing(events):
                    async for change in events:
                        if isinstance(change, LedgerRemoved):
                            self._intervals.pop(change.key, None)
                            self._index(change.key, present=False)
                        else:
                            self._intervals[change.key] = change
                            self._index(change.key, present=True)
                        self.version += 1
                        backoff_s = _BACKOFF_START_S
                log.warning("ledger_cache_watch_ended", revision=self._revision)
            except (WatchCompacted, StoreUnavailable) as e:
                log.warning("ledger_cache_watch_broke", error=str(e), backoff_s=backoff_s)
            except Exception:
                log.exception("ledger_cache_watch_failed", backoff_s=backoff_s)
            # Without revisions on the decoded entries, resuming exactly is not possible: list again.
            self._synced = False
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, _BACKOFF_MAX_S)


def _job_of(key: bytes) -> str:
    # `<prefix><job_id>/<attempt:06d>` (`federation.store.intervals.ledger_key`).
    return key[len(LEDGER_PREFIX) :].rsplit(b"/", 1)[0].decode()
