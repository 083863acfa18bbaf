"""The cost model: what a placement is expected to cost, when it would finish, and how long to wait.

Expected cost of running a gang on an offer now:

    price per GPU-hour of useful work (spot: x (1 + restart risk per hour x work lost per restart,
                                       the work since the last checkpoint, `spot_lost_work_h`))
  x GPUs x hours of work at that GPU type's speed
  + egress of the dataset if the cluster reads from another object store (size x rate between stores)
  + the value of the time the job waits for its dataset to move (wait value per hour x transfer hours)

Work is stated on a GPU of speed 1.0: an H100 listed at speed 2.0 runs it in half the hours, and is
priced that way. Finish time is now + transfer time + work / speed; a job with a deadline is placed
only where it finishes in time.

Waiting for private capacity follows Starburst (Luo et al., USENIX ATC'24): a job that would pay
cloud prices waits for private GPUs for a time proportional to its compute (GPU-hours), so big jobs,
which cost most in the cloud, wait longest, and small ones go to the cloud soon. The wait is also
bounded by what it saves (cloud minus private cost, over the value of an hour of waiting), by a
maximum, and by the deadline; the tenant's cost policy and the job's `maxWait` and priority class
set or shorten it (`wait_policy`).

Spot: a policy may bound the slowdown that reclaims cause a gang that restarts from scratch at each
(`spot_max_restart_slowdown`); that keeps long, wide gangs off spot. A resumable gang (it checkpoints,
`spec.resumable`) loses only the work since its last checkpoint at a reclaim, which spot's price
already charges, so the bound does not apply to it (`GangCost.kept_off`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from placement.model import CapacityKind, EgressRate, GangRequest, GpuType, PolicyConfig
from placement.model_policy import CostPolicy
from placement.wait_policy import WaitTerms, latest_start_s, terms_for, wait_s

_GB: Final = 1e9
_HOUR_S: Final = 3600.0


class CostModel:
    """The snapshot's prices, speeds and egress table, and the policy's knobs, for one cycle."""

    def __init__(
        self,
        speeds: Mapping[GpuType, float],
        egress: tuple[EgressRate, ...],
        policy: PolicyConfig,
    ) -> None:
        self._speeds = {t: s for t, s in speeds.items() if s > 0}
        self._egress: dict[tuple[str, str], float] = {}
        # Listed twice: the dearer rate, whatever the order.
        for rate in egress:
            key = (rate.source_store, rate.destination_store)
            self._egress[key] = max(rate.usd_per_gb, self._egress.get(key, rate.usd_per_gb))
        self.policy = policy
        bound = policy.spot_max_restart_slowdown
        # The reclaim exposure (reclaims expected over the run) at which restarts slow it by `bound`.
        self.spot_max_exposure = None if bound is None else restart_exposure_for(bound)
        # How often a decision read a gang's queue time (the private wait counts from it): a decision
        # that did is not reused for another gang (`plan._Cycle.decide`).
        self.queue_time_reads = 0

    def work_s(self, gang: GangRequest) -> float:
        """Seconds of work on a GPU of speed 1.0."""
        if gang.expected_runtime_s > 0:
            return gang.expected_runtime_s
        if gang.max_runtime_s > 0:
            return float(gang.max_runtime_s)
        return self.policy.default_runtime_s

    def snapshot_speed(self, gpu_type: GpuType) -> float:
        return self._speeds.get(gpu_type, 1.0)

    def speed(self, gang: GangRequest, gpu_type: GpuType) -> float:
        for listed, speed in gang.gpu_speeds:
            if listed == gpu_type and speed > 0:
                return speed
        return self._speeds.get(gpu_type, 1.0)

    def moves(self, gang: GangRequest, store: str | None) -> bool:
        return (
            gang.dataset_size_bytes > 0
            and gang.dataset_store is not None
            and store is not None
            and store != gang.dataset_store
            and store not in gang.dataset_cached_in
        )

    def egress_usd(self, gang: GangRequest, store: str | None) -> float:
        if not self.moves(gang, store):
            return 0.0
        assert gang.dataset_store is not None
        assert store is not None
        rate = self._egress.get((gang.dataset_store, store), self.policy.default_egress_usd_per_gb)
        return gang.dataset_size_bytes / _GB * rate

    def transfer_s(self, gang: GangRequest, store: str | None) -> float:
        if not self.moves(gang, store) or self.policy.transfer_bytes_per_s <= 0:
            return 0.0
        return gang.dataset_size_bytes / self.policy.transfer_bytes_per_s

    def run_s(self, gang: GangRequest, gpu_type: GpuType) -> float:
        return self.work_s(gang) / self.speed(gang, gpu_type)

    def expected_cost_usd(
        self, gang: GangRequest, gpu_type: GpuType, price_factor: float, store: str | None
    ) -> float:
        """`price_factor`: USD per GPU-hour of useful work on the offer (spot risk included)."""
        gpu_hours = gang.gpu_count * self.run_s(gang, gpu_type) / _HOUR_S
        waiting = self.policy.wait_value_usd_per_hour * self.transfer_s(gang, store) / _HOUR_S
        return price_factor * gpu_hours + self.egress_usd(gang, store) + waiting

    def finish_at_s(self, gang: GangRequest, gpu_type: GpuType, store: str | None, start_s: float) -> float:
        return start_s + self.transfer_s(gang, store) + self.run_s(gang, gpu_type)

    def private_wait_until_s(
        self,
        gang: GangRequest,
        private_cost_usd: float,
        cloud_cost_usd: float,
        private_finish_delay_s: float,
        *,
        terms: WaitTerms | None = None,
        urgent: bool = False,
    ) -> float:
        """Until when the gang should wait for private GPUs rather than pay `cloud_cost_usd` now.

        `private_finish_delay_s`: time from a private start to the finish (transfer and run).
        `terms`: the wait its tenant's cost policy sets (None: the federation's own, `balanced`);
        `urgent`: its priority class needs approval, and it never waits (`placement.wait_policy`).
        """
        policy = self.policy
        self.queue_time_reads += 1
        saving = cloud_cost_usd - private_cost_usd
        if terms is None:
            terms = terms_for(policy, CostPolicy.BALANCED)
        if saving <= 0 or gang.gpu_count < policy.private_wait_min_gpus:
            return gang.queued_at_s
        length = wait_s(terms, gang, gang.gpu_count * self.work_s(gang) / _HOUR_S, urgent=urgent)
        if length <= 0:
            return gang.queued_at_s
        if policy.wait_value_usd_per_hour > 0:
            length = min(length, saving / policy.wait_value_usd_per_hour * _HOUR_S)
        until = gang.queued_at_s + length
        latest = latest_start_s(gang, private_finish_delay_s, policy.private_wait_deadline_margin_s)
        if latest is not None:
            until = min(until, latest)
        return until


def restart_slowdown(exposure: float) -> float:
    """Expected slowdown of a run that restarts from scratch at each reclaim, for `exposure` reclaims
    expected over its length: the expected time to finish is (e^x - 1) / x times the run's."""
    if exposure < 1e-9:
        return exposure / 2.0
    return math.expm1(exposure) / exposure - 1.0


def restart_exposure_for(slowdown: float) -> float:
    """The exposure at which `restart_slowdown` reaches `slowdown` (it grows with the exposure)."""
    if slowdown <= 0:
        return 0.0
    low, high = 0.0, 1.0
    while restart_slowdown(high) < slowdown and high < 700.0:
        high *= 2.0
    for _ in range(60):
        middle = (low + high) / 2.0
        if restart_slowdown(middle) <= slowdown:
            low = middle
        else:
            high = middle
    return low


class GangCost:
    """One gang's side of the cost model, with the per-type and per-store parts computed once."""

    __slots__ = ("_extra", "_speed", "gang", "gpu_hours", "model", "static_order", "work_s")

    def __init__(self, model: CostModel, gang: GangRequest) -> None:
        self.model = model
        self.gang = gang
        self.work_s = model.work_s(gang)
        # GPU-hours on GPUs of speed 1.0.
        self.gpu_hours = gang.gpu_count * self.work_s / _HOUR_S
        self._speed: dict[GpuType, float] = {}
        self._extra: dict[str | None, float] = {}
        # Whether cost orders offers as the snapshot's price per unit of work does (same for every such
        # gang): no dataset to move, no speeds of its own, and some work to price.
        self.static_order = (
            self.gpu_hours > 0
            and not gang.gpu_speeds
            and (gang.dataset_size_bytes <= 0 or gang.dataset_store is None)
        )

    def speed(self, gpu_type: GpuType) -> float:
        speed = self._speed.get(gpu_type)
        if speed is None:
            speed = self._speed[gpu_type] = self.model.speed(self.gang, gpu_type)
        return speed

    def _moving_cost(self, store: str | None) -> float:
        extra = self._extra.get(store)
        if extra is None:
            model, gang = self.model, self.gang
            waiting = model.policy.wait_value_usd_per_hour * model.transfer_s(gang, store) / _HOUR_S
            extra = self._extra[store] = model.egress_usd(gang, store) + waiting
        return extra

    def cost(self, gpu_type: GpuType, price_factor: float, store: str | None) -> float:
        return price_factor * self.gpu_hours / self.speed(gpu_type) + self._moving_cost(store)

    def spot_exposure(self, gpu_type: GpuType, risk_per_hour: float) -> float:
        """Reclaims expected over the gang's run on spot of this type: one node per replica, each
        reclaimed on its own at `risk_per_hour`."""
        return risk_per_hour * len(self.gang.replica_gpus) * self.work_s / self.speed(gpu_type) / _HOUR_S

    def kept_off(self, kind: CapacityKind, gpu_type: GpuType, risk_per_hour: float) -> bool:
        """Whether the policy's bound keeps the gang off this capacity: spot whose reclaims at this rate,
        each a restart from scratch, would slow its run by more than the bound.

        A resumable gang is never kept off: a reclaim costs it the work since its last checkpoint, not
        its whole run, so its slowdown does not grow with the run's length, and that loss is already in
        spot's price per unit of work (`inventory.price_factor`: risk per hour x `spot_lost_work_h`)."""
        limit = self.model.spot_max_exposure
        return (
            kind is CapacityKind.SPOT
            and limit is not None
            and not self.gang.resumable
            and self.spot_exposure(gpu_type, risk_per_hour) > limit
        )

    def duration_s(self, gpu_type: GpuType, store: str | None) -> float:
        """From start to finish: moving the dataset, then the work at this type's speed."""
        return self.model.transfer_s(self.gang, store) + self.work_s / self.speed(gpu_type)
