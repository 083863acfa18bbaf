"""The job API's servicer over a store and its cache, as the unit tests build it: each call's
authenticator, metrics, tenant directory and dataset check are the store's own."""

from __future__ import annotations

from federation.api.service import JobService
from federation.datasets.check import DatasetCheck
from federation.datasets.registry import DatasetRegistry
from federation.history.protocol import HistoryStore
from federation.metrics import Metrics
from federation.runtime.server import TenantDirectory
from federation.security.auth import Authenticator
from federation.store.job_cache import JobCache
from federation.store.job_store import KvStore


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
