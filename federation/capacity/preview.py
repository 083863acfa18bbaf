"""What a capacity plan would change and cost, and where each plan stands (pure).

A preview is computed for the moment the plan first holds GPUs (its start less the lead time, or
now if that has passed): each pool's floor from the other live plans and the pools' own minimums,
then again with this plan; the difference is what the plan adds, at the pools' prices. Nothing is
stored, so previews can be asked for freely before a plan is created.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from federation.capacity.admit import nodes_with_and_without
from federation.capacity.pools import PoolKey, ScalablePoolEntry
from federation.capacity.records import PlanKind, PlanRecord
from iac.plans import CapacityPlan, PlanNeed, required_capacity
from iac.pool_state import PoolState


@dataclass(frozen=True, slots=True)
class PoolDelta:
    key: PoolKey
    nodes_from: int
    nodes_to: int
    usd_per_hour_before: float
    usd_per_hour_after: float


@dataclass(frozen=True, slots=True)
class Preview:
    changes: tuple[PoolDelta, ...]
    gpus: int
    usd_per_hour: float
    total_usd: float
    shortfall_gpus: int
    meetable: bool
    note: str
    provision_at_s: float


def pool_states(
    entries: Mapping[PoolKey, ScalablePoolEntry], nodes: Mapping[PoolKey, int], busy: Mapping[PoolKey, int]
) -> list[PoolState]:
    return [
        PoolState(
            cluster=e.cluster,
            pool=e.config.name,
            provider=e.provider,
            gpu_type=e.config.gpu_type,
            kind=e.config.kind,
            gpus_per_node=e.config.gpus_per_node,
            usd_per_gpu_hour=e.config.usd_per_gpu_hour,
            nodes=nodes.get(k, e.min_nodes),
            busy_nodes=busy.get(k, 0),
            max_nodes=e.max_nodes,
            min_nodes=e.min_nodes,
        )
        for k, e in sorted(entries.items())
        if e.spec is not None
    ]


def plan_state(plan: PlanRecord, now_s: float, lead_time_s: float) -> str:
    if plan.cancelled_at_s is not None:
        return "cancelled"
    if now_s >= plan.end_s:
        return "ended"
    if plan.kind is PlanKind.DEADLINE or now_s >= plan.start_s:
        return "active"
    return "provisioning" if now_s >= plan.start_s - lead_time_s else "scheduled"


def held_now(
    plans: Sequence[CapacityPlan], pools: Sequence[PoolState], *, now_s: float, lead_time_s: float
) -> dict[str, PlanNeed]:
    """Each live plan's need at `now_s`, by plan id."""
    needs = required_capacity(plans, pools, now_s=now_s, lead_time_s=lead_time_s).needs
    return {n.plan_id: n for n in needs}


def need_usd_per_hour(need: PlanNeed, pools: Sequence[PoolState]) -> float:
    by_key = {p.key: p for p in pools}
    return sum(by_key[k].usd_per_hour(n) for k, n in need.nodes_by_pool if k in by_key)


def preview(
    plan: CapacityPlan,
    record: PlanRecord,
    others: Sequence[CapacityPlan],
    pools: Sequence[PoolState],
    *,
    now_s: float,
    lead_time_s: float,
) -> Preview:
    at = now_s if record.kind is PlanKind.DEADLINE else max(now_s, record.start_s - lead_time_s)
    # At a future moment the pools hold their minimum plus what other plans need then; now, what they hold.
    before, after, needs = nodes_with_and_without(
        plan, others, pools, at_s=at, now_s=now_s, lead_time_s=lead_time_s
    )
    need = next(n for n in needs if n.plan_id == record.plan_id)
    changes = [
        PoolDelta(
            p.key, before[p.key], after[p.key], p.usd_per_hour(before[p.key]), p.usd_per_hour(after[p.key])
        )
        for p in pools
        if after[p.key] != before[p.key]
    ]
    usd = need_usd_per_hour(need, pools)
    hours = max(0.0, record.end_s - at) / 3600.0
    note = need.reason
    if not any(p.cluster == record.cluster and p.gpu_type == record.gpu_type for p in pools):
        note = note or f"no scalable {record.gpu_type} pool in {record.cluster}"
    return Preview(
        changes=tuple(changes),
        gpus=need.gpus,
        usd_per_hour=usd,
        total_usd=usd * hours,
        shortfall_gpus=need.shortfall_gpus,
        meetable=need.meetable,
        note=note,
        provision_at_s=at,
    )
