"""Small fluent builders for placement value types, so that each test states only what it is about.

    a_gang("j1").tenant("t1").gang(4, gpus=8, gpu="H100").priority(10).build()
    a_cluster("onprem").pool("A100", nodes=4, gpus_per_node=8, kind=CapacityKind.PRIVATE, price=1.2).build()
    a_snapshot().queue(gang, ...).clusters(cluster, ...).build()
    a_tenant("team").parent("org").quota("A100", guaranteed=16, borrow=8, lend=4).build()
    a_snapshot().running("r1", tenant="t2", nodes=[("a100-private-0", 0, 8)], ends_at=500.0)

`shuffled` reorders every tuple of a snapshot, for checking that order does not change a plan.

Every builder returns the frozen model object from `build()`; builders themselves are mutable and
meant to be used once.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from placement.model import (
    CapacityKind,
    ClusterName,
    ClusterState,
    EgressRate,
    GangRequest,
    GpuQuota,
    GpuType,
    GpuTypePolicy,
    JobId,
    NodePool,
    NodeShare,
    PolicyConfig,
    PriorityClass,
    Provider,
    RunningGang,
    ScalablePool,
    Snapshot,
    TenantId,
    TenantQuota,
)


class GangBuilder:
    def __init__(self, job_id: str) -> None:
        self._job_id = job_id
        self._tenant = "t1"
        self._priority = 0
        self._queued_at_s = 0.0
        self._replica_gpus: tuple[int, ...] = (8,)
        self._gpu_types: tuple[str, ...] = ("A100",)
        self._policy = GpuTypePolicy.ORDERED
        self._allow_spot = False
        self._extra: dict[str, Any] = {}

    def tenant(self, tenant: str) -> GangBuilder:
        self._tenant = tenant
        return self

    def gang(self, replicas: int, *, gpus: int = 8, gpu: str | None = None) -> GangBuilder:
        """`replicas` replicas of `gpus` GPUs each; `gpu` sets the only acceptable GPU type."""
        self._replica_gpus = (gpus,) * replicas
        if gpu is not None:
            self._gpu_types = (gpu,)
        return self

    def replicas(self, *gpus: int) -> GangBuilder:
        """Replicas of different sizes, e.g. a master with 1 GPU and workers with 8."""
        self._replica_gpus = gpus
        return self

    def gpus(self, *gpu_types: str, policy: GpuTypePolicy = GpuTypePolicy.ORDERED) -> GangBuilder:
        self._gpu_types = gpu_types
        self._policy = policy
        return self

    def any_of(self, *gpu_types: str) -> GangBuilder:
        return self.gpus(*gpu_types, policy=GpuTypePolicy.ANY)

    def priority(self, priority: int) -> GangBuilder:
        self._priority = priority
        return self

    def queued_at(self, queued_at_s: float) -> GangBuilder:
        self._queued_at_s = queued_at_s
        return self

    def allow_spot(self, allow: bool = True) -> GangBuilder:
        self._allow_spot = allow
        return self

    def priority_class(self, name: str, *, approved_until: float | None = None) -> GangBuilder:
        self._extra["priority_class"] = name
        self._extra["approval_expires_at_s"] = approved_until
        return self

    def user_max_priority(self, priority: int) -> GangBuilder:
        self._extra["user_max_priority"] = priority
        return self

    def deadline(self, at_s: float) -> GangBuilder:
        self._extra["deadline_at_s"] = at_s
        return self

    def runtime(self, *, expected_s: float = 0.0, limit_s: int = 0) -> GangBuilder:
        """Expected work on a speed-1.0 GPU (cost), and the run-time limit (backfill)."""
        self._extra["expected_runtime_s"] = expected_s
        self._extra["max_runtime_s"] = limit_s
        return self

    def dataset(self, size_bytes: int, store: str) -> GangBuilder:
        self._extra["dataset_size_bytes"] = size_bytes
        self._extra["dataset_store"] = store
        return self

    def speeds(self, **speeds: float) -> GangBuilder:
        self._extra["gpu_speeds"] = tuple((GpuType(t), v) for t, v in speeds.items())
        return self

    def build(self) -> GangRequest:
        return GangRequest(
            job_id=JobId(self._job_id),
            tenant=TenantId(self._tenant),
            priority=self._priority,
            queued_at_s=self._queued_at_s,
            replica_gpus=self._replica_gpus,
            gpu_types=tuple(GpuType(t) for t in self._gpu_types),
            gpu_type_policy=self._policy,
            allow_spot=self._allow_spot,
            **self._extra,
        )


class ClusterBuilder:
    def __init__(self, name: str) -> None:
        self._name = name
        self._provider = Provider.PRIVATE
        self._region = "local"
        self._pools: list[NodePool] = []
        self._reachable = True
        self._store: str | None = None
        self._scalable: list[ScalablePool] = []

    def pool(
        self,
        gpu: str,
        *,
        nodes: int = 1,
        gpus_per_node: int = 8,
        kind: CapacityKind = CapacityKind.PRIVATE,
        price: float = 1.0,
        free: Sequence[int] | None = None,
        name: str | None = None,
        risk: float = 0.0,
    ) -> ClusterBuilder:
        """A pool of `nodes` empty nodes, or with `free` GPUs per node when given (then `nodes` is ignored)."""
        free_per_node = tuple(free) if free is not None else (gpus_per_node,) * nodes
        self._pools.append(
            NodePool(
                name=name or f"{gpu.lower()}-{kind}-{len(self._pools)}",
                gpu_type=GpuType(gpu),
                kind=kind,
                usd_per_gpu_hour=price,
                gpus_per_node=gpus_per_node,
                free_gpus_per_node=free_per_node,
                restart_risk_per_hour=risk,
            )
        )
        return self

    def scalable(
        self,
        gpu: str,
        *,
        max_nodes: int,
        nodes: int = 0,
        gpus_per_node: int = 8,
        kind: CapacityKind = CapacityKind.ON_DEMAND,
        price: float = 3.0,
        requested: int = 0,
        name: str | None = None,
        risk: float = 0.0,
    ) -> ClusterBuilder:
        """A pool that may grow from `nodes` to `max_nodes` nodes (`requested` already asked for)."""
        self._scalable.append(
            ScalablePool(
                name=name or f"{gpu.lower()}-grow-{len(self._scalable)}",
                gpu_type=GpuType(gpu),
                kind=kind,
                usd_per_gpu_hour=price,
                gpus_per_node=gpus_per_node,
                node_count=nodes,
                max_nodes=max_nodes,
                requested_nodes=requested,
                restart_risk_per_hour=risk,
            )
        )
        return self

    def store(self, object_store: str) -> ClusterBuilder:
        self._store = object_store
        return self

    def provider(self, provider: Provider, region: str = "us-east-1") -> ClusterBuilder:
        self._provider = provider
        self._region = region
        return self

    def provider_cloud(self) -> ClusterBuilder:
        return self.provider(Provider.AWS)

    def unreachable(self) -> ClusterBuilder:
        self._reachable = False
        return self

    def build(self) -> ClusterState:
        return ClusterState(
            name=ClusterName(self._name),
            provider=self._provider,
            region=self._region,
            pools=tuple(self._pools),
            reachable=self._reachable,
            object_store=self._store,
            scalable_pools=tuple(self._scalable),
        )


class TenantBuilder:
    def __init__(self, tenant: str) -> None:
        self._tenant = tenant
        self._caps: list[tuple[GpuType, int]] = []
        self._quotas: list[GpuQuota] = []
        self._history: list[tuple[GpuType, float]] = []
        self._extra: dict[str, Any] = {}

    def cap(self, gpu: str, gpus: int) -> TenantBuilder:
        self._caps.append((GpuType(gpu), gpus))
        return self

    def quota(
        self,
        gpu: str,
        *,
        guaranteed: int = 0,
        borrow: int | None = None,
        lend: int | None = None,
        cap: int | None = None,
    ) -> TenantBuilder:
        self._quotas.append(GpuQuota(GpuType(gpu), guaranteed, borrow, lend, cap))
        return self

    def parent(self, parent: str) -> TenantBuilder:
        self._extra["parent"] = TenantId(parent)
        return self

    def weight(self, weight: float) -> TenantBuilder:
        self._extra["weight"] = weight
        return self

    def budget(self, gpu_hours: float, *, spent: float) -> TenantBuilder:
        self._extra["monthly_budget_gpu_hours"] = gpu_hours
        self._extra["spent_gpu_hours"] = spent
        return self

    def history(self, gpu: str, gpu_hours: float) -> TenantBuilder:
        self._history.append((GpuType(gpu), gpu_hours))
        return self

    def max_priority(self, priority: int) -> TenantBuilder:
        self._extra["max_priority"] = priority
        return self

    def build(self) -> TenantQuota:
        return TenantQuota(
            tenant=TenantId(self._tenant),
            gpu_caps=tuple(self._caps),
            quotas=tuple(self._quotas),
            usage_history_gpu_hours=tuple(self._history),
            **self._extra,
        )


class SnapshotBuilder:
    """Unless `tenants` is called, every tenant of the queue and of the running gangs is known and uncapped."""

    def __init__(self) -> None:
        self._queued: list[GangRequest] = []
        self._running: list[RunningGang] = []
        self._clusters: list[ClusterState] = []
        self._tenants: list[TenantQuota] | None = None
        self._classes: list[PriorityClass] = []
        self._speeds: list[tuple[GpuType, float]] = []
        self._egress: list[EgressRate] = []
        self._policy = PolicyConfig()

    def queue(self, *gangs: GangRequest | GangBuilder) -> SnapshotBuilder:
        self._queued.extend(g.build() if isinstance(g, GangBuilder) else g for g in gangs)
        return self

    def clusters(self, *clusters: ClusterState | ClusterBuilder) -> SnapshotBuilder:
        self._clusters.extend(c.build() if isinstance(c, ClusterBuilder) else c for c in clusters)
        return self

    def tenants(self, *tenants: TenantQuota | TenantBuilder) -> SnapshotBuilder:
        self._tenants = [t.build() if isinstance(t, TenantBuilder) else t for t in tenants]
        return self

    def running(
        self,
        job_id: str,
        *,
        tenant: str = "t1",
        cluster: str = "c1",
        gpu: str = "A100",
        gpus: int = 8,
        priority: int = 0,
        nodes: Sequence[tuple[str, int, int]] = (),
        ends_at: float | None = None,
        terminating: bool = False,
        preemptible: bool = True,
        queued_at: float = 0.0,
        priority_class: str = "",
        grace_s: float | None = None,
        kind: CapacityKind | None = None,
    ) -> SnapshotBuilder:
        """`nodes`: (pool name, node index, GPUs) where the gang sits; `gpus` is their sum when given;
        `kind`: the capacity it runs on, as federation records it (None: not said)."""
        shares = tuple(NodeShare(pool, index, n) for pool, index, n in nodes)
        self._running.append(
            RunningGang(
                job_id=JobId(job_id),
                tenant=TenantId(tenant),
                priority=priority,
                cluster=ClusterName(cluster),
                gpu_type=GpuType(gpu),
                gpu_count=sum(n for _, _, n in nodes) if nodes else gpus,
                priority_class=priority_class,
                preemptible=preemptible,
                queued_at_s=queued_at,
                grace_period_s=grace_s,
                ends_at_s=ends_at,
                nodes=shares,
                terminating=terminating,
                kind=kind,
            )
        )
        return self

    def classes(self, *classes: PriorityClass) -> SnapshotBuilder:
        self._classes.extend(classes)
        return self

    def speeds(self, **speeds: float) -> SnapshotBuilder:
        self._speeds.extend((GpuType(t), v) for t, v in speeds.items())
        return self

    def egress(self, source: str, destination: str, usd_per_gb: float) -> SnapshotBuilder:
        self._egress.append(EgressRate(source, destination, usd_per_gb))
        return self

    def policy(self, **fields: Any) -> SnapshotBuilder:
        self._policy = replace(self._policy, **fields)
        return self

    def build(self) -> Snapshot:
        tenants = self._tenants
        if tenants is None:
            names = dict.fromkeys([g.tenant for g in self._queued] + [r.tenant for r in self._running])
            tenants = [TenantQuota(tenant=name) for name in names]
        return Snapshot(
            queued=tuple(self._queued),
            running=tuple(self._running),
            tenants=tuple(tenants),
            clusters=tuple(self._clusters),
            priority_classes=tuple(self._classes),
            gpu_speeds=tuple(self._speeds),
            egress_rates=tuple(self._egress),
            policy=self._policy,
        )


def a_gang(job_id: str) -> GangBuilder:
    return GangBuilder(job_id)


def a_cluster(name: str) -> ClusterBuilder:
    return ClusterBuilder(name)


def a_tenant(tenant: str) -> TenantBuilder:
    return TenantBuilder(tenant)


def a_snapshot() -> SnapshotBuilder:
    return SnapshotBuilder()


T = TypeVar("T")


def shuffled(snapshot: Snapshot, rng: random.Random) -> Snapshot:
    """The same snapshot with every tuple in another order: queue, running gangs and their nodes, tenants
    and their caps, quotas and history, clusters, their pools and scalable pools, priority classes,
    speeds and egress rates. Nodes within a pool keep their order when running gangs refer to them by
    index (the order then names the nodes); otherwise they are shuffled too."""

    def shuffle(items: Sequence[T]) -> tuple[T, ...]:
        return tuple(rng.sample(items, len(items)))

    pinned = any(r.nodes for r in snapshot.running)
    clusters = tuple(
        replace(
            c,
            pools=shuffle(
                tuple(
                    p if pinned else replace(p, free_gpus_per_node=shuffle(p.free_gpus_per_node))
                    for p in c.pools
                )
            ),
            scalable_pools=shuffle(c.scalable_pools),
        )
        for c in snapshot.clusters
    )
    tenants = tuple(
        replace(
            t,
            gpu_caps=shuffle(t.gpu_caps),
            quotas=shuffle(t.quotas),
            usage_history_gpu_hours=shuffle(t.usage_history_gpu_hours),
        )
        for t in snapshot.tenants
    )
    return replace(
        snapshot,
        queued=shuffle(snapshot.queued),
        running=shuffle(tuple(replace(r, nodes=shuffle(r.nodes)) for r in snapshot.running)),
        tenants=shuffle(tenants),
        clusters=shuffle(clusters),
        priority_classes=shuffle(snapshot.priority_classes),
        gpu_speeds=shuffle(snapshot.gpu_speeds),
        egress_rates=shuffle(snapshot.egress_rates),
    )


class SkipsOneItemSamples(random.Random):
    """`rng` for `shuffled`, except that a sample of all of fewer than two items, whose only order is
    their own, is answered without asking it.

    Hypothesis's random records a choice for every call, through a new list strategy each time, and in
    a property test most of a snapshot's tuples hold one item (every running gang's nodes): answering
    those here spares most of the shuffle's cost and leaves every order Hypothesis draws, and shrinks,
    as it was.
    """

    def __init__(self, rng: random.Random) -> None:
        super().__init__(0)
        self.rng = rng

    def sample(self, population: Sequence[T], k: int, *, counts: Iterable[int] | None = None) -> list[T]:
        if counts is None and k == len(population) < 2:
            return list(population)
        return self.rng.sample(population, k, counts=counts)


def dataclasses_in(modules: Iterable[str]) -> list[type[object]]:
    """Every dataclass defined in the named modules of `placement` (not those they import)."""
    found: list[type[object]] = []
    for name in modules:
        module = importlib.import_module(f"placement.{name}")
        found += [
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and value.__module__ == module.__name__
            and dataclasses.is_dataclass(value)
        ]
    return found
