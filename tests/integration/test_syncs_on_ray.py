"""Syncs through Ray, on the session's one Ray (`ray_session` in tests/integration/conftest.py):
the same sync split into shards run by Ray tasks, and a staging sync that is verified and whose
progress reaches the end. (In the integration tier since Ray's start, about 12 s of two cores, was
the unit tier's slowest setup.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from datasync import build_manifest, open_store, plan_sync, verify
from datasync.plan import SyncPlan
from datasync.ray_executor import RayExecutor
from datasync.store_config import LocalStoreConfig
from datasync.sync import Executor, run_sync
from federation.datasets.executor import DatasyncSettings, ExecutorKind, Executors
from federation.datasets.staging import GateKind
from federation.datasets.stores import StoreRecord
from federation.datasets.syncs import SyncState
from federation.store.kv_memory import MemoryKv
from tests.unit.test_datasets_staging import KIB, _world, staged_job


async def test_ray_shards_copy_the_whole_version_and_the_marker_is_written_once(
    ray_session: None, tmp_path: Path
) -> None:
    source_cfg, target_cfg = LocalStoreConfig(str(tmp_path / "src")), LocalStoreConfig(str(tmp_path / "dst"))
    source, target = open_store("src", source_cfg), open_store("dst", target_cfg)
    files = {f"part-{i:02d}": os.urandom(3000 + i) for i in range(12)}
    for name, data in files.items():
        await source.put("v1/" + name, data)
    manifest = await build_manifest(source, "v1/")
    executor = RayExecutor(
        source_name="src", source=source_cfg, target_name="dst", target=target_cfg, shard_count=3
    )
    plan = await plan_sync(source, "v1/", target, "cache/", manifest)
    report = await run_sync(plan, source, target, executor=executor)
    assert report.objects_copied == len(files)
    assert report.failures == ()
    assert (await verify(target, "cache/", manifest)).ok
    again = await plan_sync(source, "v1/", target, "cache/", manifest)
    assert again.is_noop


class Spy(Executors):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.chosen: list[Executor | None] = []

    async def for_sync(self, plan: SyncPlan, source: StoreRecord, target: StoreRecord) -> Executor | None:
        executor = await super().for_sync(plan, source, target)
        self.chosen.append(executor)
        return executor


async def test_a_staging_sync_runs_through_ray_verified_to_the_end(ray_session: None, tmp_path: Path) -> None:
    spy = Spy(DatasyncSettings(ExecutorKind.RAY, shard_bytes=4 * KIB), journal_dir=tmp_path / "journal")
    world = _world(tmp_path, MemoryKv(), executors=spy)
    await world.stores.put(StoreRecord("home", LocalStoreConfig(str(tmp_path / "home"))))
    await world.stores.put(StoreRecord("cloud", LocalStoreConfig(str(tmp_path / "cloud"))))
    try:
        files = {f"part-{i}.bin": bytes([i]) * (2 * KIB + i) for i in range(6)}
        await world.register("sharded", files)
        job = staged_job("j", "sharded")
        assert (await world.stager.prepare(job)).kind is GateKind.STAGE
        assert await world.settle(job, timeout_s=60) is GateKind.READY
        (executor,) = spy.chosen
        assert isinstance(executor, RayExecutor)
        held = await world.syncs.get("cloud", "vision/sharded", "v1")
        assert held is not None
        record = held[0]
        total = sum(len(d) for d in files.values())
        assert (record.state, record.verified, record.bytes_copied) == (SyncState.DONE, True, total)
        assert (record.bytes_done, record.objects_done) == (record.bytes_total, record.objects_total)
        assert (record.bytes_total, record.objects_total) == (total, len(files))
        manifest = await world.registry.manifest("vision/sharded", "v1")
        assert manifest is not None
        cloud = await world.stores.client("cloud")
        assert (await verify(cloud, "gpufed-cache/vision/sharded/v1/", manifest)).ok
    finally:
        await world.stager.stop()
        await world.stores.close()
        await spy.close()  # the session's Ray was not started here: it stays up
