"""The policies a replay compares, each expressed as settings of the real placer.

No policy has its own scheduler: every one runs `placement.plan`, and differs only in what the
snapshot holds and in its `PolicyConfig`:

- `private_only`: no public clusters, one queue for everyone (first come, first served, with the
  placer's backfill): what teams get from a shared private cluster without a federation.
- `burst_now`: public clusters, the Starburst wait off (`private_wait_s_per_gpu_hour = 0`): a job
  that finds no free private GPU goes to the cheapest cloud at once.
- `fixed_wait_<W>`: the Starburst wait with a per-GPU-hour rate so large that the cap always binds:
  `min(huge x GPU-hours, private_wait_max_s = W) = W`, so every job waits exactly W after its queue
  time for private GPUs, then goes to the cloud.
- `gpufed`: the compute-weighted wait (`private_wait_s_per_gpu_hour`, `private_wait_max_s`,
  `wait_value_usd_per_hour` from the config), and its spot rule.
- `burst_now_spot`, `fixed_wait_<W>_spot` (with `policies.spot_curve`): the same with gpufed's spot
  rule, the yardstick that says what the wait adds to what spot alone buys.

All but `private_only` use the teams as tenants with their guarantees, so the cloud policies differ
only in when a job gives up on private GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from federation.replay.config import GpufedSettings, ReplayConfig
from placement.model import PolicyConfig
from placement.model_policy import CostPolicy

# A rate per GPU-hour so large that `private_wait_max_s` always binds (any job has some GPU-hours).
_ALWAYS_CAP = 1e15


class PolicyKind(StrEnum):
    PRIVATE_ONLY = "private_only"
    BURST_NOW = "burst_now"
    FIXED_WAIT = "fixed_wait"
    GPUFED = "gpufed"


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str
    kind: PolicyKind
    fixed_wait_s: float = 0.0
    gpufed: GpufedSettings | None = None
    # Burst-now or a fixed wait with gpufed's spot rule (the spot-aware yardstick, `_spot` names).
    with_spot_rule: bool = False

    @property
    def uses_cloud(self) -> bool:
        return self.kind is not PolicyKind.PRIVATE_ONLY

    @property
    def fifo(self) -> bool:
        return self.kind is PolicyKind.PRIVATE_ONLY

    @property
    def sees_deadlines(self) -> bool:
        """Whether the placer is told jobs' deadlines (`jobs.deadlines`): gpufed's own policies. The
        yardsticks are deadline-blind, as Starburst's fixed wait is; every policy's misses are counted."""
        return self.kind is PolicyKind.GPUFED

    def sees_resumable(self, config: ReplayConfig) -> bool:
        """Whether the placer is told which jobs checkpoint (`jobs.resumable`): gpufed's own policies,
        and the spot-aware yardstick with `policies.spot_curve_resumable`. It matters only under a bound
        on spot restarts, which a resumable job is not held to (`placement.cost.GangCost.kept_off`)."""
        return self.kind is PolicyKind.GPUFED or (self.with_spot_rule and config.spot_curve_resumable)

    def allows_spot(self, config: ReplayConfig) -> bool:
        """Whether jobs may use spot: every cloud policy with `public.spot`, gpufed with its `spot`."""
        if not self.uses_cloud:
            return False
        return config.allow_spot or self.with_spot_rule or (self.gpufed is not None and self.gpufed.spot)

    @property
    def cost_policy(self) -> CostPolicy:
        """Every team's cost policy under this policy: gpufed's setting says (`balanced` elsewhere)."""
        return CostPolicy.BALANCED if self.gpufed is None else self.gpufed.cost_policy

    def policy_config(self, config: ReplayConfig) -> PolicyConfig:
        base = PolicyConfig(preemption=config.preemption, default_grace_period_s=config.grace_period_s)
        if self.with_spot_rule:
            base = _spot_rule(base, config.gpufed)
        if self.kind is PolicyKind.FIXED_WAIT:
            return replace(
                base,
                private_wait_s_per_gpu_hour=_ALWAYS_CAP,
                private_wait_max_s=self.fixed_wait_s,
                private_rate_sunk=config.fixed_wait_every_job,
            )
        if self.kind is PolicyKind.GPUFED:
            assert self.gpufed is not None
            return replace(
                _spot_rule(base, self.gpufed),
                private_wait_s_per_gpu_hour=self.gpufed.private_wait_s_per_gpu_hour,
                private_wait_max_s=self.gpufed.private_wait_max_s,
                wait_value_usd_per_hour=self.gpufed.wait_value_usd_per_hour,
                private_wait_needs_start=self.gpufed.private_wait_needs_start,
                private_wait_reserve=self.gpufed.private_wait_reserve,
                private_wait_reservations=self.gpufed.private_wait_reservations,
                private_wait_min_gpus=self.gpufed.private_wait_min_gpus,
                private_wait_needs_start_max_gpus=self.gpufed.private_wait_needs_start_max_gpus,
                private_wait_needs_start_max_run_h=self.gpufed.private_wait_needs_start_max_run_h,
                private_wait_needs_start_after_s=self.gpufed.private_wait_needs_start_after_s,
                repatriate=self.gpufed.repatriate,
                repatriate_min_saving_usd=self.gpufed.repatriate_min_saving_usd,
                move_overhead_s=self.gpufed.move_overhead_s,
                private_rate_sunk=self.gpufed.private_rate_sunk,
                # What the placer is told of this world: bursting takes a cycle and the cloud's lead time.
                private_wait_deadline_margin_s=config.cycle_s + config.lead_time_s,
            )
        return base


def _spot_rule(base: PolicyConfig, settings: GpufedSettings) -> PolicyConfig:
    """gpufed's spot rule (its bound on restarts, idle private GPUs first) on top of `base`."""
    return replace(
        base,
        spot_max_restart_slowdown=settings.spot_max_restart_slowdown,
        prefer_private=settings.prefer_private,
    )


def _wait_name(wait_s: float) -> str:
    if wait_s >= 3600 and wait_s % 3600 == 0:
        return f"{wait_s / 3600:g}h"
    return f"{wait_s / 60:g}m"


def gpufed_name(settings: GpufedSettings) -> str:
    rate = settings.private_wait_s_per_gpu_hour
    name = f"gpufed_{rate:g}s_per_gpuh_max_{_wait_name(settings.private_wait_max_s)}"
    if settings.private_wait_min_gpus > 1:
        name += f"_min_{settings.private_wait_min_gpus}gpus"
    if settings.private_wait_needs_start:
        name += "_needs_start"
        if settings.private_wait_needs_start_max_gpus is not None:
            name += f"_up_to_{settings.private_wait_needs_start_max_gpus}gpus"
        if settings.private_wait_needs_start_max_run_h is not None:
            name += f"_up_to_{settings.private_wait_needs_start_max_run_h:g}h"
        if settings.private_wait_needs_start_after_s is not None:
            name += f"_once_after_{_wait_name(settings.private_wait_needs_start_after_s)}"
    if settings.private_wait_reserve:
        name += "_reserve"
        if settings.private_wait_reservations > 1:
            name += f"_{settings.private_wait_reservations}"
    if settings.repatriate:
        name += f"_repatriate_{settings.move_overhead_s / 60:g}m"
        if settings.repatriate_min_saving_usd > 0:
            name += f"_min_{settings.repatriate_min_saving_usd:g}usd"
    if settings.spot:
        name += "_spot"
        if settings.spot_max_restart_slowdown is not None:
            name += f"_slowdown_{settings.spot_max_restart_slowdown * 100:g}pct"
    if settings.prefer_private:
        name += "_private_first"
    if settings.private_rate_sunk:
        name += "_sunk"
    if settings.cost_policy is not CostPolicy.BALANCED:
        name += f"_{settings.cost_policy.value}"
    return name


def policies(config: ReplayConfig) -> list[PolicySpec]:
    """Every policy of a run, in the order of the report."""
    specs = [
        PolicySpec("private_only", PolicyKind.PRIVATE_ONLY),
        PolicySpec("burst_now", PolicyKind.BURST_NOW),
    ]
    specs += [
        PolicySpec(f"fixed_wait_{_wait_name(w)}", PolicyKind.FIXED_WAIT, fixed_wait_s=w)
        for w in config.fixed_waits_s
    ]
    if config.spot_curve:
        specs.append(PolicySpec("burst_now_spot", PolicyKind.BURST_NOW, with_spot_rule=True))
        specs += [
            PolicySpec(
                f"fixed_wait_{_wait_name(w)}_spot", PolicyKind.FIXED_WAIT, fixed_wait_s=w, with_spot_rule=True
            )
            for w in config.fixed_waits_s
        ]
    specs.append(PolicySpec("gpufed", PolicyKind.GPUFED, gpufed=config.gpufed))
    specs += [PolicySpec(gpufed_name(s), PolicyKind.GPUFED, gpufed=s) for s in config.gpufed_sweep]
    if config.only_policies:
        specs = [s for s in specs if s.name in config.only_policies]
    return specs
