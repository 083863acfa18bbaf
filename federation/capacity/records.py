"""What the capacity reconciler and the Capacity API keep in etcd, and the JSON codecs for it.

A leader that restarts must find everything the last one knew: the infra team's plans, each
pool's pending operation (so a request is not made twice, and a failure keeps its backoff), each
pool's idle clocks (so the idle TTL does not start over), and the intervals gpufed held extra nodes
for (the finance idle-cost report reads them). Keys, all under `/gpufed/capacity/`:

- `settings`: the `CapacitySettings` from the config's `capacity:` section;
- `plans/<plan_id>`: a `PlanRecord` (create-only; cancelled by compare-and-swap);
- `pools/<cluster>/<pool>`: a `PoolRecord` (idle clocks, the last target, the last error);
- `ops/<cluster>/<pool>`: the pool's `PendingOp`, at most one at a time;
- `provisioned/<cluster>/<pool>/<start ns>`: a `ProvisionedInterval` of nodes gpufed added;
- `plan-held/<plan_id>`: a `PlanHeldRecord`, what a plan's nodes delivered (written by the leader
  when what the plan holds changes, apart from the plan so that a cancel's compare-and-swap never
  races the leader).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from federation.ledger.report.idle import ProvisionedInterval
from placement.model import CapacityKind, ClusterName, GpuType, JobId, Provider

CAPACITY = b"/gpufed/capacity/"
SETTINGS_KEY = CAPACITY + b"settings"
PLANS = CAPACITY + b"plans/"
POOLS = CAPACITY + b"pools/"
OPS = CAPACITY + b"ops/"
PROVISIONED = CAPACITY + b"provisioned/"
PLAN_HELD = CAPACITY + b"plan-held/"


class ProvisionerKind(StrEnum):
    # No provisioner: plans are kept and previewed, pools never change (a federation of fixed clusters).
    NONE = "none"
    # The simulated clusters' pools, resized over their admin API (the embedded default).
    SIMULATED = "simulated"
    # Pulumi's Automation API against real clouds (the CLI must be installed).
    PULUMI = "pulumi"


@dataclass(frozen=True, slots=True)
class CapacitySettings:
    provisioner: ProvisionerKind = ProvisionerKind.NONE
    lead_time_s: float = 600.0
    idle_ttl_s: float = 1800.0
    # What scalable pools may cost per hour in total (None: no ceiling).
    spend_ceiling_usd_per_hour: float | None = None
    # GPUs gpufed may hold per cloud at once (the account's quota).
    cloud_gpu_limits: tuple[tuple[Provider, int], ...] = ()
    # A scalable pool grows to at most this many nodes (never below its configured count).
    max_nodes_per_pool: int = 16
    pulumi_backend_url: str = ""
    # Cloud-side identifiers per cluster for Pulumi (eksCluster, nodeRoleArn, subnetIds, ...).
    cluster_settings: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    # A failed operation is retried after retry_base_s, doubling up to retry_max_s.
    retry_base_s: float = 2.0
    retry_max_s: float = 300.0
    # How long the simulated cloud takes to boot nodes (None: the lead time). Shorter than the lead
    # time, the planning margin, as a real cloud usually is.
    simulated_boot_s: float | None = None


class PlanKind(StrEnum):
    FIXED = "fixed"
    DEADLINE = "deadline"


@dataclass(frozen=True, slots=True)
class PlanRecord:
    plan_id: str
    kind: PlanKind
    cluster: ClusterName
    gpu_type: GpuType
    created_by: str
    created_at_s: float
    # Fixed: `gpus` from start_s to end_s. Deadline: enough for `job_ids` to finish by end_s.
    gpus: int = 0
    start_s: float = 0.0
    end_s: float = 0.0
    job_ids: tuple[JobId, ...] = ()
    pool: str = ""
    reason: str = ""
    cancelled_at_s: float | None = None
    cancelled_by: str = ""
    # A partial fixed plan: what was asked (0: `gpus`, the whole of it) and the limit that held it back.
    requested_gpus: int = 0
    held_back_by: str = ""
    # A deadline plan: the one tenant whose jobs it names.
    tenant: str = ""

    @property
    def stop_s(self) -> float:
        """When the plan stops holding: its end, or when it was cancelled."""
        return self.end_s if self.cancelled_at_s is None else min(self.end_s, self.cancelled_at_s)


@dataclass(frozen=True, slots=True)
class PlanHeldRecord:
    """What a plan's nodes have delivered: totals up to `since_s`, and the GPUs held since then."""

    plan_id: str
    since_s: float
    gpus: int = 0
    usd_per_hour: float = 0.0
    gpu_s: float = 0.0
    usd: float = 0.0

    def delivered(self, until_s: float) -> tuple[float, float]:
        """(GPU-seconds, dollars) delivered up to `until_s`."""
        span_s = max(0.0, until_s - self.since_s)
        return self.gpu_s + self.gpus * span_s, self.usd + self.usd_per_hour * span_s / 3600.0


@dataclass(frozen=True, slots=True)
class PendingOp:
    """A pool change asked of the provisioner and not yet seen done (or failed, awaiting a retry)."""

    cluster: ClusterName
    pool: str
    nodes_from: int
    nodes_to: int
    started_at_s: float
    reason: str = ""
    job_ids: tuple[JobId, ...] = ()
    plan_ids: tuple[str, ...] = ()
    # When the nodes are expected (a scale-up's lead time); None until the provisioner accepted it.
    ready_at_s: float | None = None
    attempts: int = 0
    last_error: str = ""
    # False once the error is permanent: retried only at the backoff's longest interval.
    retryable: bool = True
    next_try_at_s: float = 0.0

    @property
    def applied(self) -> bool:
        return self.ready_at_s is not None


@dataclass(frozen=True, slots=True)
class PoolRecord:
    cluster: ClusterName
    pool: str
    # One entry per idle ready node: since when it has been idle (oldest first).
    idle_since_s: tuple[float, ...] = ()
    nodes: int = 0


def settings_to_dict(s: CapacitySettings) -> dict[str, Any]:
    return {
        "provisioner": s.provisioner.value,
        "lead_time_s": s.lead_time_s,
        "idle_ttl_s": s.idle_ttl_s,
        "spend_ceiling_usd_per_hour": s.spend_ceiling_usd_per_hour,
        "cloud_gpu_limits": {p.value: n for p, n in s.cloud_gpu_limits},
        "max_nodes_per_pool": s.max_nodes_per_pool,
        "pulumi_backend_url": s.pulumi_backend_url,
        "cluster_settings": {c: dict(kv) for c, kv in s.cluster_settings},
        "retry_base_s": s.retry_base_s,
        "retry_max_s": s.retry_max_s,
        "simulated_boot_s": s.simulated_boot_s,
    }


def settings_from_dict(d: dict[str, Any]) -> CapacitySettings:
    return CapacitySettings(
        provisioner=ProvisionerKind(d.get("provisioner", "none")),
        lead_time_s=float(d.get("lead_time_s", 600.0)),
        idle_ttl_s=float(d.get("idle_ttl_s", 1800.0)),
        spend_ceiling_usd_per_hour=d.get("spend_ceiling_usd_per_hour"),
        cloud_gpu_limits=tuple((Provider(p), int(n)) for p, n in (d.get("cloud_gpu_limits") or {}).items()),
        max_nodes_per_pool=int(d.get("max_nodes_per_pool", 16)),
        pulumi_backend_url=str(d.get("pulumi_backend_url", "")),
        cluster_settings=tuple(
            (c, tuple(sorted(kv.items()))) for c, kv in (d.get("cluster_settings") or {}).items()
        ),
        retry_base_s=float(d.get("retry_base_s", 2.0)),
        retry_max_s=float(d.get("retry_max_s", 300.0)),
        simulated_boot_s=d.get("simulated_boot_s"),
    )


def plan_to_dict(p: PlanRecord) -> dict[str, Any]:
    return {
        "plan_id": p.plan_id,
        "kind": p.kind.value,
        "cluster": p.cluster,
        "gpu_type": p.gpu_type,
        "created_by": p.created_by,
        "created_at_s": p.created_at_s,
        "gpus": p.gpus,
        "start_s": p.start_s,
        "end_s": p.end_s,
        "job_ids": list(p.job_ids),
        "pool": p.pool,
        "reason": p.reason,
        "cancelled_at_s": p.cancelled_at_s,
        "cancelled_by": p.cancelled_by,
        "requested_gpus": p.requested_gpus,
        "held_back_by": p.held_back_by,
        "tenant": p.tenant,
    }


def plan_from_dict(d: dict[str, Any]) -> PlanRecord:
    return PlanRecord(
        plan_id=d["plan_id"],
        kind=PlanKind(d["kind"]),
        cluster=ClusterName(d["cluster"]),
        gpu_type=GpuType(d["gpu_type"]),
        created_by=d.get("created_by", ""),
        created_at_s=float(d.get("created_at_s", 0.0)),
        gpus=int(d.get("gpus", 0)),
        start_s=float(d.get("start_s", 0.0)),
        end_s=float(d.get("end_s", 0.0)),
        job_ids=tuple(JobId(j) for j in d.get("job_ids", ())),
        pool=d.get("pool", ""),
        reason=d.get("reason", ""),
        cancelled_at_s=d.get("cancelled_at_s"),
        cancelled_by=d.get("cancelled_by", ""),
        requested_gpus=int(d.get("requested_gpus", 0)),
        held_back_by=d.get("held_back_by", ""),
        tenant=d.get("tenant", ""),
    )


def held_to_dict(h: PlanHeldRecord) -> dict[str, Any]:
    return {
        "plan_id": h.plan_id,
        "since_s": h.since_s,
        "gpus": h.gpus,
        "usd_per_hour": h.usd_per_hour,
        "gpu_s": h.gpu_s,
        "usd": h.usd,
    }


def held_from_dict(d: dict[str, Any]) -> PlanHeldRecord:
    return PlanHeldRecord(
        plan_id=d["plan_id"],
        since_s=float(d["since_s"]),
        gpus=int(d.get("gpus", 0)),
        usd_per_hour=float(d.get("usd_per_hour", 0.0)),
        gpu_s=float(d.get("gpu_s", 0.0)),
        usd=float(d.get("usd", 0.0)),
    )


def op_to_dict(o: PendingOp) -> dict[str, Any]:
    return {
        "cluster": o.cluster,
        "pool": o.pool,
        "nodes_from": o.nodes_from,
        "nodes_to": o.nodes_to,
        "started_at_s": o.started_at_s,
        "reason": o.reason,
        "job_ids": list(o.job_ids),
        "plan_ids": list(o.plan_ids),
        "ready_at_s": o.ready_at_s,
        "attempts": o.attempts,
        "last_error": o.last_error,
        "retryable": o.retryable,
        "next_try_at_s": o.next_try_at_s,
    }


def op_from_dict(d: dict[str, Any]) -> PendingOp:
    return PendingOp(
        cluster=ClusterName(d["cluster"]),
        pool=d["pool"],
        nodes_from=int(d["nodes_from"]),
        nodes_to=int(d["nodes_to"]),
        started_at_s=float(d["started_at_s"]),
        reason=d.get("reason", ""),
        job_ids=tuple(JobId(j) for j in d.get("job_ids", ())),
        plan_ids=tuple(d.get("plan_ids", ())),
        ready_at_s=d.get("ready_at_s"),
        attempts=int(d.get("attempts", 0)),
        last_error=d.get("last_error", ""),
        retryable=bool(d.get("retryable", True)),
        next_try_at_s=float(d.get("next_try_at_s", 0.0)),
    )


def pool_to_dict(p: PoolRecord) -> dict[str, Any]:
    return {"cluster": p.cluster, "pool": p.pool, "idle_since_s": list(p.idle_since_s), "nodes": p.nodes}


def pool_from_dict(d: dict[str, Any]) -> PoolRecord:
    return PoolRecord(
        cluster=ClusterName(d["cluster"]),
        pool=d["pool"],
        idle_since_s=tuple(float(s) for s in d.get("idle_since_s", ())),
        nodes=int(d.get("nodes", 0)),
    )


def interval_to_dict(iv: ProvisionedInterval) -> dict[str, Any]:
    return {
        "cluster": iv.cluster,
        "pool": iv.pool,
        "gpu_type": iv.gpu_type,
        "gpu_count": iv.gpu_count,
        "usd_per_gpu_hour": iv.usd_per_gpu_hour,
        "start_s": iv.start_s,
        "end_s": iv.end_s,
        "kind": iv.kind.value,
    }


def interval_from_dict(d: dict[str, Any]) -> ProvisionedInterval:
    return ProvisionedInterval(
        cluster=d["cluster"],
        pool=d["pool"],
        gpu_type=d["gpu_type"],
        gpu_count=int(d["gpu_count"]),
        usd_per_gpu_hour=float(d["usd_per_gpu_hour"]),
        start_s=float(d["start_s"]),
        end_s=d.get("end_s"),
        kind=CapacityKind(d.get("kind", CapacityKind.ON_DEMAND.value)),
    )


def pool_suffix(cluster: str, pool: str) -> bytes:
    return f"{cluster}/{pool}".encode()


def interval_key(iv: ProvisionedInterval, tag: str) -> bytes:
    """One key per interval: its start, then a tag, since a split interval keeps its start."""
    return PROVISIONED + pool_suffix(iv.cluster, iv.pool) + f"/{int(iv.start_s * 1e9):020d}-{tag}".encode()
