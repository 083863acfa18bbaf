"""Where staging's copies run: the `datasync:` config section (each bad key refused naming it), shards by
bytes, the local executor by default without importing ray. A staging sync through Ray is in
tests/integration/test_syncs_on_ray.py (it starts Ray)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from datasync import build_manifest, open_store, plan_sync
from datasync.store_config import LocalStoreConfig
from federation.datasets.executor import (
    DatasyncSettings,
    ExecutorKind,
    Executors,
    parse_datasync,
    settings_from_json,
    settings_to_json,
    shard_count,
)
from federation.datasets.stores import StoreRecord
from federation.errors import InvalidSpec
from federation.runtime.config import parse_config

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
        pytest.param({"maxBytesPerSecond": -1}, "datasync.maxBytesPerSecond", id="rate-negative"),
        pytest.param({"maxBytesPerSecond": float("nan")}, "datasync.maxBytesPerSecond", id="rate-nan"),
        pytest.param({"maxBytesPerSecond": float("inf")}, "datasync.maxBytesPerSecond", id="rate-inf"),
        pytest.param({"maxBytesPerSecond": "4MiB"}, "datasync.maxBytesPerSecond", id="rate-text"),
        pytest.param({"shards": 4}, "datasync.shards", id="unknown-key"),
    ],
)
def test_bad_datasync_settings_name_the_key(section: Any, field: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_datasync({"datasync": section})
    assert caught.value.field == field


def test_a_rate_cap_paces_local_syncs_and_none_leaves_datasyncs_defaults() -> None:
    assert DatasyncSettings().sync_options() is None
    capped = parse_datasync({"datasync": {"maxBytesPerSecond": 4 * 2**20}})
    assert settings_from_json(settings_to_json(capped)) == capped
    options = capped.sync_options()
    assert options is not None
    assert options.bandwidth_bytes_per_s == 4 * 2**20
    # A section stored before the setting existed reads as uncapped.
    assert settings_from_json(
        b'{"executor": "local", "shard_bytes": 1, "max_shards": 1, "cpus_per_shard": 1}'
    ) == (DatasyncSettings(shard_bytes=1, max_shards=1))


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
