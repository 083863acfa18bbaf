"""The leader's etcd compaction: etcd's history is cut at the revision it had `retention_s` ago.

Why: etcd keeps every revision of every key until it is compacted, so without compaction its
database grows with every write, even after the archiver deleted what it wrote (a delete is one more
revision), until the space quota stops all writes. The etcd that `gpufed up` and the tests start
compacts itself (`--auto-compaction-*`, `federation.runtime.etcd_process`), but an external etcd
compacts only if its operator said so. The leader therefore compacts too, the way etcd's own
periodic compactor does: it samples the current revision every `interval_s` and compacts to the
newest sample at least `retention_s` old. Both compacting is harmless: compacting to a revision
already compacted is a no-op (`EtcdKv.compact`), and the later of the two wins.

Fenced: a server that no longer leads stops (its fence no longer holds) before it compacts, so two
servers never both run this. Compaction cannot take a compare, so the check comes just before it;
a leadership lost in between makes only a harmless extra compaction to an old revision.

The retention is what a watcher may miss and still resume without a relist (the job and ledger
caches relist on `WatchCompacted`), and what a paginated list may take (it restarts when compacted
under it); five minutes by default, as Kubernetes' API server compacts its etcd.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable

import structlog

from federation.errors import GpufedError
from federation.store.archive_txn import fence_holds
from federation.store.job_store import Fence
from federation.store.kv import KeyValueStore

log = structlog.get_logger("gpufed.compactor")

DEFAULT_RETENTION_S = 300.0
# Samples per retention: a compaction keeps between one retention and one retention plus this
# share of it (etcd's own periodic compactor samples ten times per retention too).
SAMPLES_PER_RETENTION = 10


class Compactor:
    def __init__(
        self,
        kv: KeyValueStore,
        *,
        retention_s: float = DEFAULT_RETENTION_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if retention_s <= 0:
            raise ValueError("retention_s must be positive (turn the compactor off instead)")
        self._kv = kv
        self.retention_s = retention_s
        self.interval_s = retention_s / SAMPLES_PER_RETENTION
        self._clock = clock
        # (when, revision) samples, oldest first; dropped once a newer one is old enough to use.
        self._samples: deque[tuple[float, int]] = deque()
        self.compacted_to = 0

    async def run(self, fence: Fence, lost: asyncio.Event) -> None:
        """Sample and compact every `interval_s` until leadership is lost."""
        # A new leader starts its own samples: it knows nothing of the last leader's.
        self._samples.clear()
        while not lost.is_set():
            try:
                if not await self.tick(fence):
                    return
            except GpufedError as error:
                # etcd away for a moment: the next tick samples again. Compaction can wait.
                log.warning("etcd_compaction_failed", error=str(error))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lost.wait(), self.interval_s)

    async def tick(self, fence: Fence) -> bool:
        """One sample, and a compaction when a sample is old enough. False once the fence is gone."""
        now = self._clock()
        # A one-key read of the leader key: its reply carries the store's current revision.
        revision = (await self._kv.range_prefix(fence.key, limit=1)).revision
        self._samples.append((now, revision))
        target = 0
        while self._samples and now - self._samples[0][0] >= self.retention_s:
            target = self._samples.popleft()[1]
        if target <= self.compacted_to:
            return True
        if not await fence_holds(self._kv, fence):
            log.warning("etcd_compaction_stopped", reason="leader fence no longer holds")
            return False
        await self._kv.compact(target)
        self.compacted_to = target
        log.info("etcd_compacted", revision=target, retention_s=self.retention_s)
        return True
