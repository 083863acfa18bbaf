"""What size each scalable pool should be: pure decisions for the capacity reconciler.

Inputs are the placer's capacity requests (whole nodes for whole gangs), the infra team's capacity
plans, and each pool's state; out come pool changes with reasons, and the requests refused with
theirs. The rules, in order:

1. A pool never goes below its floor: its minimum, the nodes running jobs (never remove a node that
   runs one), and what an active capacity plan asks for. A plan is active from its start less the
   provisioning lead time (so the nodes are ready when it starts) until its end.
2. Requests grow pools, one gang's request at a time, oldest first, within the pool's maximum, the
   cloud's GPU limit and the federation's spend ceiling per hour. A request already being provisioned
   (its jobs are pending) is not asked again: the placer repeats it every cycle until the nodes show.
3. Nodes above the floor that have been idle for longer than the idle TTL are released.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from placement.model_plan import CapacityRequest


@dataclass(frozen=True, slots=True)
class PoolState:
    cluster: str
    pool: str
    provider: str
    gpu_type: str
    gpus_per_node: int
    usd_per_gpu_hour: float
    # The count asked for (including scale-ups still booting), and the nodes running any job.
    nodes: int
    busy_nodes: int
    min_nodes: int = 0
    max_nodes: int = 0
    # Nodes with nothing on them, and since when at least that many have been idle (None: none idle).
    idle_nodes: int = 0
    idle_since_s: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.cluster, self.pool)


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """The infra team's capacity: `gpus` of a pool's type from `start_s` to `end_s`."""

    plan_id: str
    cluster: str
    pool: str
    gpus: int
    start_s: float
    end_s: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Limits:
    # GPUs gpufed may hold per provider at once (a cloud account's quota); absent: no limit.
    max_gpus_by_provider: Mapping[str, int] = field(default_factory=dict)
    # What scalable pools may cost per hour in total (None: no ceiling).
    max_usd_per_hour: float | None = None
    lead_time_s: float = 600.0
    idle_ttl_s: float = 1800.0


@dataclass(frozen=True, slots=True)
class PoolChange:
    cluster: str
    pool: str
    nodes_from: int
    nodes_to: int
    reason: str
    # Jobs whose gangs wait for these nodes (empty for plans and scale-downs).
    job_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Refusal:
    request: CapacityRequest
    reason: str


@dataclass(frozen=True, slots=True)
class Decision:
    changes: tuple[PoolChange, ...]
    refused: tuple[Refusal, ...]


def plan_nodes(plan: CapacityPlan, pool: PoolState) -> int:
    return math.ceil(plan.gpus / pool.gpus_per_node)


def active(plan: CapacityPlan, now_s: float, lead_time_s: float) -> bool:
    return plan.start_s - lead_time_s <= now_s < plan.end_s


def gpus_for_deadline(jobs: Sequence[tuple[int, float]], *, now_s: float, deadline_s: float) -> int:
    """GPUs needed to run `jobs` ((GPUs, seconds of run time) each) by the deadline, all at once at
    worst: the work in GPU-seconds spread over the time left, but never fewer than the largest job."""
    if deadline_s <= now_s:
        raise ValueError("the deadline has passed")
    work = sum(g * s for g, s in jobs)
    return max(math.ceil(work / (deadline_s - now_s)), max((g for g, _ in jobs), default=0))


def decide(
    *,
    pools: Sequence[PoolState],
    requests: Sequence[CapacityRequest],
    plans: Sequence[CapacityPlan],
    limits: Limits,
    now_s: float,
    pending_jobs: frozenset[str] = frozenset(),
) -> Decision:
    by_key = {p.key: p for p in pools}
    target = {p.key: p.nodes for p in pools}
    reasons: dict[tuple[str, str], list[str]] = defaultdict(list)
    jobs: dict[tuple[str, str], list[str]] = defaultdict(list)

    floor: dict[tuple[str, str], int] = {}
    for p in pools:
        floor[p.key] = max(p.min_nodes, p.busy_nodes)
    for plan in plans:
        pool = by_key.get((plan.cluster, plan.pool))
        if pool is not None and active(plan, now_s, limits.lead_time_s):
            need = plan_nodes(plan, pool)
            if need > floor[pool.key]:
                floor[pool.key] = need
                reasons[pool.key].append(f"capacity plan {plan.plan_id} ({plan.gpus} GPUs until its end)")
    for key, nodes in floor.items():
        if nodes > target[key]:
            target[key] = nodes

    def gpus_of(provider: str) -> int:
        return sum(target[p.key] * p.gpus_per_node for p in pools if p.provider == provider)

    def spend() -> float:
        return sum(target[p.key] * p.gpus_per_node * p.usd_per_gpu_hour for p in pools)

    refused: list[Refusal] = []
    for request in requests:
        if request.job_ids and all(j in pending_jobs for j in request.job_ids):
            continue
        pool = by_key.get((request.cluster, request.pool))
        if pool is None:
            refused.append(Refusal(request, f"{request.cluster}/{request.pool} is not a scalable pool"))
            continue
        want = target[pool.key] + request.nodes
        if pool.max_nodes and want > pool.max_nodes:
            refused.append(
                Refusal(request, f"{pool.cluster}/{pool.pool} would exceed its {pool.max_nodes} nodes")
            )
            continue
        extra_gpus = request.nodes * pool.gpus_per_node
        cap = limits.max_gpus_by_provider.get(pool.provider)
        if cap is not None and gpus_of(pool.provider) + extra_gpus > cap:
            refused.append(
                Refusal(
                    request, f"{pool.provider} limit of {cap} GPUs ({gpus_of(pool.provider)} held or asked)"
                )
            )
            continue
        extra_usd = extra_gpus * pool.usd_per_gpu_hour
        if limits.max_usd_per_hour is not None and spend() + extra_usd > limits.max_usd_per_hour:
            refused.append(
                Refusal(
                    request,
                    f"spend ceiling of ${limits.max_usd_per_hour:,.2f}/h (${spend():,.2f}/h now, "
                    f"+${extra_usd:,.2f}/h asked)",
                )
            )
            continue
        target[pool.key] = want
        reasons[pool.key].append(f"{request.nodes} node(s) for {', '.join(request.job_ids)}")
        jobs[pool.key].extend(request.job_ids)

    for p in pools:
        if target[p.key] != p.nodes or p.idle_since_s is None:
            continue
        if now_s - p.idle_since_s < limits.idle_ttl_s:
            continue
        shrunk = max(floor[p.key], p.nodes - p.idle_nodes)
        if shrunk < p.nodes:
            target[p.key] = shrunk
            idle_for = now_s - p.idle_since_s
            reasons[p.key].append(
                f"{p.nodes - shrunk} node(s) idle for {idle_for:.0f}s (TTL {limits.idle_ttl_s:.0f}s)"
            )

    changes = tuple(
        PoolChange(p.cluster, p.pool, p.nodes, target[p.key], "; ".join(reasons[p.key]), tuple(jobs[p.key]))
        for p in sorted(pools, key=lambda p: p.key)
        if target[p.key] != p.nodes
    )
    return Decision(changes=changes, refused=tuple(refused))
