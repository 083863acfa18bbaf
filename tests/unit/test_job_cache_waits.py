"""`JobCache.wait_for_revision`: each waiter is woken when the cache reaches its revision, not
before, and a waiter that gives up leaves nothing behind. The cache keeps one future a waited
revision rather than a new asyncio.Event at every revision it passes (issue 33)."""

from __future__ import annotations

import asyncio

import pytest

from federation.store.job_cache import JobCache
from federation.store.job_store import KvStore
from tests.conftest import build_job
from tests.unit.job_cache_fixtures import cache_fixture, store_fixture  # noqa: F401 (the `cache` and `store` fixtures)


async def _create(store: KvStore, name: str) -> int:
    stored, _ = await store.create_job(build_job(name), idempotency_key=name, manifest_digest="d")
    return stored.mod_revision


async def _turns(n: int = 20) -> None:
    """Let every task that can run, run (no time passes)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_each_waiter_wakes_at_its_own_revision(store: KvStore, cache: JobCache) -> None:
    start = cache.revision
    assert await cache.wait_for_revision(start)  # reached already: no wait
    # Waiters for the next three revisions, made out of order, two for the same one.
    waits = {
        offset: [asyncio.create_task(cache.wait_for_revision(start + offset, timeout_s=30)) for _ in range(2)]
        for offset in (3, 1, 2)
    }
    await _turns()
    for offset in (1, 2, 3):
        written = await _create(store, f"j{offset}")
        assert written == start + offset
        assert await cache.wait_for_revision(written, timeout_s=30)
        await _turns()
        for other, tasks in waits.items():
            for task in tasks:
                assert task.done() is (other <= offset), (offset, other)
                if task.done():
                    assert task.result() is True
    assert not cache._waiters


async def test_a_waiter_that_times_out_is_false_and_is_forgotten(store: KvStore, cache: JobCache) -> None:
    far = cache.revision + 1_000
    results = await asyncio.gather(*(cache.wait_for_revision(far, timeout_s=0.01) for _ in range(200)))
    assert results == [False] * 200
    # Past 64 gone waiters they are swept: a wait for a revision no job write reaches leaves no
    # growing list behind it.
    assert len(cache._waiters) <= 64
    # A cancelled waiter too, and one waiting on is still woken.
    cancelled = asyncio.create_task(cache.wait_for_revision(cache.revision + 1, timeout_s=30))
    waiting = asyncio.create_task(cache.wait_for_revision(cache.revision + 1, timeout_s=30))
    await _turns()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await _create(store, "late")
    assert await waiting is True


async def test_a_waiter_keeps_waiting_while_the_revision_is_short_of_its_own(
    store: KvStore, cache: JobCache
) -> None:
    target = cache.revision + 2
    task = asyncio.create_task(cache.wait_for_revision(target, timeout_s=30))
    await _create(store, "one")
    assert await cache.wait_for_revision(target - 1, timeout_s=30)
    await _turns()
    assert not task.done()
    await _create(store, "two")
    assert await task is True
