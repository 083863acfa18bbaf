"""The event simulator on tiny hand-made traces whose answers are known to the second.

One private V100 node of one GPU at $1/GPU-hour, AWS V100 at $3/GPU-hour with a 10 s lead time,
cycles at every event (cycle_s = 0), the real placer deciding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from federation.replay.config import ReplayConfig
from federation.replay.policies import PolicySpec, policies
from federation.replay.sim import Result, simulate
from federation.replay.trace import TraceJob
from federation.replay.world import build_world
from tests.unit.replay_builders import a_config, a_job, a_price_table


def run(
    policy: str, jobs: Sequence[TraceJob], config: ReplayConfig | None = None, private_gpus: float = 1
) -> Result:
    config = config or a_config()
    spec = next(p for p in policies(config) if p.name == policy)
    return simulate(config, build_world(config, a_price_table(), jobs, private_gpus), spec, jobs)


def times(result: Result, job_id: str) -> tuple[float | None, float | None, bool]:
    outcome = result.outcomes[job_id]  # type: ignore[index]
    return outcome.start_s, outcome.finish_s, outcome.private


def cloud_cost(result: Result) -> float:
    return sum(i.cost_usd for i in result.intervals)


TWO_JOBS = [a_job("a", 0, 100), a_job("b", 0, 100)]


def test_private_only_the_second_waits_exactly_the_firsts_duration() -> None:
    result = run("private_only", TWO_JOBS)
    assert times(result, "a") == (0, 100, True)
    assert times(result, "b") == (100, 200, True)
    assert cloud_cost(result) == 0


def test_burst_now_sends_the_second_to_the_cloud_at_once() -> None:
    result = run("burst_now", TWO_JOBS)
    assert times(result, "a") == (0, 100, True)
    # Admitted at 0, running after the 10 s lead time, billed for its 100 s at $3/GPU-hour.
    assert times(result, "b") == (10, 110, False)
    assert cloud_cost(result) == pytest.approx(3.0 * 100 / 3600)


def test_fixed_wait_bursts_after_exactly_the_wait() -> None:
    jobs = [a_job("a", 0, 300), a_job("b", 0, 100)]
    result = run("fixed_wait_50m", jobs, a_config(policies={"fixed_waits_s": [3000], **_GPUFED}))
    assert times(result, "b") == (100 * 0 + 300, 400, True)
    result = run("fixed_wait_0.833333m", jobs, a_config(policies={"fixed_waits_s": [50], **_GPUFED}))
    assert times(result, "b") == (60, 160, False)


_GPUFED: dict[str, Any] = {"gpufed": {"private_wait_s_per_gpu_hour": 3600, "private_wait_max_s": 400}}


def test_gpufed_waits_in_proportion_to_the_jobs_gpu_hours() -> None:
    # 100 GPU-seconds of work at 3600 s per GPU-hour: a wait of 100 s, then the cloud.
    jobs = [a_job("a", 0, 300), a_job("b", 0, 100)]
    result = run("gpufed", jobs)
    assert times(result, "b") == (110, 210, False)
    # Twice the work waits twice as long: 200 s, and private is free at 300 first only for a longer job.
    result = run("gpufed", [a_job("a", 0, 300), a_job("b", 0, 350)])
    assert times(result, "b") == (300, 650, True)


def test_a_faster_gpu_runs_the_job_in_duration_over_speed() -> None:
    config = a_config(
        public={
            "lead_time_s": 10,
            "clusters": [
                {"name": "gcp", "cloud": "GCP", "region": "us-central1", "accelerators": {"A100": "A100"}}
            ],
        }
    )
    result = run("burst_now", [a_job("x", 0, 400, types=("A100",))], config)
    assert times(result, "x") == (10, 210, False)
    assert cloud_cost(result) == pytest.approx(4.0 * 200 / 3600)
    unplaced = run("private_only", [a_job("x", 0, 400, types=("A100",))], config)
    assert unplaced.outcomes["x"].finish_s is None  # type: ignore[index]


def test_a_borrower_is_preempted_for_a_guarantee_and_restarts_from_scratch() -> None:
    # Two private GPUs, no cloud. t1 and t2 have equal demand, so one GPU guaranteed each; t1 borrows
    # the second GPU until t2 arrives at 10; the victim leaves after its 5 s grace and restarts at 1000.
    config = a_config(public={"clusters": []})
    jobs = [a_job("a1", 0, 1000), a_job("a2", 0, 1000), a_job("b", 10, 2000, tenant="t2")]
    result = run("burst_now", jobs, config, private_gpus=2)
    victims = [o for o in result.outcomes.values() if o.preemptions]
    assert len(victims) == 1
    assert victims[0].attempts == 2
    assert times(result, "b") == (15, 2015, True)
    assert times(result, victims[0].job.job_id) == (1000, 2000, True)
    lost = [i for i in result.intervals if not i.completed]
    assert [(i.start_s, i.end_s) for i in lost] == [(0, 15)]


def test_every_job_is_decided_once_and_capacity_never_oversubscribed() -> None:
    jobs = [a_job(f"j{i}", i * 7 % 50, 30 + i % 40, gpus=1 + i % 3, tenant=f"t{i % 3}") for i in range(60)]
    config = a_config(private={**a_config_private(), "gpus_per_node": 4})
    for spec in ("private_only", "burst_now", "gpufed"):
        result = run(spec, jobs, config, private_gpus=8)
        assert all(o.finish_s is not None for o in result.outcomes.values())
        assert result.placement_mismatches == 0
        events = sorted(
            [(i.start_s, i.gpus) for i in result.intervals if i.private]
            + [(i.end_s, -i.gpus) for i in result.intervals if i.private],
            key=lambda e: (e[0], e[1]),
        )
        held = 0
        for _, change in events:
            held += change
            assert held <= 8


def a_config_private() -> dict[str, Any]:
    return {
        "sizes": [1.0],
        "clusters": [{"name": "onprem", "type_fractions": {"V100": 1.0}, "usd_per_gpu_hour": {"V100": 1.0}}],
    }


def test_policies_map_onto_the_placers_settings() -> None:
    config = a_config()
    by_name: dict[str, PolicySpec] = {p.name: p for p in policies(config)}
    assert by_name["burst_now"].policy_config(config).private_wait_s_per_gpu_hour == 0
    fixed = by_name["fixed_wait_0.833333m"].policy_config(config)
    assert fixed.private_wait_max_s == 50
    assert not by_name["private_only"].uses_cloud
    assert by_name["private_only"].fifo
