"""Where staging's copies run: the `datasync:` config section (each bad key refused naming it), shards by
bytes, the local executor by default without importing ray, and one staging sync through Ray (the
session's one Ray, `ray_session` in conftest.py) that is verified and whose progress reaches the end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from datasync import build_manifest, open_store, plan_sync, verify
from datasync.plan import SyncPlan
from datasync.ray_executor import RayExecutor
from datasync.store_config import LocalStoreConfig
from datasync.sync import Executor
from federation.datasets.executor import (
    DatasyncSettings,
    ExecutorKind,
    Executors,
    parse_datasync,
    settings_from_json,
    settings_to_json,
    shard_count,
)
from federation.datasets.staging import GateKind
from federation.datasets.stores import StoreRecord
from federation.datasets.syncs import SyncState
from federation.errors import InvalidSpec
from federation.runtime.config import parse_config
from federation.store.kv_memory import MemoryKv
from tests.unit.test_datasets_staging import KIB, _world, staged_job

ROOT = Path(__file__).resolve().parents[2]


def test_local_is_the_default_and_every_key_is_read() -> None:
    assert parse_datasync({}) == DatasyncSettings()
    assert DatasyncSettings().executor is ExecutorKind.LOCAL
    doc = {
        "datasync": {
            "executor": "ray",
            "rayAddress": "ray://head:10001",
            "shardBytes": 1000,
            "maxShards": 3,
            "cpusPerShard": 0.5,
        }
    }
    settings = parse_datasync(doc)
    assert settings == DatasyncSettings(ExecutorKind.RAY, "ray://head:10001", 1000, 3, 0.5)
    assert settings_from_json(settings_to_json(settings)) == settings


@pytest.mark.parametrize(
    ("section", "field"),
    [
        pytest.param([], "datasync", id="not-a-mapping"),
        pytest.param({"executor": "dask"}, "datasync.executor", id="executor"),
        pytest.param({"rayAddress": ""}, "datasync.rayAddress", id="empty-address"),
        pytest.param({"rayAddress": 5}, "datasync.rayAddress", id="address-not-text"),
        pytest.param({"shardBytes": 0}, "datasync.shardBytes", id="shard-bytes"),
        pytest.param({"maxShards": 1.5}, "datasync.maxShards", id="max-shards"),
        pytest.param({"cpusPerShard": -1}, "datasync.cpusPerShard", id="cpus"),
        pytest.param({"shards": 4}, "datasync.shards", id="unknown-key"),
    ],
)
def test_bad_datasync_settings_name_the_key(section: Any, field: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_datasync({"datasync": section})
    assert caught.value.field == field


def test_the_config_file_carries_the_section() -> None:
    config = parse_config("tenants: []\ndatasync: {executor: ray, shardBytes: 4096}\n")
    assert (config.datasync.executor, config.datasync.shard_bytes) == (ExecutorKind.RAY, 4096)


@pytest.mark.parametrize(
    ("copy_bytes", "expected"), [(0, 1), (1, 1), (4096, 1), (4097, 2), (10**9, 8)], ids=str
)
def test_shards_follow_the_bytes_up_to_the_limit(copy_bytes: int, expected: int) -> None:
    assert (
        shard_count(DatasyncSettings(ExecutorKind.RAY, shard_bytes=4096, max_shards=8), copy_bytes)
        == expected
    )


def test_choosing_an_executor_does_not_import_ray() -> None:
    code = (
        "import sys, federation.runtime.server, federation.datasets.executor; assert 'ray' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


async def test_the_local_executor_is_datasyncs_own(tmp_path: Path) -> None:
    home = StoreRecord("home", LocalStoreConfig(str(tmp_path / "home")))
    cloud = StoreRecord("cloud", LocalStoreConfig(str(tmp_path / "cloud")))
    source, target = open_store("home", home.config), open_store("cloud", cloud.config)
    await source.put("v1/a.bin", b"a" * 100)
    plan = await plan_sync(source, "v1/", target, "c/", await build_manifest(source, "v1/"))
    assert plan.to_copy
    executors = Executors(DatasyncSettings(), journal_dir=tmp_path)
    assert await executors.for_sync(plan, home, cloud) is None  # run_sync's LocalExecutor


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
