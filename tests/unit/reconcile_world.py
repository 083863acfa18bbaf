"""A small federation over the in-memory store and simulated clusters, on a fake clock.

Tests drive `step()` by hand, so every transition is deterministic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from clusters.memory import InMemoryCluster
from federation.ledger.cache import LedgerCache
from federation.metrics import Metrics
from federation.scheduling.members import MemberClusters
from federation.scheduling.reconciler import Reconciler
from federation.scheduling.scheduler import Scheduler
from federation.spec.jobspec import RestartPolicy
from federation.store.job_cache import JobCache
from federation.store.job_store import InMemoryJobStore, KvStore
from federation.store.jobs import JobRecord
from federation.store.records import ClusterRecord, PoolConfig, SchedulingSettings, TenantRecord
from placement.model import CapacityKind, ClusterName, GpuType, JobId, Provider, TenantId
from tests.job_builder import build_job

A100 = GpuType("A100")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    store: KvStore
    cache: JobCache
    clusters: dict[str, InMemoryCluster]
    scheduler: Scheduler
    reconciler: Reconciler
    clock: Clock
    ledger: LedgerCache
    members: MemberClusters

    def another_scheduler(self) -> Scheduler:
        """A second server's scheduler over the same store, caches and clusters: a standby, or the
        leader that takes over, with nothing in memory of what this world's scheduler wrote."""
        return Scheduler(
            store=self.store,
            cache=self.cache,
            ledger=self.ledger,
            members=self.members,
            metrics=Metrics(),
            clock=self.clock,
        )

    def fresh_reconciler(self, **parts: Any) -> Reconciler:
        """A reconciler over this world's store, cache and clusters with nothing in memory (a new
        leader's), given any of the optional parts a server wires in (`keeper`, `secrets`, ...)."""
        return Reconciler(
            store=self.store,
            cache=self.cache,
            members=self.members,
            metrics=Metrics(),
            clock=self.clock,
            **parts,
        )

    @property
    def cluster(self) -> InMemoryCluster:
        """The first (private, cheapest) cluster: the one jobs land on while it has room."""
        return next(iter(self.clusters.values()))

    async def step(self, seconds: float = 0.0) -> None:
        """Advance the clock, then run what the leader's loop runs, letting the cache catch up."""
        self.clock.now += seconds
        for _ in range(3):
            await self.reconciler.tick(None)
            await self.caught_up()
            await self.scheduler.run_cycle(None)
            await self.caught_up()

    async def caught_up(self) -> None:
        # The cache watches job keys only: wait for the latest job write, not the store's revision
        # (wait reasons and approvals move that too, and the cache would never reach it).
        jobs, _ = await self.store.list_jobs()
        await self.cache.wait_for_revision(max((j.mod_revision for j in jobs), default=0))

    async def job(self, job_id: JobId) -> JobRecord:
        stored = await self.store.get_job(job_id)
        assert stored is not None
        return stored.value


# Name, provider, price per GPU-hour: the first is private and cheapest, so jobs go there first.
_CLUSTERS = (
    ("onprem", Provider.PRIVATE, CapacityKind.PRIVATE, 1.1),
    ("cloud", Provider.AWS, CapacityKind.ON_DEMAND, 4.0),
)


@asynccontextmanager
async def build_world(
    *,
    cluster_count: int = 1,
    unreachable_grace_s: float = 120.0,
    tenants: tuple[TenantRecord, ...] = (TenantRecord(name=TenantId("vision")),),
    settings: SchedulingSettings | None = None,
    archived_ids: Callable[[Sequence[JobId]], set[JobId]] | None = None,
) -> AsyncIterator[World]:
    clock = Clock()
    store = InMemoryJobStore()
    for tenant in tenants:
        await store.put_tenant(tenant)
    if settings is not None:
        await store.put_settings(settings)
    records: list[ClusterRecord] = []
    clusters: dict[str, InMemoryCluster] = {}
    for name, provider, kind, price in _CLUSTERS[:cluster_count]:
        pools = (PoolConfig("a100", A100, kind, price, gpus_per_node=8, node_count=2),)
        record = ClusterRecord(
            name=ClusterName(name),
            provider=provider,
            region="dc1",
            pools=pools,
            unreachable_grace_s=unreachable_grace_s,
        )
        records.append(record)
        clusters[name] = InMemoryCluster(
            record.name, provider=record.provider, region=record.region, pools=pools, clock=clock
        )
    async with wired_world(store, records, clusters, clock, archived_ids=archived_ids) as world:
        yield world


@asynccontextmanager
async def wired_world(
    store: KvStore,
    records: Sequence[ClusterRecord],
    clusters: dict[str, InMemoryCluster],
    clock: Clock,
    *,
    archived_ids: Callable[[Sequence[JobId]], set[JobId]] | None = None,
) -> AsyncIterator[World]:
    """The leader's parts over `store` and `clusters` as the server wires them (job and ledger caches
    started, a scheduler and a reconciler), stopped on the way out."""
    members = MemberClusters(list(records), {ClusterName(n): c for n, c in clusters.items()})
    cache = JobCache(store)
    await cache.start()
    ledger = LedgerCache(store)
    await ledger.start()
    metrics = Metrics()
    scheduler = Scheduler(
        store=store, cache=cache, ledger=ledger, members=members, metrics=metrics, clock=clock
    )
    reconciler = Reconciler(
        store=store, cache=cache, members=members, metrics=metrics, clock=clock, archived_ids=archived_ids
    )
    try:
        yield World(store, cache, clusters, scheduler, reconciler, clock, ledger, members)
    finally:
        await ledger.stop()
        await cache.stop()


def a_job(
    name: str,
    *,
    gpus: int = 4,
    duration: str = "10s",
    policy: RestartPolicy | None = None,
    exit_code: int = 0,
    tenant: str = "vision",
    priority_class: str = "normal",
    priority: int = 1000,
    queued_at_s: float = 1000.0,
) -> JobRecord:
    annotations = [("sim.gpufed.io/duration", duration)]
    if exit_code:
        annotations.append(("sim.gpufed.io/exit-code", str(exit_code)))
    job = build_job(
        name,
        tenant=tenant,
        gpus=gpus,
        replicas=2,
        gpu="A100",
        policy=policy,
        annotations=tuple(annotations),
    )
    return replace(
        job,
        spec=replace(job.spec, priority_class=priority_class),
        priority=priority,
        queued_at_s=queued_at_s,
        submitted_at_s=queued_at_s,
    )


async def submit(world: World, job: JobRecord) -> JobId:
    stored, created = await world.store.create_job(job, idempotency_key=job.job_id, manifest_digest="d")
    assert created
    return stored.value.job_id


def reasons_scheduler(store: KvStore) -> Scheduler:
    """A scheduler for its wait reasons' bookkeeping only: nothing starts its caches or clusters."""
    return Scheduler(
        store=store,
        cache=JobCache(store),
        ledger=LedgerCache(store),
        members=MemberClusters([], {}),
        metrics=Metrics(),
    )
