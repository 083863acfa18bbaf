"""Stored configuration other than jobs: tenants, member clusters, users, and their JSON codecs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from federation.spec.jobspec import PodSecurityLevel
from federation.spec.priorities import DEFAULT_PRIORITY_CLASS_TABLE
from placement.gpu_types import BUILTIN_TYPES, GpuModel, GpuRegistry
from placement.model import (
    CapacityKind,
    ClusterName,
    EgressRate,
    GpuQuota,
    GpuType,
    PolicyConfig,
    PoolSpec,
    PriorityClass,
    Provider,
    TenantId,
    TenantQuota,
)
from placement.model_policy import CostPolicy

_BUILTIN_REGISTRY = GpuRegistry(BUILTIN_TYPES)
# The federation's queue limit unless the config sets another (`policy.maxQueuedJobs`): the million
# queued jobs bench/scale_depth.py measured, about 3.5 GiB of a server's memory.
DEFAULT_MAX_QUEUED_JOBS = 1_000_000
# A tenant's own queue limit unless its document sets one (`policy.maxQueuedJobsPerTenant`): a
# quarter of the federation's, so that one team's burst cannot fill the whole queue and have every
# other team's submissions refused.
DEFAULT_MAX_QUEUED_JOBS_PER_TENANT = 250_000
_registries: dict[tuple[GpuModel, ...], GpuRegistry] = {}


def _registry(added: tuple[GpuModel, ...]) -> GpuRegistry:
    """One registry per set of admin types (settings are read every submission and cycle)."""
    if not added:
        return _BUILTIN_REGISTRY
    found = _registries.get(added)
    if found is None:
        if len(_registries) > 16:
            _registries.clear()
        found = _registries[added] = GpuRegistry((*BUILTIN_TYPES, *added))
    return found


class Role(StrEnum):
    """What a caller may do. Members act within their tenant; admins anywhere."""

    ADMIN = "admin"
    INFRA = "infra"
    FINANCE = "finance"
    MEMBER = "member"


@dataclass(frozen=True, slots=True)
class TenantRecord:
    """A team or an organisation, its place in the tenant tree and its limits (set by an admin)."""

    name: TenantId
    # Hard cap on GPUs held at once per GPU type (the older, simpler form of a quota's cap).
    gpu_caps: tuple[tuple[GpuType, int], ...] = ()
    parent: TenantId | None = None
    # Guaranteed, borrowing, lending and cap per GPU type (see placement.model.GpuQuota).
    quotas: tuple[GpuQuota, ...] = ()
    weight: float = 1.0
    monthly_budget_gpu_hours: float | None = None
    # The highest priority class the tenant's jobs may use (None: any).
    max_priority_class: str | None = None
    # Submissions per second per server, with a burst (None: no limit), so one team's script cannot
    # crowd out everyone else's submissions or etcd.
    submit_rate_per_s: float | None = None
    submit_burst: int | None = None
    # The most of the tenant's jobs that may wait in the queue at once (None: only the federation's
    # limit): a submission past it is refused, so one team's runaway script neither fills the
    # server's memory nor crowds out the others' submissions.
    max_queued_jobs: int | None = None
    # The Pod Security Standards level the tenant's pods are held to (federation.spec.pod_security).
    pod_security: PodSecurityLevel = PodSecurityLevel.BASELINE
    # How long the tenant's gangs wait for private GPUs before paying cloud prices (issue 35):
    # `saver`, `balanced` (the federation's wait) or `fast` (burst at once); placement.wait_policy.
    cost_policy: CostPolicy = CostPolicy.BALANCED

    def quota(
        self,
        *,
        priority_classes: Mapping[str, int] | None = None,
        spent_gpu_hours: float = 0.0,
        usage_history_gpu_hours: tuple[tuple[GpuType, float], ...] = (),
    ) -> TenantQuota:
        """The placer's view of the tenant, with what the ledger says it used."""
        max_priority = None
        if self.max_priority_class is not None and priority_classes is not None:
            max_priority = priority_classes.get(self.max_priority_class)
        return TenantQuota(
            tenant=self.name,
            gpu_caps=self.gpu_caps,
            parent=self.parent,
            quotas=self.quotas,
            weight=self.weight,
            monthly_budget_gpu_hours=self.monthly_budget_gpu_hours,
            spent_gpu_hours=spent_gpu_hours,
            usage_history_gpu_hours=usage_history_gpu_hours,
            max_priority=max_priority,
            cost_policy=self.cost_policy,
        )


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
    # The highest priority class this user may submit at (None: whatever the tenant allows). An
    # intern's "normal" keeps "high" for the seniors of the same team.
    max_priority_class: str | None = None


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """An admin's time-limited permission to use a class that needs approval (say, urgent).

    Granted to a tenant's jobs, or to one user's jobs in it; the placer admits such a job only while
    an approval covering it has not expired.
    """

    approval_id: str
    tenant: TenantId
    priority_class: str
    expires_at_s: float
    reason: str
    granted_by: str
    granted_at_s: float
    # None: every user of the tenant.
    user: str | None = None

    def covers(self, tenant: TenantId, user: str, priority_class: str) -> bool:
        return (
            self.tenant == tenant
            and self.priority_class == priority_class
            and (self.user is None or self.user == user)
        )


@dataclass(frozen=True, slots=True)
class DatasetLocation:
    """Where a dataset version lives and how big it is: from the dataset registry (the home store and
    the stores holding a cached copy), else from the config's `datasets:` list."""

    dataset: str
    store: str
    size_bytes: int
    cached_in: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SchedulingSettings:
    """The federation-wide inputs of the placer besides tenants and clusters: one record in etcd."""

    priority_classes: tuple[PriorityClass, ...] = DEFAULT_PRIORITY_CLASS_TABLE
    # Relative speed per GPU type (A100 = 1.0 by convention); a type not listed counts as 1.0.
    gpu_speeds: tuple[tuple[GpuType, float], ...] = ()
    egress_rates: tuple[EgressRate, ...] = ()
    datasets: tuple[DatasetLocation, ...] = ()
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # The interval over which `policy.preemption_limit_gpus` counts evicted GPUs.
    preemption_interval_s: float = 600.0
    # Past usage counts half as much per half-life in fair share (with `policy.fair_share_history`).
    usage_half_life_h: float = 24.0
    # GPU types the admin adds to (or redefines in) the built-in registry (`gpuTypes:` in the config).
    gpu_types: tuple[GpuModel, ...] = ()
    # The most jobs that may wait in the queue at once, all tenants together (None: no limit). Every
    # live job costs each server about 3.5 KiB (docs/architecture.md, "Memory per live job"): the
    # default bounds a server's job cache near 3.5 GiB; a smaller server sets a smaller limit.
    max_queued_jobs: int | None = DEFAULT_MAX_QUEUED_JOBS
    # A tenant's limit when its document sets none (None: only the federation's applies to it).
    max_queued_jobs_per_tenant: int | None = DEFAULT_MAX_QUEUED_JOBS_PER_TENANT

    def gpu_registry(self) -> GpuRegistry:
        """The known GPU types: built-in ones, then the admin's."""
        return _registry(self.gpu_types)

    def class_values(self) -> dict[str, int]:
        return {c.name: c.value for c in self.priority_classes}

    def priority_class(self, name: str) -> PriorityClass | None:
        for c in self.priority_classes:
            if c.name == name:
                return c
        return None

    def dataset(self, reference: str | None) -> DatasetLocation | None:
        if reference is None:
            return None
        for d in self.datasets:
            if d.dataset == reference:
                return d
        return None


def _quota_to_dict(q: GpuQuota) -> dict[str, Any]:
    return {
        "gpu_type": q.gpu_type,
        "guaranteed": q.guaranteed_gpus,
        "borrowing_limit": q.borrowing_limit_gpus,
        "lending_limit": q.lending_limit_gpus,
        "cap": q.cap_gpus,
    }


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _quota_from_dict(d: dict[str, Any]) -> GpuQuota:
    return GpuQuota(
        gpu_type=GpuType(d["gpu_type"]),
        guaranteed_gpus=int(d.get("guaranteed", 0)),
        borrowing_limit_gpus=_optional_int(d.get("borrowing_limit")),
        lending_limit_gpus=_optional_int(d.get("lending_limit")),
        cap_gpus=_optional_int(d.get("cap")),
    )


def tenant_to_dict(t: TenantRecord) -> dict[str, Any]:
    return {
        "name": t.name,
        "gpu_caps": dict(t.gpu_caps),
        "parent": t.parent,
        "quotas": [_quota_to_dict(q) for q in t.quotas],
        "weight": t.weight,
        "monthly_budget_gpu_hours": t.monthly_budget_gpu_hours,
        "max_priority_class": t.max_priority_class,
        "submit_rate_per_s": t.submit_rate_per_s,
        "submit_burst": t.submit_burst,
        **({} if t.max_queued_jobs is None else {"max_queued_jobs": t.max_queued_jobs}),
        "pod_security": t.pod_security.value,
        # Only a policy other than the default is written, so older records read back unchanged.
        **({} if t.cost_policy is CostPolicy.BALANCED else {"cost_policy": t.cost_policy.value}),
    }


def tenant_from_dict(d: dict[str, Any]) -> TenantRecord:
    caps = d.get("gpu_caps") or {}
    budget = d.get("monthly_budget_gpu_hours")
    parent = d.get("parent")
    return TenantRecord(
        name=TenantId(d["name"]),
        gpu_caps=tuple(sorted((GpuType(g), int(n)) for g, n in caps.items())),
        parent=None if parent is None else TenantId(parent),
        quotas=tuple(_quota_from_dict(q) for q in d.get("quotas") or []),
        weight=float(d.get("weight", 1.0)),
        monthly_budget_gpu_hours=None if budget is None else float(budget),
        max_priority_class=d.get("max_priority_class"),
        submit_rate_per_s=None if d.get("submit_rate_per_s") is None else float(d["submit_rate_per_s"]),
        submit_burst=None if d.get("submit_burst") is None else int(d["submit_burst"]),
        max_queued_jobs=_optional_int(d.get("max_queued_jobs")),
        # Records written before the field existed: baseline, the default level.
        pod_security=PodSecurityLevel(d.get("pod_security", PodSecurityLevel.BASELINE.value)),
        # Records written before issue 35: the federation's own wait.
        cost_policy=CostPolicy(d.get("cost_policy", CostPolicy.BALANCED.value)),
    )


def approval_to_dict(a: ApprovalRecord) -> dict[str, Any]:
    return {
        "approval_id": a.approval_id,
        "tenant": a.tenant,
        "user": a.user,
        "priority_class": a.priority_class,
        "expires_at_s": a.expires_at_s,
        "reason": a.reason,
        "granted_by": a.granted_by,
        "granted_at_s": a.granted_at_s,
    }


def approval_from_dict(d: dict[str, Any]) -> ApprovalRecord:
    return ApprovalRecord(
        approval_id=d["approval_id"],
        tenant=TenantId(d["tenant"]),
        user=d.get("user"),
        priority_class=d["priority_class"],
        expires_at_s=float(d["expires_at_s"]),
        reason=d.get("reason", ""),
        granted_by=d.get("granted_by", ""),
        granted_at_s=float(d.get("granted_at_s", 0.0)),
    )


def settings_to_dict(s: SchedulingSettings) -> dict[str, Any]:
    return {
        "priority_classes": [
            {
                "name": c.name,
                "value": c.value,
                "preemptible": c.preemptible,
                "needs_approval": c.needs_approval,
            }
            for c in s.priority_classes
        ],
        "gpu_speeds": dict(s.gpu_speeds),
        "egress_rates": [
            {"from": e.source_store, "to": e.destination_store, "usd_per_gb": e.usd_per_gb}
            for e in s.egress_rates
        ],
        "datasets": [
            {"dataset": d.dataset, "store": d.store, "size_bytes": d.size_bytes} for d in s.datasets
        ],
        # Every policy knob is a plain scalar: keep them by name, so a new knob needs no codec change.
        "policy": {f.name: getattr(s.policy, f.name) for f in fields(PolicyConfig)},
        "preemption_interval_s": s.preemption_interval_s,
        "usage_half_life_h": s.usage_half_life_h,
        "max_queued_jobs": s.max_queued_jobs,
        "max_queued_jobs_per_tenant": s.max_queued_jobs_per_tenant,
        "gpu_types": [
            {"name": m.name, "family": m.family, "memory_gib": m.memory_gib, "speed": m.speed, "form": m.form}
            for m in s.gpu_types
        ],
    }


def settings_from_dict(d: dict[str, Any]) -> SchedulingSettings:
    known = {f.name for f in fields(PolicyConfig)}
    policy = replace(PolicyConfig(), **{k: v for k, v in (d.get("policy") or {}).items() if k in known})
    classes = d.get("priority_classes")
    return SchedulingSettings(
        priority_classes=DEFAULT_PRIORITY_CLASS_TABLE
        if classes is None
        else tuple(
            PriorityClass(
                name=c["name"],
                value=int(c["value"]),
                preemptible=bool(c.get("preemptible", True)),
                needs_approval=bool(c.get("needs_approval", False)),
            )
            for c in classes
        ),
        gpu_speeds=tuple(sorted((GpuType(g), float(v)) for g, v in (d.get("gpu_speeds") or {}).items())),
        egress_rates=tuple(
            EgressRate(e["from"], e["to"], float(e["usd_per_gb"])) for e in d.get("egress_rates") or []
        ),
        datasets=tuple(
            DatasetLocation(x["dataset"], x["store"], int(x["size_bytes"])) for x in d.get("datasets") or []
        ),
        policy=policy,
        preemption_interval_s=float(d.get("preemption_interval_s", 600.0)),
        usage_half_life_h=float(d.get("usage_half_life_h", 24.0)),
        # Settings written before the field existed: the default limit. An explicit null: none.
        max_queued_jobs=_optional_int(d.get("max_queued_jobs", DEFAULT_MAX_QUEUED_JOBS)),
        max_queued_jobs_per_tenant=_optional_int(
            d.get("max_queued_jobs_per_tenant", DEFAULT_MAX_QUEUED_JOBS_PER_TENANT)
        ),
        gpu_types=tuple(
            GpuModel(
                GpuType(m["name"]),
                GpuType(m["family"]),
                int(m["memory_gib"]),
                float(m["speed"]),
                str(m.get("form", "")),
            )
            for m in d.get("gpu_types") or ()
        ),
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
                "reclaims_per_node_hour": p.reclaims_per_node_hour,
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
                # Clusters stored before spot pools carried a reclaim rate: none.
                reclaims_per_node_hour=float(p.get("reclaims_per_node_hour", 0.0)),
            )
            for p in d["pools"]
        ),
    )


def user_to_dict(u: UserRecord) -> dict[str, Any]:
    return {
        "name": u.name,
        "tenant": u.tenant,
        "role": u.role.value,
        "max_priority_class": u.max_priority_class,
    }


def user_from_dict(d: dict[str, Any]) -> UserRecord:
    return UserRecord(
        name=d["name"],
        tenant=TenantId(d["tenant"]),
        role=Role(d["role"]),
        max_priority_class=d.get("max_priority_class"),
    )
