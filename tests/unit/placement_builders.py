"""Small fluent builders for placement value types, so that each test states only what it is about.

    a_gang("j1").tenant("t1").gang(4, gpus=8, gpu="H100").priority(10).build()
    a_cluster("onprem").pool("A100", nodes=4, gpus_per_node=8, kind=CapacityKind.PRIVATE, price=1.2).build()
    a_snapshot().queue(gang, ...).clusters(cluster, ...).build()

`shuffled` reorders every tuple of a snapshot, for checking that order does not change a plan.

Every builder returns the frozen model object from `build()`; builders themselves are mutable and
meant to be used once.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

from placement.model import (
    CapacityKind,
    ClusterName,
    ClusterState,
    GangRequest,
    GpuType,
    GpuTypePolicy,
    JobId,
    NodePool,
    Provider,
    RunningGang,
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
        )


class ClusterBuilder:
    def __init__(self, name: str) -> None:
        self._name = name
        self._provider = Provider.PRIVATE
        self._region = "local"
        self._pools: list[NodePool] = []
        self._reachable = True

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
            )
        )
        return self

    def provider(self, provider: Provider, region: str = "us-east-1") -> ClusterBuilder:
        self._provider = provider
        self._region = region
        return self

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
        )


class TenantBuilder:
    def __init__(self, tenant: str) -> None:
        self._tenant = tenant
        self._caps: list[tuple[GpuType, int]] = []

    def cap(self, gpu: str, gpus: int) -> TenantBuilder:
        self._caps.append((GpuType(gpu), gpus))
        return self

    def build(self) -> TenantQuota:
        return TenantQuota(tenant=TenantId(self._tenant), gpu_caps=tuple(self._caps))


class SnapshotBuilder:
    """Unless `tenants` is called, every tenant of the queue and of the running gangs is known and uncapped."""

    def __init__(self) -> None:
        self._queued: list[GangRequest] = []
        self._running: list[RunningGang] = []
        self._clusters: list[ClusterState] = []
        self._tenants: list[TenantQuota] | None = None

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
        self, job_id: str, *, tenant: str = "t1", cluster: str = "c1", gpu: str = "A100", gpus: int = 8
    ) -> SnapshotBuilder:
        self._running.append(
            RunningGang(
                job_id=JobId(job_id),
                tenant=TenantId(tenant),
                priority=0,
                cluster=ClusterName(cluster),
                gpu_type=GpuType(gpu),
                gpu_count=gpus,
            )
        )
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
    """The same snapshot with every tuple in another order: queue, running, tenants and their caps,
    clusters, their pools and the pools' nodes."""

    def shuffle(items: tuple[T, ...]) -> tuple[T, ...]:
        return tuple(rng.sample(items, len(items)))

    clusters = tuple(
        replace(
            c,
            pools=shuffle(
                tuple(replace(p, free_gpus_per_node=shuffle(p.free_gpus_per_node)) for p in c.pools)
            ),
        )
        for c in snapshot.clusters
    )
    return Snapshot(
        queued=shuffle(snapshot.queued),
        running=shuffle(snapshot.running),
        tenants=shuffle(tuple(replace(t, gpu_caps=shuffle(t.gpu_caps)) for t in snapshot.tenants)),
        clusters=shuffle(clusters),
    )
