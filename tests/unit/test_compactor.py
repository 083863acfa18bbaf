"""The leader's etcd compactor, on the in-memory store with etcd's compaction rules and a fake clock:
it compacts to the revision of one retention ago, never newer, and stops once it no longer leads."""

from __future__ import annotations

import pytest

from federation.scheduling.compactor import Compactor
from federation.store.job_store import LEADER_KEY, Fence
from federation.store.kv import WatchCompacted
from federation.store.kv_memory import MemoryKv


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


async def _leader(kv: MemoryKv) -> Fence:
    return Fence(LEADER_KEY, await kv.put(LEADER_KEY, b"me"))


async def _writes(kv: MemoryKv, n: int) -> int:
    for i in range(n):
        revision = await kv.put(b"/gpufed/jobs/j", str(i).encode())
    return revision


async def test_compacts_to_the_revision_sampled_one_retention_ago() -> None:
    clock = Clock()
    kv = MemoryKv()
    fence = await _leader(kv)
    compactor = Compactor(kv, retention_s=60.0, clock=clock)
    assert compactor.interval_s == 6.0
    sampled: list[int] = []
    for _ in range(10):  # 54 s of samples: none old enough yet
        await _writes(kv, 5)
        assert await compactor.tick(fence)
        sampled.append(kv.revision)
        clock.now_s += 6.0
    assert compactor.compacted_to == 0
    await _writes(kv, 5)
    assert await compactor.tick(fence)  # now 60 s after the first sample
    assert compactor.compacted_to == sampled[0]
    # History older than that is gone, as etcd would report it; newer history still reads.
    with pytest.raises(WatchCompacted):
        await kv.range_prefix(b"/gpufed/jobs/", revision=sampled[0] - 1)
    assert (await kv.range_prefix(b"/gpufed/jobs/", revision=sampled[1])).kvs


async def test_nothing_newer_than_the_retention_is_compacted() -> None:
    clock = Clock()
    kv = MemoryKv()
    fence = await _leader(kv)
    compactor = Compactor(kv, retention_s=60.0, clock=clock)
    for _ in range(40):
        await _writes(kv, 3)
        await compactor.tick(fence)
        clock.now_s += 6.0
    # The compacted revision is the one sampled a retention (ten samples of three writes) ago, and
    # none of the writes since is compacted.
    assert compactor.compacted_to == kv.revision - 10 * 3


async def test_a_server_that_lost_the_lead_stops_and_compacts_nothing() -> None:
    clock = Clock()
    kv = MemoryKv()
    fence = await _leader(kv)
    compactor = Compactor(kv, retention_s=10.0, clock=clock)
    await compactor.tick(fence)
    await kv.delete(LEADER_KEY)
    await kv.put(LEADER_KEY, b"someone else")
    clock.now_s += 10.0
    await _writes(kv, 3)
    assert not await compactor.tick(fence)
    assert compactor.compacted_to == 0
    assert (await kv.range_prefix(b"/gpufed/jobs/", revision=2)).revision == kv.revision
