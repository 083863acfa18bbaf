"""What size each scalable pool should be: pure decisions for the capacity reconciler.

Inputs are the placer's capacity requests (whole nodes for one whole gang each), the infra team's
capacity plans, each pool's state and the limits; out come pool changes with their reasons and
costs, and every request refused with its reason. The rules, in order:

1. A pool never goes below its floor: its minimum, the nodes running jobs (a node that runs a job
   is never removed), and what the active capacity plans need of it (`iac.plans`: provisioned the
   lead time before a plan starts, released at its end). Plans count against the per-cloud GPU
   limit but not the spend ceiling: a person approved them with their cost shown.
2. Requests grow pools, in the placer's order, one gang's request at a time and whole or not at
   all, within the pool's maximum, the cloud's GPU limit and the spend ceiling per hour. A request
   whose jobs are already being provisioned for is not asked again (the placer repeats it every
   cycle until the nodes show in inventory), and one whose gang will start elsewhere before new
   nodes could be ready (a reservation within the lead time) is refused as not worth buying.
3. Ready nodes that have run nothing for the idle TTL are released, down to the floor; nodes a
   request or a plan has just asked for are not (a pool grows or shrinks in one decision, not both).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from iac.plans import CapacityPlan, PlanNeed, required_capacity
from iac.pool_state import PoolKey, PoolState
from placement.model import CapacityRequest, JobId, Provider


@dataclass(frozen=True, slots=True)
class Limits:
    # GPUs gpufed may hold per provider at once (a cloud account's quota); absent: no limit.
    max_gpus_by_provider: Mapping[Provider, int] = field(default_factory=dict)
    # What the scalable pools may cost per hour in total (None: no ceiling).
    max_usd_per_hour: float | None = None
    lead_time_s: float = 600.0
    idle_ttl_s: float = 1800.0


class RefusalCode(StrEnum):
    UNKNOWN_POOL = "unknown_pool"
    POOL_MAX_NODES = "pool_max_nodes"
    PROVIDER_GPU_LIMIT = "provider_gpu_limit"
    SPEND_CEILING = "spend_ceiling"
    STARTS_SOONER_ELSEWHERE = "starts_sooner_elsewhere"


@dataclass(frozen=True, slots=True)
class Refusal:
    request: CapacityRequest
    code: RefusalCode
    reason: str


@dataclass(frozen=True, slots=True)
class PoolChange:
    cluster: str
    pool: str
    nodes_from: int
    nodes_to: int
    reasons: tuple[str, ...]
    usd_per_hour_before: float
    usd_per_hour_after: float
    # Jobs whose gangs wait for these nodes, and plans that hold them (empty for scale-downs).
    job_ids: tuple[JobId, ...] = ()
    plan_ids: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


@dataclass(frozen=True, slots=True)
class Decision:
    changes: tuple[PoolChange, ...]
    refused: tuple[Refusal, ...]
    plans: tuple[PlanNeed, ...] = ()
    # What the scalable pools cost per hour now, and after the changes.
    usd_per_hour_before: float = 0.0
    usd_per_hour_after: float = 0.0


def decide(
    *,
    pools: Sequence[PoolState],
    requests: Sequence[CapacityRequest],
    plans: Sequence[CapacityPlan],
    limits: Limits,
    now_s: float,
    provisioning_for: frozenset[JobId] = frozenset(),
    starts_at_s: Mapping[JobId, float] | None = None,
) -> Decision:
    """`provisioning_for`: jobs whose nodes are being provisioned already. `starts_at_s`: when a
    blocked gang is expected to start anyway (the placer's reservations)."""
    by_key = {p.key: p for p in pools}
    target = {p.key: p.nodes for p in pools}
    reasons: dict[PoolKey, list[str]] = defaultdict(list)
    jobs: dict[PoolKey, list[JobId]] = defaultdict(list)
    plan_ids: dict[PoolKey, list[str]] = defaultdict(list)

    required = required_capacity(plans, pools, now_s=now_s, lead_time_s=limits.lead_time_s)
    floor = {p.key: max(p.min_nodes, p.busy_nodes) for p in pools}
    for need in required.needs:
        for key, _ in need.nodes_by_pool:
            plan_ids[key].append(need.plan_id)
    for key, nodes in required.floors.items():
        if nodes > floor[key]:
            floor[key] = nodes
    _grow_to_floors(pools, target, floor, limits, reasons, plan_ids)

    def gpus_of(provider: Provider) -> int:
        return sum(target[p.key] * p.gpus_per_node for p in pools if p.provider == provider)

    def spend() -> float:
        return sum(p.usd_per_hour(target[p.key]) for p in pools)

    refused: list[Refusal] = []
    for request in requests:
        if request.job_ids and all(j in provisioning_for for j in request.job_ids):
            continue
        pool = by_key.get((request.cluster, request.pool))
        if pool is None:
            refused.append(
                Refusal(
                    request,
                    RefusalCode.UNKNOWN_POOL,
                    f"{request.cluster}/{request.pool} is not a scalable pool",
                )
            )
            continue
        ready_at = now_s + limits.lead_time_s
        sooner = [
            s for j in request.job_ids if (s := (starts_at_s or {}).get(j)) is not None and s <= ready_at
        ]
        if request.job_ids and len(sooner) == len(request.job_ids):
            refused.append(
                Refusal(
                    request,
                    RefusalCode.STARTS_SOONER_ELSEWHERE,
                    f"the gang is expected to start at {max(sooner):.0f}, before new nodes "
                    f"would be ready at {ready_at:.0f}",
                )
            )
            continue
        want = target[pool.key] + request.nodes
        if want > pool.max_nodes:
            refused.append(
                Refusal(
                    request,
                    RefusalCode.POOL_MAX_NODES,
                    f"{pool.cluster}/{pool.pool} would need {want} nodes, "
                    f"above its maximum of {pool.max_nodes}",
                )
            )
            continue
        extra_gpus = request.nodes * pool.gpus_per_node
        cap = limits.max_gpus_by_provider.get(pool.provider)
        if cap is not None and gpus_of(pool.provider) + extra_gpus > cap:
            refused.append(
                Refusal(
                    request,
                    RefusalCode.PROVIDER_GPU_LIMIT,
                    f"{pool.provider} limit of {cap} GPUs ({gpus_of(pool.provider)} held or asked, "
                    f"+{extra_gpus} asked)",
                )
            )
            continue
        extra_usd = pool.usd_per_hour(request.nodes)
        if limits.max_usd_per_hour is not None and spend() + extra_usd > limits.max_usd_per_hour:
            refused.append(
                Refusal(
                    request,
                    RefusalCode.SPEND_CEILING,
                    f"spend ceiling of ${limits.max_usd_per_hour:,.2f}/h (${spend():,.2f}/h now, "
                    f"+${extra_usd:,.2f}/h asked)",
                )
            )
            continue
        target[pool.key] = want
        reasons[pool.key].append(f"{request.nodes} node(s) for {', '.join(request.job_ids)}")
        jobs[pool.key].extend(request.job_ids)

    for p in pools:
        if target[p.key] != p.nodes:
            continue
        expired = sum(1 for since in p.idle_since_s if now_s - since >= limits.idle_ttl_s)
        shrunk = max(floor[p.key], p.nodes - expired)
        if shrunk < p.nodes:
            target[p.key] = shrunk
            reasons[p.key].append(
                f"{p.nodes - shrunk} node(s) idle for at least {limits.idle_ttl_s:.0f}s (the idle TTL)"
            )

    changes = tuple(
        PoolChange(
            p.cluster,
            p.pool,
            p.nodes,
            target[p.key],
            tuple(reasons[p.key]),
            p.usd_per_hour(p.nodes),
            p.usd_per_hour(target[p.key]),
            tuple(jobs[p.key]),
            tuple(plan_ids[p.key]) if target[p.key] > p.nodes else (),
        )
        for p in sorted(pools, key=lambda p: p.key)
        if target[p.key] != p.nodes
    )
    return Decision(
        changes,
        tuple(refused),
        required.needs,
        sum(p.usd_per_hour(p.nodes) for p in pools),
        sum(p.usd_per_hour(target[p.key]) for p in pools),
    )


def _grow_to_floors(
    pools: Sequence[PoolState],
    target: dict[PoolKey, int],
    floor: dict[PoolKey, int],
    limits: Limits,
    reasons: dict[PoolKey, list[str]],
    plan_ids: dict[PoolKey, list[str]],
) -> None:
    """Raise each pool to its floor, within the per-cloud GPU limit (a cloud's quota binds plans too)."""
    for p in sorted(pools, key=lambda p: p.key):
        if floor[p.key] <= target[p.key]:
            continue
        cap = limits.max_gpus_by_provider.get(p.provider)
        nodes = floor[p.key]
        if cap is not None:
            held = sum(target[q.key] * q.gpus_per_node for q in pools if q.provider == p.provider)
            room = (cap - held) // p.gpus_per_node
            if room < nodes - target[p.key]:
                nodes = target[p.key] + max(0, room)
                reasons[p.key].append(f"{p.provider} limit of {cap} GPUs holds the plans' floor back")
        if nodes > target[p.key]:
            if plan_ids[p.key]:
                reasons[p.key].append(f"capacity plan(s) {', '.join(plan_ids[p.key])}")
            else:
                reasons[p.key].append("the pool's minimum and busy nodes")
            target[p.key] = nodes
        floor[p.key] = max(nodes, p.busy_nodes)
