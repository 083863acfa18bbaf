"""The Ray executor's shards, and `import datasync` not importing ray. A sync through Ray itself is
in tests/integration/test_syncs_on_ray.py (it starts Ray)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from datasync.model import ManifestEntry
from datasync.ray_executor import split_into_shards


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
