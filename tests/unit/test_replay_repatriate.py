"""The replay carries out moves back to private GPUs: billing stops, progress is kept minus the overhead.

One private V100 node of one GPU at $1/GPU-hour, AWS V100 at $3/GPU-hour with a 10 s lead time, cycles
at every event, exact run times. `a` (100 s) takes the private GPU at 0; `b` (1,000 s) bursts at 0 and
runs in the cloud from 10. When `a` ends at 100, `b` has done 90 s: with a 60 s overhead the rest,
910 s + 60 s, runs on the private GPU from 100 to 1,070, and the cloud bills 90 s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from federation.replay.config import ReplayConfig
from federation.replay.policies import policies
from federation.replay.sim import Result, simulate
from federation.replay.trace import TraceJob
from federation.replay.world import build_world
from tests.unit.replay_builders import a_config, a_job, a_price_table

# `b` checkpoints (`resumable: true`): the leader moves only such jobs, and so does the replay.
JOBS = [a_job("a", 0, 100), replace(a_job("b", 0, 1000), resumable=True)]


def config(**gpufed: Any) -> ReplayConfig:
    settings = {"private_wait_s_per_gpu_hour": 0, "repatriate": True, "move_overhead_s": 60, **gpufed}
    return a_config(policies={"fixed_waits_s": [], "gpufed": settings})


def run(cfg: ReplayConfig, jobs: list[TraceJob] = JOBS) -> Result:
    spec = next(p for p in policies(cfg) if p.name == "gpufed")
    return simulate(cfg, build_world(cfg, a_price_table(), jobs, 1), spec, jobs)


def cloud_cost(result: Result) -> float:
    return sum(i.cost_usd for i in result.intervals)


def test_a_cloud_gang_moves_to_the_freed_private_gpu_with_its_progress() -> None:
    result = run(config())
    outcome = result.outcomes["b"]  # type: ignore[index]
    assert (outcome.start_s, outcome.finish_s, outcome.private) == (100, 1070, True)
    assert cloud_cost(result) == pytest.approx(3.0 * 90 / 3600)
    assert (result.moves, result.placement_mismatches, outcome.attempts, outcome.preemptions) == (1, 0, 2, 0)
    # The placer's estimate: 910 s left at $3 against 970 s at $1 and 60 s at $3.
    assert result.move_saving_usd == pytest.approx((910 * 3.0 - 970 * 1.0 - 60 * 3.0) / 3600)


def test_without_the_knob_the_gang_stays_in_the_cloud() -> None:
    result = run(config(repatriate=False))
    outcome = result.outcomes["b"]  # type: ignore[index]
    assert (outcome.start_s, outcome.finish_s, outcome.private) == (10, 1010, False)
    assert cloud_cost(result) == pytest.approx(3.0 * 1000 / 3600)
    assert result.moves == 0


def test_only_jobs_the_config_calls_movable_move() -> None:
    # b's run-time limit is 1,500 s, under the 1 h the config asks of a movable job.
    cfg = a_config(
        policies={"fixed_waits_s": [], "gpufed": {"private_wait_s_per_gpu_hour": 0, "repatriate": True}},
        jobs={"runtime_limit_factor": 1.5, "expected_runtime": "exact", "movable_min_runtime_h": 1},
    )
    assert run(cfg).moves == 0


def test_a_job_that_does_not_checkpoint_never_moves() -> None:
    # The server marks a running gang movable only if its manifest says `resumable: true`
    # (`federation.scheduling.snapshot`); the replay moved every job until it followed the same rule.
    jobs = [a_job("a", 0, 100), a_job("b", 0, 1000)]
    result = run(config(), jobs)
    outcome = result.outcomes["b"]  # type: ignore[index]
    assert (result.moves, outcome.start_s, outcome.finish_s, outcome.private) == (0, 10, 1010, False)


def test_an_overhead_larger_than_the_saving_keeps_it_in_the_cloud() -> None:
    # 600 s of overhead: 910 s at $3 against 1,510 s at $1 plus 600 s at $3 saves nothing.
    assert run(config(move_overhead_s=600)).moves == 0


def test_the_config_reaches_the_placer() -> None:
    spec = next(p for p in policies(config()) if p.name == "gpufed")
    assert spec.policy_config(config()).repatriate
    assert spec.gpufed is not None
    assert spec.gpufed.move_overhead_s == 60
