"""Issue 30, item 13: `run_sync` counts a copy as verified only by a listing taken after its last write.

A third party (here: a store that loses objects behind the sync's back) deletes or overwrites objects
the sync has already written; the sync copies them again before it reports them verified, deletes
objects that are not of the version when it owns the prefix, and fails (retryable) when the copy never
holds still.
"""

from __future__ import annotations

import os

import pytest

from datasync.errors import SyncFailed
from datasync.manifest import build_manifest
from datasync.marker import normalize_etag
from datasync.model import Manifest
from datasync.plan import plan_sync
from datasync.store import list_all
from datasync.store_memory import MemoryStore
from datasync.sync import CONFIRM_ROUNDS, SyncReport, run_sync
from datasync.verify import verify

KIB = 1024


class ThirdParty(MemoryStore):
    """A target where someone else deletes the first `victims` objects after the sync's `after`th put,
    and overwrites one with other bytes of the same size."""

    def __init__(self, *, after: int, victims: int, overwrite: bool = False) -> None:
        super().__init__("dst", endpoint="other")
        self._after, self._victims, self._overwrite = after, victims, overwrite
        self._order: list[str] = []
        self.acted = False

    async def put(self, path: str, data: bytes | memoryview) -> str | None:
        etag = await super().put(path, data)
        if not path.endswith("/") and ".gpufed/" not in path:
            self._order.append(path)
        if not self.acted and len(self._order) == self._after:
            self.acted = True
            for victim in self._order[: self._victims]:
                self.objects.pop(victim, None)
            if self._overwrite:
                last = self._order[-1]
                self.write(last, os.urandom(len(self.objects[last][0])))
        return etag


async def _source(n: int = 12) -> tuple[MemoryStore, Manifest]:
    source = MemoryStore("src")
    for i in range(n):
        source.write(f"v1/{i:02d}.bin", os.urandom(3 * KIB + i))
    return source, await build_manifest(source, "v1/")


async def _sync(
    source: MemoryStore, target: MemoryStore, manifest: Manifest, *, owns_prefix: bool = False
) -> SyncReport:
    plan = await plan_sync(source, "v1/", target, "c/", manifest)
    return await run_sync(plan, source, target, owns_prefix=owns_prefix)


async def test_objects_deleted_and_overwritten_mid_sync_are_copied_again_before_it_says_verified() -> None:
    source, manifest = await _source()
    target = ThirdParty(after=8, victims=5, overwrite=True)
    report = await _sync(source, target, manifest)
    assert target.acted
    assert (await verify(target, "c/", manifest)).ok
    listed = {m.path.removeprefix("c/"): normalize_etag(m.etag) for m in await list_all(target, "c/")}
    assert report.verified_etags == {p: listed[p] for p in manifest.by_path()}
    assert report.progress is not None
    assert report.progress.objects_done == manifest.object_count
    assert report.progress.bytes_done == manifest.total_size_bytes


async def test_a_stray_goes_only_from_a_prefix_the_sync_owns() -> None:
    source, manifest = await _source(4)
    target = MemoryStore("dst", endpoint="other")
    target.write("c/stray.txt", b"not of the version")
    await _sync(source, target, manifest)
    assert "c/stray.txt" in target.objects
    report = await verify(target, "c/", manifest)
    assert report.unexpected == ("stray.txt",)
    assert not report.ok
    await _sync(source, target, manifest, owns_prefix=True)
    assert "c/stray.txt" not in target.objects
    assert (await verify(target, "c/", manifest)).ok


async def test_a_copy_that_never_holds_still_fails_retryable_naming_the_object() -> None:
    source, manifest = await _source(3)

    class Vanishing(MemoryStore):
        async def put(self, path: str, data: bytes | memoryview) -> str | None:
            etag = await super().put(path, data)
            if path.endswith("01.bin"):
                self.objects.pop(path)
            return etag

    with pytest.raises(SyncFailed) as failed:
        await _sync(source, Vanishing("dst", endpoint="other"), manifest)
    assert failed.value.retryable
    assert "01.bin" in str(failed.value)
    assert f"after {CONFIRM_ROUNDS} copies again" in str(failed.value)
