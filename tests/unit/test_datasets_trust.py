"""Trusting copies and registrations, over the in-memory etcd twin and real local-directory stores: the
reserved cache prefix, prefix grants (config, admin override, clearing), the check before dispatch that
re-stages a damaged copy, and the periodic scrub that repairs one."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from datasync import CopyKey, DatasetName, StoreName, VersionId
from datasync.store_config import LocalStoreConfig
from federation.datasets.executor import DatasyncSettings, Executors, parse_datasync
from federation.datasets.grants import GrantDirectory, allows
from federation.datasets.registry import prefix_field
from federation.datasets.staging import GateKind
from federation.datasets.stores import StoreRecord, parse_object_stores, store_from_json, store_to_json
from federation.datasets.trust import check_cached, verify_cached
from federation.errors import InvalidSpec
from federation.store.kv_memory import MemoryKv
from tests.unit.test_datasets_staging import World, _world, staged_job

KEY = CopyKey(StoreName("cloud"), DatasetName("vision/mini"), VersionId("v1"))
FILES = {"a.bin": b"a" * 3000, "b.bin": b"b" * 1000}


@pytest.mark.parametrize("prefix", ["gpufed-cache/", "gpufed-cache/other/v1/", "gpufed-cache", ".gpufed/x/"])
def test_no_home_may_lie_under_the_cache_or_gpufeds_state(prefix: str) -> None:
    with pytest.raises(InvalidSpec, match="reserved"):
        prefix_field(prefix)
    assert prefix_field("gpufed-cache-old/x") == "gpufed-cache-old/x/"  # only the exact root is reserved


def _stores(prefixes: object = None) -> StoreRecord:
    body: dict[str, object] = {"kind": "local", "root": "/tmp/x"}
    if prefixes is not None:
        body["datasetPrefixes"] = prefixes
    (record,) = parse_object_stores({"objectStores": {"lab": body}})
    return record


async def test_grants_default_to_the_tenants_own_prefix_and_an_admins_record_wins_until_cleared() -> None:
    grants = GrantDirectory(MemoryKv())
    default = _stores()
    assert (await grants.effective("lab", "vision", default.dataset_prefixes)).prefixes == ("vision/",)
    configured = _stores({"*": ["data/{tenant}/"], "research": ["shared/", "data/research/"]})
    assert store_from_json("lab", store_to_json(configured)).dataset_prefixes == configured.dataset_prefixes
    assert (await grants.effective("lab", "nlp", configured.dataset_prefixes)).prefixes == ("data/nlp/",)
    research = await grants.effective("lab", "research", configured.dataset_prefixes)
    assert research.prefixes == ("shared/", "data/research/")
    await grants.set("lab", "nlp", ["corpora/nlp/"], by="admin", at_s=1.0)
    held = await grants.effective("lab", "nlp", configured.dataset_prefixes)
    assert (held.prefixes, held.source) == (("corpora/nlp/",), "admin")
    await grants.set("lab", "nlp", [], by="admin", at_s=2.0)
    assert (await grants.effective("lab", "nlp", configured.dataset_prefixes)).source == "config"


def test_a_grant_covers_whole_segments_only() -> None:
    assert allows(["vision/"], "vision/a/")
    assert allows(["vision"], "vision/")
    assert not allows(["vision/"], "visionary/a/")
    assert not allows([], "vision/")


@pytest.mark.parametrize(
    "prefixes",
    [["../{tenant}/"], ["gpufed-cache/{tenant}/"], "vision/", {"*": "vision/"}, {"Bad Name": ["x/"]}],
)
def test_bad_dataset_prefixes_in_the_config_name_the_field(prefixes: object) -> None:
    with pytest.raises(InvalidSpec) as refused:
        _stores(prefixes)
    assert "objectStores.lab.datasetPrefixes" in str(refused.value)


def test_the_scrub_interval_is_a_datasync_setting() -> None:
    assert parse_datasync({}).scrub_interval_s == 600.0
    assert parse_datasync({"datasync": {"scrubIntervalSeconds": 5}}).scrub_interval_s == 5.0
    with pytest.raises(InvalidSpec, match="scrubIntervalSeconds"):
        parse_datasync({"datasync": {"scrubIntervalSeconds": -1}})


async def _world_with_stores(root: Path, *, scrub_s: float = 0.0) -> World:
    executors = Executors(DatasyncSettings(scrub_interval_s=scrub_s), journal_dir=root / "journal")
    w = _world(root, MemoryKv(), executors=executors)
    await w.stores.put(StoreRecord("home", LocalStoreConfig(str(root / "home"))))
    await w.stores.put(StoreRecord("cloud", LocalStoreConfig(str(root / "cloud"))))
    await w.register("mini", FILES)
    return w


async def test_a_copy_damaged_after_its_sync_is_staged_again_before_the_next_job(tmp_path: Path) -> None:
    w = await _world_with_stores(tmp_path)
    try:
        first = staged_job("first", "mini")
        await w.stager.prepare(first)
        assert await w.settle(first) is GateKind.READY
        copy = tmp_path / "cloud" / "gpufed-cache/vision/mini/v1"
        (copy / "b.bin").unlink()
        assert await check_cached(w.registry, w.stores, KEY) == ("b.bin",)
        second = staged_job("second", "mini")
        gate = await w.stager.prepare(second)
        assert gate.kind is GateKind.STAGE  # not READY: the copy failed its check
        assert await w.settle(second) is GateKind.READY
        assert (copy / "b.bin").read_bytes() == FILES["b.bin"]
        held = await w.syncs.get("cloud", "vision/mini", "v1")
        assert held is not None
        assert (held[0].objects_copied, held[0].objects_up_to_date) == (1, 1)
        # An overwrite of the same size changes the object's ETag: the check catches it too.
        (copy / "a.bin").write_bytes(b"x" * 3000)
        assert await check_cached(w.registry, w.stores, KEY) != ()
    finally:
        await w.stager.stop()
        await w.stores.close()


async def test_the_scrub_rehashes_and_repairs_a_copy_on_the_leaders_tick(tmp_path: Path) -> None:
    w = await _world_with_stores(tmp_path, scrub_s=0.01)
    try:
        job = staged_job("first", "mini")
        await w.stager.prepare(job)
        assert await w.settle(job) is GateKind.READY
        target = tmp_path / "cloud" / "gpufed-cache/vision/mini/v1/a.bin"
        target.write_bytes(b"z" * 3000)  # same size: only re-reading finds it
        before = await w.registry.copy_etags(KEY)
        assert before is not None
        # The repair rewrites the object first and records the new verification after it: wait for
        # both, or a busy machine can look between the two (seen once with four workers under load).
        after = before
        for _ in range(200):
            await asyncio.sleep(0.02)
            await w.stager.tick([])
            read = await w.registry.copy_etags(KEY)
            assert read is not None
            after = read
            if target.read_bytes() == FILES["a.bin"] and after.verified_at_s > before.verified_at_s:
                break
        assert target.read_bytes() == FILES["a.bin"]
        assert after.verified_at_s > before.verified_at_s
        assert await check_cached(w.registry, w.stores, KEY) == ()
    finally:
        await w.stager.stop()
        await w.stores.close()


async def test_bit_rot_under_an_unchanged_etag_found_by_verify_fails_the_next_check(tmp_path: Path) -> None:
    w = await _world_with_stores(tmp_path)
    try:
        job = staged_job("first", "mini")
        await w.stager.prepare(job)
        assert await w.settle(job) is GateKind.READY
        target = tmp_path / "cloud" / "gpufed-cache/vision/mini/v1/a.bin"
        stat = target.stat()
        target.write_bytes(b"r" * 3000)
        os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same ETag: rot
        assert await check_cached(w.registry, w.stores, KEY) == ()  # one listing cannot see it
        found = await verify_cached(w.registry, w.stores, KEY, repair=False)
        assert (found.wrong_hash, found.ok) == (("a.bin",), False)
        # Verify dropped it from etcd's record: the next dispatch's check fails and re-stages it.
        assert await check_cached(w.registry, w.stores, KEY) == ("a.bin",)
        second = staged_job("second", "mini")
        assert (await w.stager.prepare(second)).kind is GateKind.STAGE
        assert await w.settle(second) is GateKind.READY
        assert target.read_bytes() == FILES["a.bin"]
    finally:
        await w.stager.stop()
        await w.stores.close()
