"""Pure bookkeeping for the capacity reconciler: what it reads off inventories and writes for people.

Kept apart from `federation.capacity.reconciler` (which does I/O) so each rule is a function of its arguments:
a pool's busy and idle nodes from the cluster's inventory, the idle clocks, provisioned intervals
opened and closed as pools grow and shrink, the backoff of a failed operation, the wait reasons a
job gets when its capacity is refused or failing, plan records as `iac.plans` values (oldest first),
and what each plan's nodes delivered.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from federation.capacity.admit import PlanHeld
from federation.capacity.pools import ScalablePoolEntry
from federation.capacity.records import PendingOp, PlanHeldRecord, PlanKind, PlanRecord, interval_key
from federation.ledger.report.idle import ProvisionedInterval
from federation.store.jobs import JobRecord
from iac.decide import Refusal
from iac.plans import CapacityPlan, DeadlineJob, DeadlinePlan, FixedPlan
from placement.model import ClusterState, JobId, JobPhase, Waiting, WaitReason
from placement.model_plan import WaitCode

# A deadline plan's job without a run-time limit is assumed to need this long.
DEFAULT_RUNTIME_S = 3600.0
TERMINAL = frozenset({JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED})


def pool_usage(state: ClusterState | None, pool: str) -> tuple[int, int, int]:
    """(schedulable nodes, nodes running something, idle nodes) of one pool, from the inventory."""
    if state is None or not state.reachable:
        return 0, 0, 0
    for p in state.pools:
        if p.name == pool:
            idle = sum(1 for free in p.free_gpus_per_node if free >= p.gpus_per_node)
            total = len(p.free_gpus_per_node)
            return total, total - idle, idle
    return 0, 0, 0


# Placed on a cluster but not yet (or not surely) on its nodes: the inventory may not show them busy.
ON_THEIR_WAY = frozenset({JobPhase.ADMITTED, JobPhase.STAGING, JobPhase.DISPATCHED})


def reserved_nodes(entry: ScalablePoolEntry, jobs: Iterable[JobRecord]) -> int:
    """Nodes of the pool that gangs placed there and not yet running will need. Counted as busy, so
    a pool never shrinks under a gang the scheduler just admitted to it (a dispatched gang whose
    pods are bound is counted twice: that only delays a scale-down)."""
    gpus = sum(
        j.spec.gpu_count
        for j in jobs
        if j.phase in ON_THEIR_WAY
        and j.placement is not None
        and (j.placement.cluster, j.placement.gpu_type, j.placement.kind)
        == (entry.cluster, entry.config.gpu_type, entry.config.kind)
    )
    return -(-gpus // entry.config.gpus_per_node)


def update_idle(idle_since_s: tuple[float, ...], idle_now: int, now_s: float) -> tuple[float, ...]:
    """Idle clocks for `idle_now` idle nodes. Which node picked up work is not known, so the oldest
    clock goes: that can only delay a scale-down, never bring one forward."""
    if idle_now > len(idle_since_s):
        return idle_since_s + (now_s,) * (idle_now - len(idle_since_s))
    return idle_since_s[len(idle_since_s) - idle_now :]


def backoff_s(attempts: int, base_s: float, max_s: float) -> float:
    return float(min(max_s, base_s * 2 ** max(0, attempts - 1)))


def grown(entry: ScalablePoolEntry, nodes: int, now_s: float) -> dict[bytes, ProvisionedInterval]:
    """The interval for `nodes` nodes gpufed just added to the pool."""
    if nodes <= 0:
        return {}
    pool = entry.config
    iv = ProvisionedInterval(
        cluster=entry.cluster,
        pool=pool.name,
        gpu_type=pool.gpu_type,
        gpu_count=nodes * pool.gpus_per_node,
        usd_per_gpu_hour=pool.usd_per_gpu_hour,
        start_s=now_s,
        end_s=None,
        kind=pool.kind,
    )
    return {interval_key(iv, secrets.token_hex(3)): iv}


def shrunk(
    open_intervals: Mapping[bytes, ProvisionedInterval], gpus: int, now_s: float
) -> dict[bytes, ProvisionedInterval]:
    """Close `gpus` GPUs of a pool's open intervals, newest first (last in, first out); an interval
    closed in part is ended and its remainder reopened from the same start."""
    changes: dict[bytes, ProvisionedInterval] = {}
    for key, iv in sorted(open_intervals.items(), key=lambda kv: kv[1].start_s, reverse=True):
        if gpus <= 0:
            break
        take = min(gpus, iv.gpu_count)
        changes[key] = replace(iv, gpu_count=take, end_s=now_s)
        if take < iv.gpu_count:
            rest = replace(iv, gpu_count=iv.gpu_count - take)
            changes[interval_key(rest, secrets.token_hex(3))] = rest
        gpus -= take
    return changes


def plan_values(
    plans: Iterable[PlanRecord], job: Callable[[JobId], JobRecord | None], now_s: float
) -> list[CapacityPlan]:
    """The live plans as `iac.plans` values, in the order they were made (the first made is the first
    held), cancelled ones left out (they hold nothing)."""
    out: list[CapacityPlan] = []
    for p in sorted(plans, key=lambda p: (p.created_at_s, p.plan_id)):
        if p.cancelled_at_s is not None:
            continue
        if p.kind is PlanKind.FIXED:
            out.append(
                FixedPlan(p.plan_id, p.cluster, p.gpu_type, p.gpus, p.start_s, p.end_s, p.pool, p.reason)
            )
            continue
        jobs = []
        for job_id in p.job_ids:
            record = job(job_id)
            if record is None or record.phase in TERMINAL:
                continue
            runtime = float(record.spec.max_runtime_s) or DEFAULT_RUNTIME_S
            jobs.append(DeadlineJob(job_id, record.spec.gpu_count, runtime))
        out.append(DeadlinePlan(p.plan_id, p.cluster, p.gpu_type, tuple(jobs), p.end_s, p.pool, p.reason))
    return out


def advance_held(
    previous: PlanHeldRecord | None, plan: PlanRecord, held: PlanHeld | None, now_s: float
) -> PlanHeldRecord | None:
    """The plan's delivery record once it holds `held` from now, or None when nothing changed (so
    the leader writes only when what a plan holds changes). From its end or cancellation on it holds
    nothing, and the totals stop there."""
    at = min(now_s, plan.stop_s)
    gpus, usd = (held.gpus, held.usd_per_hour) if held is not None and now_s < plan.stop_s else (0, 0.0)
    if previous is None:
        return PlanHeldRecord(plan.plan_id, at, gpus, usd) if gpus else None
    if previous.gpus == gpus and math.isclose(previous.usd_per_hour, usd):
        return None
    gpu_s, dollars = previous.delivered(at)
    return PlanHeldRecord(plan.plan_id, at, gpus, usd, gpu_s, dollars)


def wait_notes(refused: Sequence[Refusal], ops: Iterable[PendingOp], now_s: float) -> dict[JobId, WaitReason]:
    """Why a job still waits, as far as capacity goes: its request refused, or its pool change failing."""
    notes: dict[JobId, WaitReason] = {}
    for r in refused:
        request = r.request
        reason = WaitReason(
            WaitCode.CAPACITY_REFUSED,
            f"growing {request.cluster}/{request.pool} by {request.nodes} node(s) was refused "
            f"({r.code.value}): {r.reason}",
            cluster=request.cluster,
            gpu_type=request.gpu_type,
        )
        for job_id in request.job_ids:
            notes[job_id] = reason
    for op in ops:
        if op.last_error and not op.applied:
            when = max(0.0, op.next_try_at_s - now_s)
            retry = f"retrying in {when:.0f}s" if op.retryable else "a person must fix this; retried rarely"
            reason = WaitReason(
                WaitCode.CAPACITY_FAILED,
                f"growing {op.cluster}/{op.pool} to {op.nodes_to} node(s) failed "
                f"({op.attempts} attempt(s)): {op.last_error[:200]}; {retry}",
                cluster=op.cluster,
                at_s=op.next_try_at_s,
            )
        elif op.applied and op.nodes_to > op.nodes_from:
            reason = WaitReason(
                WaitCode.CAPACITY_REQUESTED,
                f"{op.nodes_to - op.nodes_from} node(s) of {op.cluster}/{op.pool} are being provisioned",
                cluster=op.cluster,
                at_s=op.ready_at_s,
            )
        else:
            continue
        for job_id in op.job_ids:
            notes[job_id] = reason
    return notes


def annotate(waiting: Sequence[Waiting], notes: Mapping[JobId, WaitReason]) -> Sequence[Waiting]:
    """The placer's reasons, with the capacity reconciler's word replacing its capacity request.

    With no word to add (the usual case) the placer's own sequence, not a copy: a copy of a million
    waits held the event loop for several milliseconds every cycle (issue 33)."""
    if not notes:
        return waiting
    out: list[Waiting] = []
    for w in waiting:
        note = notes.get(w.job_id)
        if note is None:
            out.append(w)
            continue
        kept = tuple(r for r in w.reasons if r.code is not WaitCode.CAPACITY_REQUESTED)
        out.append(Waiting(w.job_id, (*kept, note)))
    return out
