"""Whether the pools can hold a capacity plan, and what they hold for each plan (pure).

A plan is a promise of GPUs, so it is checked when it is made, against everything that bounds what
the scalable pools can hold: each pool's maximum, each cloud's GPU limit and the spend ceiling. It
is checked at every moment its window could get tighter: when it is first held (its start less the
lead time, or now) and whenever another plan starts to be held within its window. At a moment to
come the pools hold their minimum plus what the other plans need then; now, what they hold. The
other plans come first, in the order they were made: a new plan never takes an older one's nodes
(`iac.plans.required_capacity` keeps that order, and so does the reconciler).

A plan that fits whole is admitted. One that does not is refused with the shortfall and the limit
that binds, or, for a fixed plan whose maker allows it, admitted for the most GPUs that fit (whole
nodes), the rest stated as its shortfall. A deadline plan is all or nothing: fewer GPUs than its
jobs need would miss the deadline it exists for.

What a plan holds (`held_by_plan`) is what the pools have, not what was asked: each pool's ready
nodes (as the cluster lists them) go to the plans in the order they were made, each up to what
`required_capacity` placed for it there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from iac.decide import Limits
from iac.plans import CapacityPlan, DeadlinePlan, FixedPlan, PlanNeed, required_capacity
from iac.pool_state import PoolKey, PoolState
from placement.model import CapacityKind


@dataclass(frozen=True, slots=True)
class Admission:
    requested_gpus: int
    # The most the pools can hold for it whole-node (a fixed plan); the deadline plan's need.
    granted_gpus: int
    # Each limit that holds it back, worded for a person (empty: it fits whole).
    held_back_by: tuple[str, ...] = ()
    meetable: bool = True

    @property
    def shortfall_gpus(self) -> int:
        return max(0, self.requested_gpus - self.granted_gpus)

    @property
    def whole(self) -> bool:
        return not self.held_back_by and self.meetable


@dataclass(frozen=True, slots=True)
class PlanHeld:
    plan_id: str
    gpus: int
    usd_per_hour: float
    nodes_by_pool: tuple[tuple[PoolKey, int], ...] = ()


def nodes_with_and_without(
    plan: CapacityPlan,
    others: Sequence[CapacityPlan],
    pools: Sequence[PoolState],
    *,
    at_s: float,
    now_s: float,
    lead_time_s: float,
) -> tuple[dict[PoolKey, int], dict[PoolKey, int], tuple[PlanNeed, ...]]:
    """Each pool's nodes at `at_s` without `plan` and with it (held after `others`), and every plan's
    need with it (`plan`'s last). At
    a moment to come the pools hold their minimum plus what the other plans need then; now, what they
    hold. The preview shows the difference; `admit` checks it against the limits."""
    base = {p.key: (p.nodes if at_s <= now_s else p.min_nodes) for p in pools}
    without = required_capacity(others, pools, now_s=at_s, lead_time_s=lead_time_s).floors
    both = required_capacity([*others, plan], pools, now_s=at_s, lead_time_s=lead_time_s)
    before = {p.key: max(base[p.key], without.get(p.key, 0)) for p in pools}
    after = {p.key: max(before[p.key], both.floors.get(p.key, 0)) for p in pools}
    return before, after, both.needs


def _moments(
    plan: CapacityPlan, others: Sequence[CapacityPlan], now_s: float, lead_time_s: float
) -> list[float]:
    """When the plan's window can get tighter: its first held moment, and each start of another
    plan's hold within its window (a plan ending only frees nodes)."""
    if isinstance(plan, DeadlinePlan):
        return [now_s]
    first = max(now_s, plan.start_s - lead_time_s)
    later = {
        o.start_s - lead_time_s
        for o in others
        if isinstance(o, FixedPlan) and first < o.start_s - lead_time_s < plan.end_s and o.end_s > first
    }
    return [first, *sorted(later)]


def _breaches(
    plan: CapacityPlan,
    others: Sequence[CapacityPlan],
    pools: Sequence[PoolState],
    limits: Limits,
    *,
    at_s: float,
    now_s: float,
    lead_time_s: float,
) -> tuple[list[str], PlanNeed]:
    """The limits the pools would break at `at_s` with `plan` held after `others`, and its need."""
    before, after, needs = nodes_with_and_without(
        plan, others, pools, at_s=at_s, now_s=now_s, lead_time_s=lead_time_s
    )
    need = needs[-1]
    out: list[str] = []
    if not any(p.cluster == plan.cluster and p.gpu_type == plan.gpu_type for p in pools):
        return [f"no provisionable {plan.gpu_type} pool in {plan.cluster}"], need
    if need.shortfall_gpus:
        touched = [p for p in pools if p.cluster == plan.cluster and p.gpu_type == plan.gpu_type]
        most = sum(p.max_nodes * p.gpus_per_node for p in touched if plan.pool in ("", p.pool))
        out.append(
            f"the pools' maximum ({plan.gpu_type} pools of {plan.cluster} hold at most {most} GPUs, "
            "with the other plans' share)"
        )
    for provider, cap in sorted(limits.max_gpus_by_provider.items()):
        mine = [p for p in pools if p.provider == provider]
        gpus_before = sum(before[p.key] * p.gpus_per_node for p in mine)
        gpus_after = sum(after[p.key] * p.gpus_per_node for p in mine)
        if gpus_after > cap and gpus_after > gpus_before:
            out.append(f"the {provider} limit of {cap} GPUs ({gpus_before} held or planned without it)")
    ceiling = limits.max_usd_per_hour
    if ceiling is not None:
        usd_before = sum(p.usd_per_hour(before[p.key]) for p in pools)
        usd_after = sum(p.usd_per_hour(after[p.key]) for p in pools)
        if usd_after > ceiling + 1e-9 and usd_after > usd_before + 1e-9:
            out.append(
                f"the spend ceiling of ${ceiling:,.2f}/h (${usd_before:,.2f}/h without it, "
                f"${usd_after:,.2f}/h with it)"
            )
    return out, need


def _check(
    plan: CapacityPlan,
    others: Sequence[CapacityPlan],
    pools: Sequence[PoolState],
    limits: Limits,
    moments: Sequence[float],
    *,
    now_s: float,
    lead_time_s: float,
) -> tuple[list[str], PlanNeed]:
    found: list[str] = []
    need: PlanNeed | None = None
    for at in moments:
        broken, got = _breaches(plan, others, pools, limits, at_s=at, now_s=now_s, lead_time_s=lead_time_s)
        need = need or got
        found.extend(b for b in broken if b not in found)
    assert need is not None
    return found, need


def admit(
    plan: CapacityPlan,
    others: Sequence[CapacityPlan],
    pools: Sequence[PoolState],
    limits: Limits,
    *,
    now_s: float,
) -> Admission:
    """Whether the pools can hold `plan` after `others` (in the order they were made)."""
    lead = limits.lead_time_s
    moments = _moments(plan, others, now_s, lead)
    broken, need = _check(plan, others, pools, limits, moments, now_s=now_s, lead_time_s=lead)
    if isinstance(plan, DeadlinePlan):
        return Admission(need.gpus, 0 if broken else need.gpus, tuple(broken), need.meetable)
    if not broken:
        return Admission(plan.gpus, plan.gpus)
    # The most whole nodes that fit: every limit only tightens as the plan grows, so bisect.
    step = next(
        (
            p.gpus_per_node
            for p in sorted(
                pools, key=lambda p: (p.kind is not CapacityKind.ON_DEMAND, p.usd_per_gpu_hour, p.pool)
            )
            if (p.cluster, p.gpu_type) == (plan.cluster, plan.gpu_type) and plan.pool in ("", p.pool)
        ),
        1,
    )
    low, high = 0, math.ceil(plan.gpus / step) - 1
    while low < high:
        middle = (low + high + 1) // 2
        still, _ = _check(
            replace(plan, gpus=middle * step), others, pools, limits, moments, now_s=now_s, lead_time_s=lead
        )
        if still:
            high = middle - 1
        else:
            low = middle
    return Admission(plan.gpus, min(plan.gpus, low * step), tuple(broken))


def held_by_plan(
    needs: Sequence[PlanNeed], pools: Sequence[PoolState], ready_nodes: Mapping[PoolKey, int]
) -> dict[str, PlanHeld]:
    """What each plan holds of the pools' ready nodes, the plans taken in `needs`' order."""
    by_key = {p.key: p for p in pools}
    left = dict(ready_nodes)
    out: dict[str, PlanHeld] = {}
    for need in needs:
        taken: list[tuple[PoolKey, int]] = []
        for key, nodes in need.nodes_by_pool:
            take = min(nodes, left.get(key, 0))
            if take > 0 and key in by_key:
                left[key] -= take
                taken.append((key, take))
        gpus = sum(by_key[k].gpus_per_node * n for k, n in taken)
        usd = sum(by_key[k].usd_per_hour(n) for k, n in taken)
        out[need.plan_id] = PlanHeld(need.plan_id, gpus, usd, tuple(taken))
    return out
