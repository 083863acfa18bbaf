"""Early stopping of a sweep's trials (issue 34): the rules a Sweep's `earlyStopping` names, and
the decision for one running trial from the intermediate values every trial printed. Pure.

Two rules, both judged on `gpufed-metric: NAME=VALUE step=N` lines, with a trial's value at a step
being its last report at or before that step (if it got that far):

- median stopping (Vizier's, as Katib and Ray Tune run it): worse than the median of the others at
  its latest step;
- successive halving (ASHA), stopping form: at the highest rung it reached, not among the best
  1/reduction_factor of every trial's values there.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = [
    "STOPPING_TYPES",
    "EarlyStopping",
    "Goal",
    "MedianStopping",
    "SuccessiveHalving",
    "halving_stop",
    "median_stop",
    "stop_reason",
    "stopping_to_dict",
]


class Goal(StrEnum):
    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


@dataclass(frozen=True, slots=True)
class MedianStopping:
    """Median stopping (Vizier's, as Katib and Ray Tune run it): a running trial whose latest
    intermediate value is worse than the median of the other trials' values at that step is
    stopped, once at least `min_trials` others reached the step and from step `min_step` on."""

    min_trials: int = 3
    min_step: int = 1


@dataclass(frozen=True, slots=True)
class SuccessiveHalving:
    """Asynchronous successive halving (ASHA: Li et al., MLSys 2020, as Ray Tune's ASHAScheduler
    and Katib run it), stopping form. Rungs sit at steps `min_step`, `min_step` x `reduction_factor`,
    x `reduction_factor`^2 and so on. A running trial is judged at the highest rung it has reached:
    it runs on only if its value there is among the best 1/`reduction_factor` of the values every
    trial reached at that rung (itself included), once at least `min_trials` others reached it. So
    about a third (with 3) of the trials pass each rung, and the rest stop early."""

    min_trials: int = 3
    min_step: int = 1
    reduction_factor: int = 3

    def rung(self, step: int) -> int | None:
        """The highest rung at or below `step` (None before the first)."""
        if step < self.min_step:
            return None
        rung = self.min_step
        while rung * self.reduction_factor <= step:
            rung *= self.reduction_factor
        return rung


EarlyStopping = MedianStopping | SuccessiveHalving

# The Sweep file's `earlyStopping.type` for each rule.
STOPPING_TYPES = {"median": MedianStopping, "successiveHalving": SuccessiveHalving}


def stopping_to_dict(rule: EarlyStopping) -> dict[str, Any]:
    """The rule as the Sweep file writes it (and etcd keeps it)."""
    if isinstance(rule, SuccessiveHalving):
        return {
            "type": "successiveHalving",
            "minTrials": rule.min_trials,
            "minStep": rule.min_step,
            "reductionFactor": rule.reduction_factor,
        }
    return {"type": "median", "minTrials": rule.min_trials, "minStep": rule.min_step}


def _at_step(values: Mapping[int, float], step: int) -> float | None:
    """A trial's value at `step`: its report at the last step at or before it, if it reached it."""
    if not values or max(values) < step:
        return None
    before = [s for s in values if s <= step]
    return values[max(before)] if before else None


def median_stop(
    trial: Mapping[int, float], others: Sequence[Mapping[int, float]], goal: Goal, rule: MedianStopping
) -> str | None:
    """Why a running trial should stop by the median rule, or None to let it run: its latest value
    is worse than the median of the others' values at the same step."""
    if not trial:
        return None
    step = max(trial)
    if step < rule.min_step:
        return None
    value = trial[step]
    peers = [v for o in others if (v := _at_step(o, step)) is not None]
    if len(peers) < rule.min_trials:
        return None
    median = statistics.median(peers)
    worse = value > median if goal is Goal.MINIMIZE else value < median
    if not worse:
        return None
    return (
        f"early stopping (median rule): {value:.6g} at step {step} is worse than the median "
        f"{median:.6g} of {len(peers)} other trials at that step"
    )


def halving_stop(
    trial: Mapping[int, float], others: Sequence[Mapping[int, float]], goal: Goal, rule: SuccessiveHalving
) -> str | None:
    """Why a running trial should stop by successive halving, or None to let it run: at the highest
    rung it reached, its value is not among the best 1/reduction_factor of all trials' values there."""
    if not trial:
        return None
    rung = rule.rung(max(trial))
    if rung is None:
        return None
    value = _at_step(trial, rung)
    if value is None:
        return None
    peers = [v for o in others if (v := _at_step(o, rung)) is not None]
    if len(peers) < rule.min_trials:
        return None
    everyone = sorted([*peers, value], reverse=goal is Goal.MAXIMIZE)  # best first
    keep = max(1, len(everyone) // rule.reduction_factor)
    cutoff = everyone[keep - 1]
    worse = value > cutoff if goal is Goal.MINIMIZE else value < cutoff
    if not worse:
        return None
    return (
        f"early stopping (successive halving): {value:.6g} at rung step {rung} is not among the best "
        f"{keep} of {len(everyone)} trials at that step (1/{rule.reduction_factor} go on; the cutoff is "
        f"{cutoff:.6g})"
    )


def stop_reason(
    trial: Mapping[int, float], others: Sequence[Mapping[int, float]], goal: Goal, rule: EarlyStopping
) -> str | None:
    """Why a running trial should stop by the sweep's rule, or None."""
    if isinstance(rule, SuccessiveHalving):
        return halving_stop(trial, others, goal, rule)
    return median_stop(trial, others, goal, rule)
