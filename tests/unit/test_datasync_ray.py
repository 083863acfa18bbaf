"""The Ray executor: the same sync split into shards run by Ray tasks (one Ray start for the session,
`ray_session` in conftest.py), and `import datasync` not importing ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from datasync.manifest import build_manifest
from datasync.model import ManifestEntry
from datasync.plan import plan_sync
from datasync.ray_executor import RayExecutor, split_into_shards
from datasync.store_config import LocalStoreConfig, open_store
from datasync.sync import run_sync
from datasync.verify import verify


def test_importing_datasync_does_not_import_ray() -> None:
    code = "import sys, datasync, datasync.sync, datasync.ray_executor; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


@pytest.mark.parametrize(
    ("sizes", "shards", "expected_loads"),
    [([10, 1, 1, 1, 1], 2, [10, 4]), ([5, 5, 5, 5], 3, [10, 5, 5]), ([3], 4, [3])],
    ids=["big-alone", "even", "fewer-objects-than-shards"],
)
def test_shards_balance_bytes(sizes: list[int], shards: int, expected_loads: list[int]) -> None:
    entries = [ManifestEntry(f"f{i}", s, "h") for i, s in enumerate(sizes)]
    split = split_into_shards(entries, shards)
    assert sorted((sum(e.size_bytes for e in s) for s in split), reverse=True) == expected_loads
    assert sorted(e.path for s in split for e in s) == sorted(e.path for e in entries)


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
