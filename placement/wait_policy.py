"""How long one gang may wait for private GPUs: the federation's wait, as its tenant's cost policy
sets it, bounded by the job's own `maxWait` and deadline, and never for an urgent job.

The federation's policy (`PolicyConfig.private_wait_s_per_gpu_hour`, `private_wait_max_s`) is the
`balanced` wait. A tenant's cost policy (`TenantQuota.cost_policy`) changes only those two figures:

- `fast`: no wait; the gang bursts at once when private GPUs are full (both figures 0).
- `balanced`: the federation's figures as configured.
- `saver`: `SAVER_FACTOR` times both figures (twice the seconds per GPU-hour, twice the cap), and the
  room test only for gangs of at most `SAVER_NEEDS_START_MAX_RUN_H` hours of work (or the
  federation's own `private_wait_needs_start_max_run_h`, if that is less): a longer gang, which the
  spot bound keeps on demand, waits for private GPUs even when no running gang's run-time limit
  promises room before its wait ends. In the replay this is what a wait adds beyond spot on the
  busiest week, at a cost in JCT a saver accepts (docs/results/README.md).

The room test itself, reservations, the spot bound and the value of waiting
(`wait_value_usd_per_hour`) are the federation's for every tenant. With the federation's wait off
(0 seconds per GPU-hour) no tenant waits, whatever its policy: the admin's switch wins.

Then the job's bounds, which only ever shorten the wait:

- `maxWait` (`GangRequest.max_wait_s`): never past queue time + maxWait;
- the deadline: never so late that the job, started then on the private offer, would miss it. The
  time left after the wait is the larger of its private run (transfer and work) and its run-time
  limit (`maxRuntime`), since the limit is what the user said the run may take;
- urgent: a job of a priority class that needs an admin's approval never waits. An approved urgent
  job is one someone decided cannot wait; saving money on it is not the placer's call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from placement.model import GangRequest, PolicyConfig
from placement.model_policy import CostPolicy

# How much longer `saver` waits than `balanced`: both the seconds per GPU-hour and the cap.
SAVER_FACTOR: Final = 2.0
# `saver`'s room test applies only to gangs of at most this many hours of work (by their limits).
SAVER_NEEDS_START_MAX_RUN_H: Final = 24.0


@dataclass(frozen=True, slots=True)
class WaitTerms:
    """The compute-weighted wait in force for one tenant: seconds per GPU-hour of work, and the cap;
    and the longest gang (hours of work) the room test applies to (None: every gang)."""

    s_per_gpu_hour: float
    max_s: float
    needs_start_max_run_h: float | None = None

    @property
    def waits(self) -> bool:
        return self.s_per_gpu_hour > 0 and self.max_s > 0


NO_WAIT: Final = WaitTerms(0.0, 0.0)


def terms_for(policy: PolicyConfig, cost_policy: CostPolicy) -> WaitTerms:
    """The wait a tenant's cost policy sets on top of the federation's."""
    if policy.private_wait_s_per_gpu_hour <= 0 or cost_policy is CostPolicy.FAST:
        return NO_WAIT
    own = policy.private_wait_needs_start_max_run_h
    if cost_policy is CostPolicy.SAVER:
        return WaitTerms(
            policy.private_wait_s_per_gpu_hour * SAVER_FACTOR,
            policy.private_wait_max_s * SAVER_FACTOR,
            SAVER_NEEDS_START_MAX_RUN_H if own is None else min(own, SAVER_NEEDS_START_MAX_RUN_H),
        )
    return WaitTerms(policy.private_wait_s_per_gpu_hour, policy.private_wait_max_s, own)


def wait_s(terms: WaitTerms, gang: GangRequest, gpu_hours: float, *, urgent: bool) -> float:
    """Seconds from the gang's queue time it may wait, before the saving and deadline bounds (0: none)."""
    if urgent or not terms.waits or gpu_hours <= 0:
        return 0.0
    length = min(terms.s_per_gpu_hour * gpu_hours, terms.max_s)
    if gang.max_wait_s is not None:
        length = min(length, max(0.0, gang.max_wait_s))
    return length


def latest_start_s(gang: GangRequest, private_finish_delay_s: float, margin_s: float = 0.0) -> float | None:
    """The last moment a wait may end and the job still meet its deadline on the private offer (None:
    no deadline). `private_finish_delay_s`: its private run from start to finish; `margin_s`: what a
    burst takes from the wait's end to a running gang (`PolicyConfig.private_wait_deadline_margin_s`)."""
    if gang.deadline_at_s is None:
        return None
    return gang.deadline_at_s - max(private_finish_delay_s, float(gang.max_runtime_s)) - margin_s
