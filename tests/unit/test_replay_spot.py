"""The replay's spot: gpufed alone may use it, a reclaim bills the lost run and restarts the job from
scratch, the placer's bound keeps long jobs off it, and idle private GPUs come first when preferred.

One private V100 of $1/GPU-hour; AWS V100 at $3 on demand and $0.90 spot, 10 s lead time, cycles at
every event, exact run times. `hold` takes the private GPU for the whole replay, so later jobs burst at once
(no wait: `private_wait_s_per_gpu_hour: 0`).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from federation.replay.config import ReplayConfig
from federation.replay.errors import ReplayError
from federation.replay.policies import policies
from federation.replay.sim import Result, simulate
from federation.replay.trace import TraceJob
from federation.replay.world import build_world
from tests.unit.replay_builders import a_config, a_job, a_price_table

# 0.5 reclaims per node-hour: a 1 h run expects 0.5 of them, (e^0.5 - 1) / 0.5 - 1 = 29.7 % slower
# from scratch, within a 30 % bound; a 10 h run expects 5.
RISK = 0.5
HOLD = a_job("hold", 0, 10_000_000)
SHORT, LONG = a_job("short", 1, 3600), a_job("long", 1, 36_000)
# 1.5 reclaims expected per run: e^1.5 = 4.5 attempts expected.
MEDIUM = a_job("medium", 1, 3 * 3600)


def config(risk: float = RISK, **gpufed: Any) -> ReplayConfig:
    settings = {"private_wait_s_per_gpu_hour": 0, "spot": True, **gpufed}
    public = {
        "lead_time_s": 10,
        "max_gpus_per_type": 64,
        "spot_restart_risk_per_hour": risk,
        "clusters": [
            {"name": "aws", "cloud": "AWS", "region": "us-east-1", "accelerators": {"V100": "V100"}}
        ],
    }
    return a_config(public=public, policies={"fixed_waits_s": [50], "gpufed": settings})


def run(cfg: ReplayConfig, jobs: list[TraceJob], policy: str = "gpufed") -> Result:
    spec = next(p for p in policies(cfg) if p.name == policy)
    return simulate(cfg, build_world(cfg, a_price_table(), jobs, 1), spec, jobs)


def prices_paid(result: Result, job: str) -> list[float]:
    return [i.usd_per_gpu_hour for i in result.intervals if i.job_id == job and not i.private]


def test_the_bound_sends_the_short_job_to_spot_and_the_long_one_on_demand() -> None:
    result = run(config(spot_max_restart_slowdown=0.3), [HOLD, SHORT, LONG])
    assert set(prices_paid(result, "short")) == {0.9}
    assert prices_paid(result, "long") == [3.0]
    assert result.placement_mismatches == 0


def test_a_reclaimed_run_is_billed_and_the_job_restarts_from_scratch() -> None:
    # No bound: the 3 h job takes spot too, and is reclaimed (1.5 reclaims expected per run).
    result = run(config(), [HOLD, MEDIUM])
    runs = [i for i in result.intervals if i.job_id == "medium"]
    outcome = result.outcomes[MEDIUM.job_id]
    assert result.reclaims >= 1
    assert outcome.attempts == result.reclaims + 1 == len(runs)
    assert all(not i.private and i.usd_per_gpu_hour == 0.9 for i in runs)
    *lost, done = runs
    assert all(not i.completed and i.end_s - i.start_s < 3 * 3600 for i in lost)
    # The last attempt ran the whole job again: nothing of the reclaimed runs was kept.
    assert done.completed
    assert done.end_s - done.start_s == pytest.approx(3 * 3600)
    billed_s = sum(i.end_s - i.start_s for i in runs)
    assert sum(i.cost_usd for i in runs) == pytest.approx(0.9 * billed_s / 3600)
    assert outcome.finish_s == done.end_s
    # Each restart waits for its new capacity: the lead time after every reclaim.
    assert all(
        later.start_s - earlier.end_s == pytest.approx(10) for earlier, later in itertools.pairwise(runs)
    )


def test_the_baselines_never_see_spot_and_are_unchanged_by_gpufeds_setting() -> None:
    jobs = [HOLD, SHORT, LONG]
    with_spot = run(config(spot_max_restart_slowdown=0.3), jobs, "burst_now")
    without = run(config(spot=False), jobs, "burst_now")
    assert prices_paid(with_spot, "short") == prices_paid(with_spot, "long") == [3.0]
    assert with_spot.intervals == without.intervals
    assert run(config(), jobs, "fixed_wait_0.833333m").reclaims == 0


def test_idle_private_gpus_come_before_cheaper_spot_when_preferred() -> None:
    # Spot at $0.90 is under the private rate of $1: by price alone the job goes to spot.
    by_price = run(config(risk=0.0), [SHORT])
    assert prices_paid(by_price, "short") == [0.9]
    preferred = run(config(risk=0.0, prefer_private=True), [SHORT])
    assert prices_paid(preferred, "short") == []
    assert preferred.outcomes[SHORT.job_id].private


def test_the_policy_name_says_what_the_setting_does() -> None:
    cfg = a_config(
        policies={
            "fixed_waits_s": [],
            "gpufed": {"private_wait_s_per_gpu_hour": 0},
            "gpufed_sweep": [
                {
                    "private_wait_s_per_gpu_hour": 275,
                    "spot": True,
                    "spot_max_restart_slowdown": 0.3,
                    "prefer_private": True,
                }
            ],
        }
    )
    names = [p.name for p in policies(cfg)]
    assert "gpufed_275s_per_gpuh_max_4h_spot_slowdown_30pct_private_first" in names


def test_the_spot_aware_curve_runs_the_baselines_with_gpufeds_spot_rule() -> None:
    settings = {
        "private_wait_s_per_gpu_hour": 0,
        "spot": True,
        "spot_max_restart_slowdown": 0.3,
        "prefer_private": True,
    }
    cfg = a_config(policies={"fixed_waits_s": [50], "spot_curve": True, "gpufed": settings})
    specs = {p.name: p for p in policies(cfg)}
    assert {"burst_now_spot", "fixed_wait_0.833333m_spot"} <= set(specs)
    spot_burst = specs["burst_now_spot"]
    assert spot_burst.allows_spot(cfg)
    policy = spot_burst.policy_config(cfg)
    assert (policy.spot_max_restart_slowdown, policy.prefer_private, policy.private_wait_s_per_gpu_hour) == (
        0.3,
        True,
        0,
    )
    assert not specs["burst_now"].allows_spot(cfg)
    # Run: the short job takes spot under burst-now with the rule, the long one on demand.
    spot_cfg = config(spot_max_restart_slowdown=0.3)
    spot_cfg = dataclasses.replace(spot_cfg, spot_curve=True)
    result = run(spot_cfg, [HOLD, SHORT, LONG], "burst_now_spot")
    assert set(prices_paid(result, "short")) == {0.9}
    assert prices_paid(result, "long") == [3.0]


def test_a_spot_curve_without_gpufeds_spot_rule_is_refused_naming_it() -> None:
    with pytest.raises(ReplayError, match=r"policies\.spot_curve"):
        a_config(
            policies={"fixed_waits_s": [], "spot_curve": True, "gpufed": {"private_wait_s_per_gpu_hour": 0}}
        )
