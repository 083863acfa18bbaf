"""Wait reasons: their order, and the wording of each, so that a user can act on what they read.

A waiting job gets every reason that blocks it, most fundamental first (what the user must change
first comes first), then in the order of the job's GPU types, then by cluster name. Each reason
carries the figures behind it as fields (which tenant, which limit, what is held, the largest free
block), so that `explain` can show them without parsing the message.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Final

from placement.model_ids import ClusterName, GpuType, TenantId
from placement.model_plan import Admission, Alternative, Move, WaitReason
from placement.model_plan import WaitCode as Code

CODE_RANK: Final = {
    code: rank
    for rank, code in enumerate(
        (
            Code.UNKNOWN_TENANT,
            Code.PRIORITY_NOT_ALLOWED,
            Code.APPROVAL_REQUIRED,
            Code.APPROVAL_EXPIRED,
            Code.BUDGET_SPENT,
            Code.NO_CLUSTER_HAS_GPU_TYPE,
            Code.PLACEMENT_RULES,
            Code.SPOT_NOT_ALLOWED,
            Code.CLUSTER_UNREACHABLE,
            Code.TENANT_CAP_REACHED,
            Code.BORROWING_LIMIT,
            Code.QUOTA_EXHAUSTED,
            Code.GANG_LARGER_THAN_CLUSTER,
            Code.INSUFFICIENT_CAPACITY,
            Code.DEADLINE_UNMEETABLE,
            Code.BACKFILL_WOULD_DELAY,
            Code.WAITING_FOR_PRIVATE_CAPACITY,
            Code.PREEMPTION_LIMIT_REACHED,
            Code.PREEMPTING,
            Code.CAPACITY_REFUSED,
            Code.CAPACITY_FAILED,
            Code.CAPACITY_REQUESTED,
            Code.RESERVED,
        )
    )
}
assert len(CODE_RANK) == len(Code), "every wait code needs a rank"


def ranked(reasons: Iterable[WaitReason]) -> tuple[WaitReason, ...]:
    """Reasons by code rank; a stable sort, so reasons of one code keep the order they were listed in."""
    return tuple(sorted(reasons, key=lambda r: CODE_RANK[r.code]))


def describe(shape: tuple[int, ...]) -> str:
    """'4 x 8 GPUs', or '1 x 8 + 2 x 4 GPUs' for mixed replicas."""
    if not shape:
        return "0 GPUs"
    counts = sorted(Counter(shape).items(), reverse=True)
    return " + ".join(f"{n} x {gpus}" for gpus, n in counts) + " GPUs"


def cap_reached(tenant: TenantId, gpu_type: GpuType, cap: int, held: int, need: int) -> WaitReason:
    message = f"tenant {tenant} may hold {cap} GPUs of {gpu_type}, holds {held}, job needs {need}"
    return WaitReason(
        Code.TENANT_CAP_REACHED,
        message,
        gpu_type=gpu_type,
        tenant=tenant,
        limit_gpus=cap,
        held_gpus=held,
        needed_gpus=need,
    )


def borrowing_limit(
    tenant: TenantId, gpu_type: GpuType, guaranteed: int, limit: int, held: int, need: int
) -> WaitReason:
    message = (
        f"tenant {tenant} may borrow {limit} GPUs of {gpu_type} beyond its {guaranteed} guaranteed, "
        f"holds {held}, job needs {need}"
    )
    return WaitReason(
        Code.BORROWING_LIMIT,
        message,
        gpu_type=gpu_type,
        tenant=tenant,
        limit_gpus=guaranteed + limit,
        held_gpus=held,
        needed_gpus=need,
    )


def quota_exhausted(
    tenant: TenantId, gpu_type: GpuType, guaranteed: int, held: int, need: int, free: int, reserved: int
) -> WaitReason:
    message = (
        f"tenant {tenant} holds {held} GPUs of {gpu_type} of {guaranteed} guaranteed and needs {need}; "
        f"beyond its guarantee it may borrow only idle GPUs that other tenants lend: {free} free, "
        f"{reserved} held back for other tenants' guarantees"
    )
    return WaitReason(
        Code.QUOTA_EXHAUSTED,
        message,
        gpu_type=gpu_type,
        tenant=tenant,
        limit_gpus=guaranteed,
        held_gpus=held,
        needed_gpus=need,
        free_gpus=free,
    )


def budget_spent(tenant: TenantId, budget_gpu_hours: float, spent_gpu_hours: float) -> WaitReason:
    message = (
        f"tenant {tenant} has spent {spent_gpu_hours:g} of its {budget_gpu_hours:g} GPU-hour budget this "
        "month; new jobs wait until the budget is raised or the month turns"
    )
    return WaitReason(Code.BUDGET_SPENT, message, tenant=tenant)


def capacity(
    code: Code, message: str, cluster: ClusterName, gpu_type: GpuType, free: int, largest: int, need: int
) -> WaitReason:
    return WaitReason(
        code,
        message,
        cluster,
        gpu_type,
        needed_gpus=need,
        free_gpus=free,
        largest_free_node_gpus=largest,
    )


def moved(move: Move, at_s: float) -> str:
    """Why and when a running gang was moved from the cloud to private GPUs, and what it saved."""
    return f"moved to private at {at_s:g}: {move_reason(move)}"


def move_reason(move: Move) -> str:
    """Why a running gang is moved from the cloud to private GPUs, and what the placer expects it to save."""
    return (
        f"from cluster {move.from_cluster} ({move.from_gpu_type}, "
        f"{move.from_usd_per_gpu_hour:g} USD/GPU-h) to cluster {move.to_cluster} ({move.to_gpu_type}, "
        f"{move.to_usd_per_gpu_hour:g} USD/GPU-h), where {move.gpu_count} GPUs were idle and no queued "
        f"job could use them; about {move.remaining_cloud_s / 3600:.1f} h left in the cloud would cost "
        f"{move.cloud_cost_left_usd:.2f} USD, the rest on private GPUs {move.private_cost_usd:.2f} USD "
        f"({move.private_run_s / 3600:.1f} h with the move's {move.overhead_s:g} s of checkpoint and "
        f"restart) and the move {move.move_cost_usd:.2f} USD: it saves {move.saving_usd:.2f} USD"
    )


def admitted(admission: Admission) -> str:
    """Why an admitted gang runs where it does: its price and type, its data, and what it beat."""
    where = (
        f"cluster {admission.cluster} ({admission.gpu_type}, {admission.kind.value}, "
        f"${admission.usd_per_gpu_hour:.2f}/GPU-hour)"
    )
    choice = admission.choice
    if choice is None:
        return f"placed on {where}"
    parts = [
        f"placed on {where}: expected ${admission.expected_cost_usd:,.2f} for about "
        f"{choice.run_hours:.2f} h of work at {admission.gpu_type} speed {choice.speed:g}, "
        "the cheapest placement with room now"
    ]
    if choice.spot_lost_work_h is not None:
        parts.append(f"spot: resumable, a reclaim costs about {choice.spot_lost_work_h:g} h of work")
    if choice.dataset_store is not None:
        name = f"dataset {choice.dataset}" if choice.dataset else "the job's dataset"
        if choice.transfer_s > 0 or choice.egress_usd > 0:
            parts.append(
                f"{name} moves from store {choice.dataset_store} to {choice.cluster_store} "
                f"(${choice.egress_usd:,.2f} egress, {choice.transfer_s:.0f} s)"
            )
        elif choice.cluster_store is not None:
            parts.append(f"{name} is read in place from store {choice.cluster_store}")
    if choice.runner_up is not None:
        parts.append(f"it beat {_alternative(choice.runner_up)}")
    else:
        parts.append("no other placement had room")
    if choice.cheaper_full is not None:
        parts.append(f"{_alternative(choice.cheaper_full)} would have been cheaper but had no room")
    return "; ".join(parts)


def _alternative(other: Alternative) -> str:
    return (
        f"cluster {other.cluster} ({other.gpu_type}, {other.kind.value}, "
        f"${other.usd_per_gpu_hour:.2f}/GPU-hour, expected ${other.expected_cost_usd:,.2f})"
    )
