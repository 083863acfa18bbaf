"""Stored configuration other than jobs: tenants, member clusters, users, and their JSON codecs."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from placement.model import CapacityKind, ClusterName, GpuType, PoolSpec, Provider, TenantId, TenantQuota


class Role(StrEnum):
    """What a caller may do. Members act within their tenant; admins anywhere."""

    ADMIN = "admin"
    INFRA = "infra"
    FINANCE = "finance"
    MEMBER = "member"


@dataclass(frozen=True, slots=True)
class TenantRecord:
    name: TenantId
    # Hard cap on GPUs held at once per GPU type; the full quota model arrives with the placer.
    gpu_caps: tuple[tuple[GpuType, int], ...] = ()

    def quota(self) -> TenantQuota:
        return TenantQuota(tenant=self.name, gpu_caps=self.gpu_caps)


# A configured node pool is the shared PoolSpec; the name says where it comes from.
PoolConfig = PoolSpec


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    name: ClusterName
    provider: Provider
    region: str
    pools: tuple[PoolConfig, ...]
    # Which backend serves it: "kubernetes" (the official client, through `kubeconfig`/`context`),
    # "memory" (in-process simulation, for unit tests), or "sim" in a config file: a simulated
    # Kubernetes cluster that `gpufed up` starts and then drives as "kubernetes".
    backend: str = "memory"
    object_store: str | None = None
    kubeconfig: str | None = None
    # None: the kubeconfig's current context.
    context: str | None = None
    # Whether the provisioner may add nodes to this cluster's pools.
    scalable: bool = False
    # A simulated cluster serves the Volcano API unless told not to (then gangs are Indexed Jobs).
    volcano: bool = True
    # How long the cluster may stay silent before its running jobs are requeued elsewhere. Short
    # enough that a lost cluster does not hold jobs hostage, long enough to ride out an API blip.
    unreachable_grace_s: float = 120.0


@dataclass(frozen=True, slots=True)
class UserRecord:
    name: str
    tenant: TenantId
    role: Role


def tenant_to_dict(t: TenantRecord) -> dict[str, Any]:
    return {"name": t.name, "gpu_caps": dict(t.gpu_caps)}


def tenant_from_dict(d: dict[str, Any]) -> TenantRecord:
    caps = d.get("gpu_caps") or {}
    return TenantRecord(
        name=TenantId(d["name"]), gpu_caps=tuple(sorted((GpuType(g), int(n)) for g, n in caps.items()))
    )


def cluster_to_dict(c: ClusterRecord) -> dict[str, Any]:
    return {
        "name": c.name,
        "provider": c.provider.value,
        "region": c.region,
        "backend": c.backend,
        "object_store": c.object_store,
        "unreachable_grace_s": c.unreachable_grace_s,
        "kubeconfig": c.kubeconfig,
        "context": c.context,
        "scalable": c.scalable,
        "volcano": c.volcano,
        "pools": [
            {
                "name": p.name,
                "gpu_type": p.gpu_type,
                "kind": p.kind.value,
                "usd_per_gpu_hour": p.usd_per_gpu_hour,
                "gpus_per_node": p.gpus_per_node,
                "node_count": p.node_count,
            }
            for p in c.pools
        ],
    }


def cluster_from_dict(d: dict[str, Any]) -> ClusterRecord:
    return ClusterRecord(
        name=ClusterName(d["name"]),
        provider=Provider(d["provider"]),
        region=d["region"],
        backend=d.get("backend", "memory"),
        object_store=d.get("object_store"),
        unreachable_grace_s=float(d.get("unreachable_grace_s", 120.0)),
        kubeconfig=d.get("kubeconfig"),
        context=d.get("context"),
        scalable=bool(d.get("scalable", False)),
        volcano=bool(d.get("volcano", True)),
        pools=tuple(
            PoolConfig(
                name=p["name"],
                gpu_type=GpuType(p["gpu_type"]),
                kind=CapacityKind(p["kind"]),
                usd_per_gpu_hour=float(p["usd_per_gpu_hour"]),
                gpus_per_node=int(p["gpus_per_node"]),
                node_count=int(p["node_count"]),
            )
            for p in d["pools"]
        ),
    )


def user_to_dict(u: UserRecord) -> dict[str, Any]:
    return {"name": u.name, "tenant": u.tenant, "role": u.role.value}


def user_from_dict(d: dict[str, Any]) -> UserRecord:
    return UserRecord(name=d["name"], tenant=TenantId(d["tenant"]), role=Role(d["role"]))
