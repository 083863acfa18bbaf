"""Syncs, evictions and verifies of one cached copy exclude each other through a fence in etcd (issue 15):
real etcd, two real SeaweedFS servers (the home store and the cloud cache), federation's SyncRunner.

Before the fence, an eviction during a re-sync of the same version deleted the copy's record and objects
while the sync kept writing, and the sync then recorded the copy complete and verified with half its
objects gone; and two leaders could copy one version at once. Each test below fails without the fence.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from datasync import (
    CopyKey,
    DatasetName,
    DatasetVersion,
    ObjectStore,
    StoreLocation,
    StoreName,
    SyncOptions,
    VersionId,
    build_manifest,
)
from datasync.seaweed_process import SeaweedProcess
from datasync.store import Blob, list_all
from federation.datasets.fence import CopyBusy, fence_key, fenced
from federation.datasets.registry import DatasetRegistry, cache_prefix
from federation.datasets.staging_run import SyncRunner, evict_copy
from federation.datasets.stores import StoreDirectory, StoreRecord
from federation.datasets.syncs import SyncRecord, SyncRecords, SyncState
from federation.datasets.trust import check_cached
from federation.store.kv_etcd import EtcdKv
from federation.store.records import SchedulingSettings
from placement.model import TenantId
from tests.integration.seaweed import store_of

pytestmark = pytest.mark.integration

KIB = 1024
OBJECTS = 8
SIZE = 256 * KIB
# About 1 s per sync: long enough to act while it runs.
SLOW = SyncOptions(concurrency=2, bandwidth_bytes_per_s=2 * 1024 * 1024)
# The registry names vision's `race` vision/race (names are per tenant).
KEY = CopyKey(StoreName("cloud"), DatasetName("vision/race"), VersionId("v1"))


@pytest.fixture
def seaweeds(seaweed_pair: tuple[SeaweedProcess, SeaweedProcess]) -> tuple[SeaweedProcess, SeaweedProcess]:
    """The worker's two stores (tests/integration/conftest.py): `home` on one, `fence-cache` on the other,
    buckets no other module writes, since each case here starts from an empty cache."""
    return seaweed_pair


class Counting:
    """A store client that counts the objects written through it (and otherwise is the client)."""

    def __init__(self, inner: ObjectStore) -> None:
        self._inner = inner
        self.puts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def put(self, path: str, data: Blob) -> str | None:
        self.puts += 1
        return await self._inner.put(path, data)


class CountingStores(StoreDirectory):
    def __init__(self, kv: EtcdKv, env: dict[str, str]) -> None:
        super().__init__(kv, env)
        self.wrapped: dict[str, Counting] = {}

    async def client(self, name: str) -> ObjectStore:
        inner = await super().client(name)
        held = self.wrapped.get(name)
        if held is None or held._inner is not inner:
            held = self.wrapped[name] = Counting(inner)
        return held


@dataclass
class Leader:
    stores: CountingStores
    runner: SyncRunner

    async def runs_ended(self, timeout_s: float = 30.0) -> None:
        """Until every sync this leader's runner started has returned: copied, failed, or deferred
        because another holds the copy's fence (the runner keeps its tasks in `_tasks`)."""
        started = list(self.runner._tasks.values())
        assert started, "the runner started no sync"
        await asyncio.wait_for(asyncio.gather(*started), timeout_s)


@dataclass
class World:
    kv: EtcdKv
    registry: DatasetRegistry
    syncs: SyncRecords
    env: dict[str, str]
    version: DatasetVersion
    leaders: list[Leader]

    def leader(self, root: Path) -> Leader:
        stores = CountingStores(self.kv, self.env)

        async def settings() -> SchedulingSettings:
            return SchedulingSettings()

        runner = SyncRunner(
            registry=self.registry, syncs=self.syncs, stores=stores, settings=settings,
            journal_dir=root / f"journal-{len(self.leaders)}", options=SLOW,
        )  # fmt: skip
        leader = Leader(stores, runner)
        self.leaders.append(leader)
        return leader

    async def state(self) -> SyncState | None:
        held = await self.syncs.get(KEY.store, KEY.dataset, KEY.version)
        return None if held is None else held[0].state

    async def until(self, *states: SyncState, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while await self.state() not in states:
            assert time.monotonic() < deadline, f"sync still {await self.state()}"
            await asyncio.sleep(0.02)

    async def request(self) -> None:
        await self.syncs.request(SyncRecord.requested(self.version, "cloud", time.time()))

    async def target(self) -> ObjectStore:
        return await self.leaders[0].stores.client("cloud")

    async def objects(self) -> set[str]:
        prefix = cache_prefix(KEY.dataset, KEY.version)
        return {
            m.path[len(prefix) :]
            for m in await list_all(await self.target(), prefix)
            if not m.path[len(prefix) :].startswith(".gpufed/")
        }


@pytest.fixture
async def world(
    etcd_kv: EtcdKv, seaweeds: tuple[SeaweedProcess, SeaweedProcess], tmp_path: Path
) -> AsyncIterator[World]:
    home, cloud = store_of(seaweeds[0], "home", "home"), store_of(seaweeds[1], "cloud", "fence-cache")
    env = {**home.env, **cloud.env}
    directory = StoreDirectory(etcd_kv, env)
    await directory.put(StoreRecord("home", home.config))
    await directory.put(StoreRecord("cloud", cloud.config))
    source = await directory.client("home")
    prefix = f"race-{tmp_path.name}/"
    for i in range(OBJECTS):
        await source.put(f"{prefix}part-{i}.bin", bytes([i]) * SIZE)
    manifest = await build_manifest(source, prefix)
    version = DatasetVersion(
        DatasetName("race"), VersionId("v1"), StoreLocation(StoreName("home"), prefix),
        manifest.digest, manifest.total_size_bytes, manifest.object_count, created_at_s=1.0,
    )  # fmt: skip
    registry = DatasetRegistry(etcd_kv)
    dataset, _ = await registry.add_version(TenantId("vision"), version, manifest, frozenset())
    version = dataset.versions[0]
    assert version.dataset == KEY.dataset
    w = World(etcd_kv, registry, SyncRecords(etcd_kv), env, version, [])
    w.leader(tmp_path)
    # Start from an empty cache: a previous test's copy of the same key must not count.
    cloud_client = await directory.client("cloud")
    stale = await list_all(cloud_client, cache_prefix(KEY.dataset, KEY.version))
    if stale:
        await cloud_client.delete([m.path for m in stale])
    try:
        yield w
    finally:
        for leader in w.leaders:
            await leader.runner.stop()
            await leader.stores.close()
        await directory.close()


async def test_an_eviction_is_refused_while_a_resync_of_the_same_copy_runs(world: World) -> None:
    (leader,) = world.leaders
    await world.request()
    await leader.runner.start_missing()
    await world.until(SyncState.DONE)
    assert await world.objects() == {f"part-{i}.bin" for i in range(OBJECTS)}
    # Half the copy disappears (a third party on the bucket); a re-sync repairs it ...
    target = await world.target()
    prefix = cache_prefix(KEY.dataset, KEY.version)
    await target.delete([f"{prefix}part-{i}.bin" for i in range(OBJECTS // 2)])
    assert len(await check_cached(world.registry, leader.stores, KEY)) == OBJECTS // 2
    await world.request()
    await leader.runner.start_missing()
    await world.until(SyncState.RUNNING)
    # ... and an eviction of the same copy meanwhile is refused, deleting nothing.
    held = await world.registry.get_copy(KEY)
    assert held is not None
    with pytest.raises(CopyBusy, match="a sync of it runs"):
        await evict_copy(world.registry, world.syncs, target, KEY, held[1])
    await world.until(SyncState.DONE)
    assert await check_cached(world.registry, leader.stores, KEY) == ()
    assert await world.objects() == {f"part-{i}.bin" for i in range(OBJECTS)}
    # Once the sync is over the eviction goes through: record, objects, and "done, verified" all go.
    held = await world.registry.get_copy(KEY)
    assert held is not None
    await evict_copy(world.registry, world.syncs, target, KEY, held[1])
    assert await world.registry.get_copy(KEY) is None
    assert await world.objects() == set()
    record = await world.syncs.get(KEY.store, KEY.dataset, KEY.version)
    assert record is not None
    assert (record[0].state, record[0].verified) == (SyncState.EVICTED, False)


async def test_a_sync_waits_out_an_eviction_holding_the_copy_then_copies_it_whole(world: World) -> None:
    (leader,) = world.leaders
    async with fenced(world.kv, KEY, "evict"):
        await world.request()
        await leader.runner.start_missing()
        await leader.runs_ended()  # the sync tried, and gave way to the eviction
        # Deferred, not failed: the record is still asked for and nothing was written.
        assert await world.state() is SyncState.REQUESTED
        assert leader.stores.wrapped.get("cloud") is None or leader.stores.wrapped["cloud"].puts == 0
    await leader.runner.start_missing()
    await world.until(SyncState.DONE)
    assert await check_cached(world.registry, leader.stores, KEY) == ()


async def test_two_leaders_syncing_one_copy_copy_it_once(world: World, tmp_path: Path) -> None:
    first = world.leaders[0]
    second = world.leader(tmp_path)
    await world.request()
    # Both leaders see the same requested record at the same moment (an old leader that has not yet
    # noticed it lost its lease, and the new one).
    await asyncio.gather(first.runner.start_missing(), second.runner.start_missing())
    await world.until(SyncState.DONE)
    for leader in (first, second):
        await leader.runner.stop()
    puts = [
        leader.stores.wrapped["cloud"].puts if "cloud" in leader.stores.wrapped else 0
        for leader in (first, second)
    ]
    # Exactly one copied the objects (each once, plus its marker); the other wrote nothing.
    assert sorted(puts)[0] == 0, puts
    assert OBJECTS <= sorted(puts)[1] <= OBJECTS + 1, puts
    copies = [c for c in (await world.registry.copies()).copies if c.key == KEY]
    assert len(copies) == 1
    assert await check_cached(world.registry, first.stores, KEY) == ()


async def test_a_sync_that_lost_its_fence_does_not_record_the_copy(world: World) -> None:
    (leader,) = world.leaders
    await world.request()
    await leader.runner.start_missing()
    await world.until(SyncState.RUNNING)
    # Its lease expired while it was paused, say, and an eviction took the fence meanwhile.
    await world.kv.delete(fence_key(KEY))
    async with fenced(world.kv, KEY, "evict"):
        await world.until(SyncState.REQUESTED)  # asked for again, not failed: nothing was wrong with it
        record = await world.syncs.get(KEY.store, KEY.dataset, KEY.version)
        assert record is not None
        assert "lost the fence" in record[0].error
        assert await world.registry.get_copy(KEY) is None
        # The sync that lost its fence has ended (not just written its record), so that this start
        # is a new attempt, deferred while the eviction holds the fence.
        await leader.runs_ended()
        await leader.runner.start_missing()
        await leader.runs_ended()
        assert await world.state() is SyncState.REQUESTED
    await leader.runner.start_missing()
    await world.until(SyncState.DONE)
    assert await check_cached(world.registry, leader.stores, KEY) == ()
