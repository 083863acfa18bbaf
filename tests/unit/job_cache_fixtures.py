"""The in-memory job store and a started job cache over it, as fixtures shared by the cache's tests
(import the `*_fixture` names; they are `store` and `cache` to the tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from federation.store.job_cache import JobCache
from federation.store.job_store import InMemoryJobStore, KvStore
from federation.store.kv_memory import MemoryKv


@pytest.fixture(name="store")
def store_fixture() -> KvStore:
    return InMemoryJobStore(MemoryKv())


@pytest.fixture(name="cache")
async def cache_fixture(store: KvStore) -> AsyncIterator[JobCache]:
    started = JobCache(store)
    await started.start()
    yield started
    await started.stop()
