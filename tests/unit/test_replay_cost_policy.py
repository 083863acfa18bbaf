"""A replay's gpufed setting may put every team under one cost policy (`cost_policy`), as a tenant's
admin would: `saver` waits twice as long (and tests room only for jobs of at most 24 h of work)."""

from __future__ import annotations

import dataclasses

import pytest

from federation.replay.errors import ReplayError
from federation.replay.policies import gpufed_name, policies
from federation.replay.sim import simulate
from federation.replay.world import build_world
from placement.model_policy import CostPolicy
from tests.unit.replay_builders import a_config, a_job, a_price_table

JOBS = [a_job("a", 0, 300), a_job("b", 0, 100)]


def b_in_the_cloud_from(cost_policy: str) -> float | None:
    """When job b starts: the private GPU is a's until 300, b's 100 GPU-seconds wait 100 s at 3600 s per
    GPU-hour (saver 200 s), then burst with the cloud's 10 s lead time."""
    gpufed = {"private_wait_s_per_gpu_hour": 3600, "private_wait_max_s": 400, "cost_policy": cost_policy}
    config = a_config(policies={"fixed_waits_s": [50], "gpufed": gpufed})
    spec = next(p for p in policies(config) if p.name == "gpufed")
    result = simulate(config, build_world(config, a_price_table(), JOBS, 1), spec, JOBS)
    outcome = result.outcomes[JOBS[1].job_id]
    assert not outcome.private
    return outcome.start_s


def test_every_team_waits_as_the_setting_s_cost_policy_says() -> None:
    assert b_in_the_cloud_from("balanced") == 110
    assert b_in_the_cloud_from("saver") == 210
    assert b_in_the_cloud_from("fast") == 10


def test_a_cost_policy_names_its_sweep_row() -> None:
    config = a_config()
    saver = dataclasses.replace(config.gpufed, cost_policy=CostPolicy.SAVER)
    assert gpufed_name(saver) == gpufed_name(config.gpufed) + "_saver"


def test_an_unknown_cost_policy_is_refused_naming_it() -> None:
    gpufed = {"private_wait_s_per_gpu_hour": 3600, "cost_policy": "cheap"}
    with pytest.raises(ReplayError, match=r"policies.gpufed.cost_policy: 'cheap' is not one of"):
        a_config(policies={"fixed_waits_s": [50], "gpufed": gpufed})
