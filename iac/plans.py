"""Capacity plans of the infra team, and what each asks of the pools at a given moment (pure).

Two kinds. A `FixedPlan` holds GPUs of one type in one cluster over a window ("64 H100 in
aws-us-east-1 from Monday 08:00 to Friday 20:00"). A `DeadlinePlan` holds enough GPUs to finish
given jobs by a deadline ("enough A100 to finish these jobs by Friday"): the GPU count is the
smallest that runs every gang, longest first, to the end before the deadline, counting from when new
nodes would be ready (now plus the provisioning lead time).

A plan is provisioned ahead by the lead time (its nodes are ready when it starts) and released at
its end (the idle TTL then lets go of nodes no job is using). `required_capacity` turns the plans
into each pool's floor now, filling on-demand pools before spot ones (a plan is a promise that a
spot reclaim would break), cheapest first, each up to its maximum; what does not fit is reported.

Nothing here reads a clock or does I/O: `now_s` is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from iac.pool_state import PoolKey, PoolState
from placement.model import CapacityKind, ClusterName, GpuType, JobId


@dataclass(frozen=True, slots=True)
class FixedPlan:
    plan_id: str
    cluster: ClusterName
    gpu_type: GpuType
    gpus: int
    start_s: float
    end_s: float
    # One pool of the cluster (empty: any pool of that GPU type there).
    pool: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class DeadlineJob:
    job_id: JobId
    # The gang's GPUs, and the run time it still needs (on this GPU type).
    gpus: int
    remaining_s: float


@dataclass(frozen=True, slots=True)
class DeadlinePlan:
    plan_id: str
    cluster: ClusterName
    gpu_type: GpuType
    jobs: tuple[DeadlineJob, ...]
    deadline_s: float
    pool: str = ""
    reason: str = ""


CapacityPlan = FixedPlan | DeadlinePlan


@dataclass(frozen=True, slots=True)
class PlanNeed:
    """What one plan asks of the pools now: GPUs, nodes per pool, and what could not be placed."""

    plan_id: str
    active: bool
    gpus: int
    nodes_by_pool: tuple[tuple[PoolKey, int], ...]
    shortfall_gpus: int = 0
    # False when even every job at once would not finish by the deadline.
    meetable: bool = True
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RequiredCapacity:
    # The nodes each pool must have now for the active plans (pools no plan touches are absent).
    floors: dict[PoolKey, int]
    needs: tuple[PlanNeed, ...]


def makespan_s(jobs: Sequence[tuple[int, float]], gpus: int) -> float:
    """When the last of `jobs` (gang GPUs, run time) ends on `gpus` GPUs, each gang started whole as
    soon as enough GPUs are free, longest first (inf if a gang is larger than `gpus`)."""
    if any(g > gpus for g, _ in jobs):
        return math.inf
    queue = sorted(((s, g) for g, s in jobs if s > 0 and g > 0), reverse=True)
    running: list[tuple[float, int]] = []
    now = 0.0
    free = gpus
    while queue:
        for item in list(queue):
            if item[1] <= free:
                queue.remove(item)
                free -= item[1]
                running.append((now + item[0], item[1]))
        if queue:
            running.sort()
            end, g = running.pop(0)
            now, free = max(now, end), free + g
    return max((end for end, _ in running), default=now)


def gpus_for_deadline(
    jobs: Sequence[tuple[int, float]], *, available_s: float, step_gpus: int = 1
) -> int | None:
    """The fewest GPUs (a multiple of `step_gpus`) that run `jobs` within `available_s`; None when
    not even all of them at once would (a job alone runs longer than the time left)."""
    work = [(g, s) for g, s in jobs if g > 0 and s > 0]
    if not work:
        return 0
    if max(s for _, s in work) > available_s:
        return None
    step = max(1, step_gpus)
    lower = max(math.ceil(sum(g * s for g, s in work) / available_s), max(g for g, _ in work))
    gpus = math.ceil(lower / step) * step
    while makespan_s(work, gpus) > available_s:
        gpus += step
    return gpus


def plan_gpus(
    plan: CapacityPlan, *, now_s: float, lead_time_s: float, step_gpus: int = 1
) -> tuple[int, bool]:
    """The GPUs `plan` needs held now (0 outside its window) and whether it can be met."""
    if isinstance(plan, FixedPlan):
        active = plan.start_s - lead_time_s <= now_s < plan.end_s
        return (plan.gpus if active else 0), True
    if now_s >= plan.deadline_s:
        return 0, True
    jobs = [(j.gpus, j.remaining_s) for j in plan.jobs]
    gpus = gpus_for_deadline(jobs, available_s=plan.deadline_s - now_s - lead_time_s, step_gpus=step_gpus)
    if gpus is None:
        # Too late to meet: still hold enough to run everything at once, the best that can be done.
        return sum(g for g, s in jobs if s > 0), False
    return gpus, True


def required_capacity(
    plans: Sequence[CapacityPlan], pools: Sequence[PoolState], *, now_s: float, lead_time_s: float
) -> RequiredCapacity:
    # In the caller's order, first come first held: a plan made later never takes an earlier one's nodes.
    floors: dict[PoolKey, int] = {}
    needs: list[PlanNeed] = []
    for plan in plans:
        candidates = sorted(
            (
                p
                for p in pools
                if p.cluster == plan.cluster and p.gpu_type == plan.gpu_type and plan.pool in ("", p.pool)
            ),
            key=lambda p: (p.kind is not CapacityKind.ON_DEMAND, p.usd_per_gpu_hour, p.pool),
        )
        step = candidates[0].gpus_per_node if candidates else 1
        gpus, meetable = plan_gpus(plan, now_s=now_s, lead_time_s=lead_time_s, step_gpus=step)
        left = gpus
        placed: list[tuple[PoolKey, int]] = []
        for pool in candidates:
            if left <= 0:
                break
            room = pool.max_nodes - floors.get(pool.key, 0)
            nodes = min(room, math.ceil(left / pool.gpus_per_node))
            if nodes > 0:
                floors[pool.key] = floors.get(pool.key, 0) + nodes
                placed.append((pool.key, nodes))
                left -= nodes * pool.gpus_per_node
        short = max(0, left)
        reason = ""
        if not candidates and gpus:
            reason = f"no scalable {plan.gpu_type} pool in {plan.cluster}"
        elif short:
            reason = f"{short} GPU(s) beyond the pools' maximum"
        elif not meetable:
            reason = "a job alone runs past the deadline"
        needs.append(PlanNeed(plan.plan_id, gpus > 0, gpus, tuple(placed), short, meetable, reason))
    return RequiredCapacity(floors, tuple(needs))
