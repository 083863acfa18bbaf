"""Tenants, priority classes and the knobs of the policy: the rules a cycle is judged against.

Everything here is configuration or accounting that federation reads from its store and the usage
ledger and hands to the placer as plain values. Each field has a default that means "this rule is
off", so a snapshot built before a rule existed is still read the way it was meant.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from placement.model_ids import GpuType, TenantId
from placement.model_values import keep_as_values


class CostPolicy(StrEnum):
    """How a tenant trades time for money when its gangs would pay cloud prices
    (`placement.wait_policy` says what each sets): `balanced` waits as the federation's policy says,
    `fast` never waits for private GPUs (it bursts at once), `saver` waits longer."""

    SAVER = "saver"
    BALANCED = "balanced"
    FAST = "fast"


@dataclass(frozen=True, slots=True)
class GpuQuota:
    """A tenant's share of one GPU type, in GPUs held at once across the federation.

    - `guaranteed_gpus`: always obtainable; capacity lent to others is reclaimed (by preemption) to honour it.
    - `borrowing_limit_gpus`: how far above the guarantee the tenant may go with others' idle capacity
      (None: no limit other than the cap).
    - `lending_limit_gpus`: how much of its *unused* guarantee others may borrow (None: all of it). The
      rest is held back, so the tenant gets it without waiting for a preemption.
    - `cap_gpus`: a hard ceiling, whatever is idle (None: none).
    """

    gpu_type: GpuType
    guaranteed_gpus: int = 0
    borrowing_limit_gpus: int | None = None
    lending_limit_gpus: int | None = None
    cap_gpus: int | None = None


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """One node of the tenant tree (an organisation or a team) and its limits.

    Usage of a node is the sum of its own jobs and its descendants'; caps and borrowing limits are
    checked on every node from the job's tenant up to the root. Guarantees, lending and fair share are
    accounted on the tenant that owns the job.
    """

    tenant: TenantId
    # Hard cap on GPUs held at once, per GPU type; a type not listed is uncapped. Kept for configs that
    # predate `quotas`; where both give a cap the lower wins.
    gpu_caps: tuple[tuple[GpuType, int], ...] = ()
    parent: TenantId | None = None
    quotas: tuple[GpuQuota, ...] = ()
    # Weighted fairness among tenants of equal priority: twice the weight, twice the share before yielding.
    weight: float = 1.0
    # GPU-hours the tenant may spend this month (None: no budget) and spent so far, from the ledger. A spent
    # budget stops new admissions of the tenant and of every tenant below it; running work continues.
    monthly_budget_gpu_hours: float | None = None
    spent_gpu_hours: float = 0.0
    # Recent usage from the ledger, GPU-hours per type, already decayed by federation (e.g. half-life of a
    # day). Counted by fair share only when `PolicyConfig.fair_share_history` is on.
    usage_history_gpu_hours: tuple[tuple[GpuType, float], ...] = ()
    # Highest priority value the tenant's jobs may use (None: any).
    max_priority: int | None = None
    # How long the tenant's gangs wait for private GPUs before paying cloud prices.
    cost_policy: CostPolicy = CostPolicy.BALANCED

    def cap_for(self, gpu_type: GpuType) -> int | None:
        caps = [cap for listed, cap in self.gpu_caps if listed == gpu_type]
        caps += [q.cap_gpus for q in self.quotas if q.gpu_type == gpu_type and q.cap_gpus is not None]
        return min(caps) if caps else None

    def quota_for(self, gpu_type: GpuType) -> GpuQuota | None:
        for quota in self.quotas:
            if quota.gpu_type == gpu_type:
                return quota
        return None


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A named priority. A job's `priority` carries the class's value; the class says how it may be used."""

    name: str
    value: int
    # Whether running gangs of this class may be evicted at all.
    preemptible: bool = True
    # Jobs of this class are admitted only with an admin's approval that has not expired at `now`.
    needs_approval: bool = False


@dataclass(frozen=True, slots=True)
class EgressRate:
    """What it costs to move a byte of dataset from one object store to another."""

    source_store: str
    destination_store: str
    usd_per_gb: float


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """The tunable parts of the policy. Defaults keep each optional rule off or neutral."""

    # Preemption: whether the placer may evict at all, how many GPUs it may evict per interval (None:
    # unlimited) and how many the current interval has evicted already (federation keeps the interval).
    preemption: bool = True
    preemption_limit_gpus: int | None = None
    preempted_gpus_this_interval: int = 0
    # Grace period given to a victim whose gang does not state one.
    default_grace_period_s: float = 30.0
    # What an hour of a job's waiting is worth: prices staging delays, and bounds waiting for private GPUs.
    wait_value_usd_per_hour: float = 0.0
    # Starburst-style waiting for private capacity: a gang that would have to pay cloud prices waits for
    # private GPUs at most this many seconds per GPU-hour of its work (compute-weighted), and at most
    # `private_wait_max_s`. 0 turns waiting off: a gang goes to the cloud as soon as private does not fit.
    private_wait_s_per_gpu_hour: float = 0.0
    private_wait_max_s: float = 4 * 3600.0
    # Wait only if running gangs' run-time limits free private room for the gang before its wait ends:
    # otherwise, by the limits' own account, the wait buys nothing, and the gang bursts at once.
    private_wait_needs_start: bool = False
    # The first gang of a cycle that waits for private GPUs gets a backfill reservation of that room, so
    # that smaller gangs arriving later cannot take the GPUs it waits for (needs `backfill`).
    private_wait_reserve: bool = False
    # With `private_wait_reserve`, how many waiting gangs of a cycle get a reservation: the first ones in
    # queue order whose room the limits promise before their wait ends. A later reservation on an offer
    # starts at or after the one before, on what that one leaves, so none overlap; a gang whose room
    # comes only after its wait ends behind them bursts at once (with `private_wait_needs_start`). 1:
    # the first waiting gang only, and only if no gang of the cycle holds a reservation yet.
    private_wait_reservations: int = 1
    # The job's size in the wait: a gang of fewer GPUs than `private_wait_min_gpus` never waits (it
    # bursts at once); `private_wait_needs_start` applies only to gangs of at most
    # `private_wait_needs_start_max_gpus` GPUs (None: every gang), so that larger gangs, whose whole
    # nodes the limits seldom promise, may still wait for them.
    private_wait_min_gpus: int = 1
    private_wait_needs_start_max_gpus: int | None = None
    # The job's length in the wait: `private_wait_needs_start` applies only to gangs whose work (at
    # speed 1.0, as the cost model counts it) is at most this many hours (None: every gang), so that
    # long gangs, the ones a spot bound keeps on demand, may wait for private GPUs the limits do not yet
    # promise: their wait is short against their run (`placement/room.py`).
    private_wait_needs_start_max_run_h: float | None = None
    # Once a dear gang (one whose wait does not rest on the sunk internal rate alone) has waited this
    # long on the room test's word, the test no longer judges it: it waits on to its wait's end, even
    # if gangs started since push the limits' room past that end (None: the test judges every cycle).
    # A wait the test cut short paid the hours already waited and the cloud's bill both.
    private_wait_needs_start_after_s: float | None = None
    # A wait bounded by the job's deadline ends this long before the last moment its run-time limit
    # would still fit: what bursting takes from the wait's end to a running gang (the next cycle, the
    # cloud nodes' start). Without it a wait that ends on the last second is followed by a burst that
    # is seconds late, and the deadline is lost to the wait.
    private_wait_deadline_margin_s: float = 0.0
    # Repatriation: after every queued gang is decided, move a running cloud gang that can stop at a
    # checkpoint (`RunningGang.movable`) to private GPUs left idle, if the cloud cost it would still pay
    # exceeds the cost of the rest on private GPUs plus the move's own cost (its overhead priced at the
    # cloud rate) by at least `repatriate_min_saving_usd`. `move_overhead_s`: checkpoint write, restart
    # and restore, counted as lost progress (the job runs that much longer after the move).
    repatriate: bool = False
    repatriate_min_saving_usd: float = 0.0
    move_overhead_s: float = 900.0
    # Fair share: count the tenants' decayed usage history besides what they hold now.
    fair_share_history: bool = False
    # History GPU-hours are spread over this horizon to be comparable with GPUs held now.
    history_horizon_h: float = 24.0
    # Backfill: reserve a start for the first gang blocked by running work, and let later gangs start ahead
    # of it only if they do not delay that start.
    backfill: bool = True
    # Work of a gang that states no run time, on a GPU of speed 1.0: used only to compare costs.
    default_runtime_s: float = 3600.0
    # Work lost, in hours, each time a spot node is reclaimed (since the last checkpoint).
    spot_lost_work_h: float = 0.5
    # Which gangs may take spot capacity at all: those whose run would be slowed by at most this
    # fraction, in expectation, by reclaims that restart it from scratch (what a job that does not
    # checkpoint suffers: x = reclaims per node-hour x nodes x hours of run, expected run time
    # (e^x - 1) / x of the run's). None: every gang that allows spot (its price pays for the loss).
    spot_max_restart_slowdown: float | None = None
    # Idle private GPUs a gang accepts are taken before any cloud offer, whatever the internal rate:
    # that rate is paid whether the GPUs run or not, a cloud price only while they do. Off: offers are
    # ranked by price alone, so spot priced under the internal rate is taken before idle private GPUs.
    prefer_private: bool = False
    # What a wait for private GPUs saves: with `private_rate_sunk`, the cloud's whole bill (less the
    # private offer's own egress and transfer wait), as the internal rate is paid whether the GPUs run
    # or not; so a gang waits for private GPUs even when its cloud offer (spot) is priced under that
    # rate. Off: the cloud's bill less the private run at the internal rate, and a gang whose cloud
    # offer is cheaper than that never waits.
    private_rate_sunk: bool = False
    # Egress rate between two different stores missing from the snapshot's table.
    default_egress_usd_per_gb: float = 0.09
    # How fast a dataset moves between stores: a moved dataset delays the start by size / rate.
    transfer_bytes_per_s: float = 1e9


keep_as_values(GpuQuota, TenantQuota, PriorityClass, EgressRate, PolicyConfig)
