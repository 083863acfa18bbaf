"""Repatriation: moving running cloud gangs back to private GPUs that would otherwise sit idle.

A gang that burst to the cloud during a peak keeps paying cloud prices until it ends, even after
private GPUs of its type go idle; a multi-day job pays for days. When the policy allows it
(`PolicyConfig.repatriate`), `plan` calls `choose_moves` last in the cycle, after every queued gang
was decided, so a move only takes room that no queued gang in the placer's order took or could take
this cycle. A gang is moved when all of these hold:

- it runs on cloud capacity (not private), has started (not in the cloud's lead time), is not being
  evicted, and can stop at a checkpoint and resume (`RunningGang.movable`);
- its whole gang fits now on free GPUs of a private offer of a type it accepts, without delaying a
  backfill reservation, and, on another GPU type than its own, within its tenant's caps; on any type,
  without eating into the private capacity other tenants hold back (lending limits). A move never
  evicts anyone;
- the cloud cost it would still pay exceeds what the rest of its work costs on the private GPUs plus
  the move's own cost, by at least `repatriate_min_saving_usd`.

What it would still pay comes from the placer's expected-runtime rule, as for any cost here: its
expected work (`expected_runtime_s` at speed 1.0) when known, else its run-time limit, counted from
when it started; the time left at the cloud's price. The move's cost is its overhead
(`move_overhead_s`: checkpoint write, restart, restore), priced at the cloud rate as work the gang
does again; the private run is the work left at the private type's speed plus that overhead.

Candidates go by saving, largest first (ties by job id), and each takes the private offer where its
rest costs least (ties: tightest packing, then the offer's fixed key), so equal snapshots give equal
moves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from placement.backfill import Hold
from placement.cost import CostModel
from placement.fit import HistogramFit, gang_shape
from placement.inventory import Inventory, Offer
from placement.model import CapacityKind, GpuType, Move, PolicyConfig, RunningGang
from placement.quota import QuotaBook

_HOUR_S: Final = 3600.0


@dataclass(frozen=True, slots=True)
class Remaining:
    """What a running gang has left, by the placer's expected-runtime rule."""

    # Wall time left on the type it runs on, and the work left at speed 1.0.
    run_s: float
    work_s: float
    # Its run-time limit left (0: it states none).
    limit_s: float


def remaining(gang: RunningGang, costs: CostModel, policy: PolicyConfig, now: float) -> Remaining | None:
    """The gang's expected time and work left, or None when the placer cannot tell (not started)."""
    if gang.started_at_s is None or gang.started_at_s > now:
        return None
    speed = costs.snapshot_speed(gang.gpu_type)
    limit_s = 0.0 if gang.ends_at_s is None else max(0.0, gang.ends_at_s - now)
    if gang.expected_runtime_s > 0:
        run_s = max(0.0, gang.started_at_s + gang.expected_runtime_s / speed - now)
    elif gang.ends_at_s is not None:
        run_s = limit_s
    else:
        run_s = max(0.0, gang.started_at_s + policy.default_runtime_s / speed - now)
    return Remaining(run_s, run_s * speed, limit_s)


@dataclass(frozen=True, slots=True)
class Estimate:
    """The placer's figures for moving one gang onto one private GPU type."""

    cloud_cost_left_usd: float
    private_run_s: float
    private_cost_usd: float
    move_cost_usd: float

    @property
    def saving_usd(self) -> float:
        return self.cloud_cost_left_usd - self.private_cost_usd - self.move_cost_usd


def estimate(
    gang: RunningGang,
    left: Remaining,
    private_speed: float,
    private_usd_per_gpu_hour: float,
    overhead_s: float,
) -> Estimate:
    """Cloud cost avoided, private cost incurred and the move's own cost, all for the whole gang."""
    gpus = gang.gpu_count
    cloud_left = gpus * left.run_s / _HOUR_S * gang.usd_per_gpu_hour
    private_run_s = left.work_s / private_speed + overhead_s
    private_cost = gpus * private_run_s / _HOUR_S * private_usd_per_gpu_hour
    move_cost = gpus * overhead_s / _HOUR_S * gang.usd_per_gpu_hour
    return Estimate(cloud_left, private_run_s, private_cost, move_cost)


def is_candidate(gang: RunningGang, now: float) -> bool:
    """Whether the gang could be moved at all: a started, movable cloud gang that is not leaving."""
    return (
        gang.movable
        and gang.kind is not None
        and gang.kind is not CapacityKind.PRIVATE
        and not gang.terminating
        and gang.evicted_for is None
        and gang.gpu_count > 0
        and bool(gang.replica_gpus)
        and gang.started_at_s is not None
        and gang.started_at_s <= now
    )


@dataclass(slots=True)
class _Target:
    offer: Offer
    placed: HistogramFit
    figures: Estimate


def choose_moves(
    running: Sequence[RunningGang],
    inventory: Inventory,
    book: QuotaBook,
    costs: CostModel,
    holds_on: Mapping[Offer, Sequence[Hold]],
    now: float,
) -> list[Move]:
    """The moves of this cycle, taking their room from `inventory` (call after the queue is decided)."""
    policy = costs.policy
    if not policy.repatriate:
        return []
    overhead = max(0.0, policy.move_overhead_s)
    ranked: list[tuple[float, str, RunningGang, Remaining]] = []
    for gang in running:
        # A gang of a tenant the federation does not know is placed nowhere, so it moves nowhere.
        if not is_candidate(gang, now) or not book.known(gang.tenant):
            continue
        left = remaining(gang, costs, policy, now)
        if left is None or left.run_s <= overhead:
            continue
        # The best saving it could have (free private GPUs at no price) ranks it; the exact one follows.
        ranked.append((-gang.gpu_count * left.run_s * gang.usd_per_gpu_hour, gang.job_id, gang, left))
    ranked.sort(key=lambda r: (r[0], r[1]))
    moves: list[Move] = []
    for _, _, gang, left in ranked:
        target = _best_target(gang, left, inventory, book, costs, holds_on, overhead, now)
        if target is None:
            continue
        offer, figures = target.offer, target.figures
        shape = gang_shape(gang.replica_gpus)
        max_runtime_s = left.limit_s + overhead if left.limit_s > 0 else 0.0
        inventory.take(offer, target.placed, shape)
        gpu_type = offer.view.gpu_type
        if gpu_type != gang.gpu_type:
            book.add(gang.tenant, gpu_type, gang.gpu_count)
        for hold in holds_on.get(offer, ()):
            hold.commit(shape, int(max_runtime_s), now)
        moves.append(
            Move(
                job_id=gang.job_id,
                tenant=gang.tenant,
                gpu_count=gang.gpu_count,
                from_cluster=gang.cluster,
                from_gpu_type=gang.gpu_type,
                from_usd_per_gpu_hour=gang.usd_per_gpu_hour,
                to_cluster=offer.view.cluster,
                to_gpu_type=gpu_type,
                to_kind=offer.kind,
                to_usd_per_gpu_hour=offer.usd_per_gpu_hour,
                remaining_cloud_s=left.run_s,
                private_run_s=figures.private_run_s,
                overhead_s=overhead,
                cloud_cost_left_usd=figures.cloud_cost_left_usd,
                private_cost_usd=figures.private_cost_usd,
                move_cost_usd=figures.move_cost_usd,
                saving_usd=figures.saving_usd,
                max_runtime_s=max_runtime_s,
                grace_period_s=policy.default_grace_period_s
                if gang.grace_period_s is None
                else gang.grace_period_s,
            )
        )
    return moves


def _best_target(
    gang: RunningGang,
    left: Remaining,
    inventory: Inventory,
    book: QuotaBook,
    costs: CostModel,
    holds_on: Mapping[Offer, Sequence[Hold]],
    overhead_s: float,
    now: float,
) -> _Target | None:
    policy = costs.policy
    shape = gang_shape(gang.replica_gpus)
    types: tuple[GpuType, ...] = tuple(dict.fromkeys(gang.gpu_types or (gang.gpu_type,)))
    limit_s = int(left.limit_s + overhead_s) if left.limit_s > 0 else 0
    best: _Target | None = None
    best_key: tuple[float, tuple[int, int], tuple[str, str, int, float, float]] | None = None
    for gpu_type in types:
        if gpu_type != gang.gpu_type and book.limit_reason(gang.tenant, gpu_type, gang.gpu_count):
            continue
        if book.lending_reason(
            gang.tenant, gpu_type, gang.gpu_count, inventory.free_by_type.get(gpu_type, 0)
        ):
            continue
        for offer in inventory.search_order((gpu_type,), False):
            if not offer.is_private or offer.free.total_free < gang.gpu_count:
                continue
            placed = offer.fit(shape)
            if placed is None:
                continue
            if any(not h.allows(shape, limit_s, now) for h in holds_on.get(offer, ())):
                continue
            figures = estimate(gang, left, costs.snapshot_speed(gpu_type), offer.usd_per_gpu_hour, overhead_s)
            if figures.saving_usd <= max(0.0, policy.repatriate_min_saving_usd):
                continue
            key = (figures.private_cost_usd, placed.packing_key, offer.search_key)
            if best_key is None or key < best_key:
                best, best_key = _Target(offer, placed, figures), key
    return best


__all__ = ["Estimate", "Remaining", "choose_moves", "estimate", "is_candidate", "remaining"]
