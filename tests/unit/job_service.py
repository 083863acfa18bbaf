"""The job API's servicer over a store and its cache, as the unit tests build it: each call's
authenticator, metrics, tenant directory and dataset check are the store's own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import cast

from federation.api.service import Ctx, JobService
from federation.console.calls import CallContext
from federation.datasets.check import DatasetCheck
from federation.datasets.registry import DatasetRegistry
from federation.history.protocol import HistoryStore
from federation.metrics import Metrics
from federation.runtime.server import TenantDirectory
from federation.security.auth import Authenticator
from federation.store.job_cache import JobCache
from federation.store.job_store import JobEvent, KvStore
from federation.store.kv_memory import MemoryKv
from federation.store.records import Role, TenantRecord, UserRecord
from placement.model import TenantId

# The servicers run in process with the console's own call context: the metadata, peer and abort a
# gRPC server would give them.
PEER = "ipv4:127.0.0.1:40000"


def as_user(who: str, peer: str = PEER) -> Ctx:
    """The console's in-process context for `who`'s calls (bearer token `who`).

    CallContext has what the servicers use (metadata, peer, abort), not the rest of grpc's abstract
    ServicerContext, so mypy cannot take it for one: this is the one place that says so.
    """
    return cast(Ctx, CallContext(who, peer))


def job_service(store: KvStore, cache: JobCache, *, history: HistoryStore | None = None) -> JobService:
    return JobService(
        store=store,
        cache=cache,
        auth=Authenticator(store),
        metrics=Metrics(),
        tenants=TenantDirectory(store),
        datasets=DatasetCheck(DatasetRegistry(store.kv)),
        history=history,
    )


class GatedStore(KvStore):
    """The in-memory store (the real KvStore over a MemoryKv), whose watch delivers nothing while the
    gate is shut: a server's job cache trailing etcd, held back as long as a test needs."""

    def __init__(self) -> None:
        super().__init__(MemoryKv())
        self.gate = asyncio.Event()
        self.gate.set()

    async def watch_jobs(self, *, start_revision: int) -> AsyncGenerator[JobEvent, None]:
        async for event in super().watch_jobs(start_revision=start_revision):
            await self.gate.wait()
            yield event


@asynccontextmanager
async def running_service(store: KvStore) -> AsyncIterator[tuple[JobCache, JobService]]:
    """The job API over `store` and its cache, the cache following the store until the block ends."""
    cache = JobCache(store)
    await cache.start()
    try:
        yield cache, job_service(store, cache)
    finally:
        await cache.stop()


@asynccontextmanager
async def gated_service_for_alice() -> AsyncIterator[tuple[GatedStore, JobCache, JobService]]:
    """The job API over a `GatedStore` and its cache, with one member, alice (token "alice"), of the
    tenant "vision"."""
    store = GatedStore()
    await store.put_tenant(TenantRecord(TenantId("vision")))
    await store.put_user(UserRecord("alice", TenantId("vision"), Role.MEMBER))
    await store.put_token("alice", "alice")
    async with running_service(store) as (cache, service):
        yield store, cache, service
