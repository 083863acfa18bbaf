"""The replay's resumable jobs: a seeded share of the trace checkpoints, a spot reclaim costs such a job
the work since its last checkpoint rather than its whole run, and gpufed's placer, told which jobs
resume, lets them on spot past its bound on restarts from scratch.

One private V100 of $1/GPU-hour held for the whole replay by `hold` (idle private GPUs first); AWS V100 at $3 on demand and
$0.90 spot, 10 s lead time, cycles at every event, exact run times, no wait for private GPUs.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from federation.replay.config import ReplayConfig, ResumableSettings
from federation.replay.errors import ReplayError
from federation.replay.metrics import summarise
from federation.replay.policies import policies
from federation.replay.report import read_csv, write_csv
from federation.replay.sim import Result, Simulator, simulate
from federation.replay.trace import TraceJob, assign_resumable, sample
from federation.replay.world import build_world
from placement.model import JobId
from tests.unit.replay_builders import a_config, a_job, a_price_table

HOUR = 3600.0
HOLD = a_job("hold", 0, 10_000_000)
# 10 h on one node at 0.5 reclaims per node-hour: 5 reclaims expected over a run, far past a 30 % bound
# for a job that restarts from scratch ((e^5 - 1) / 5 - 1 = 2,900 % slower).
LONG = a_job("long", 1, 10 * HOUR)


def config(risk: float = 0.5, spot_curve_resumable: bool | None = False, **gpufed: Any) -> ReplayConfig:
    """None: the config does not say `spot_curve_resumable` at all."""
    settings = {
        "private_wait_s_per_gpu_hour": 0,
        "spot": True,
        "spot_max_restart_slowdown": 0.3,
        "prefer_private": True,
        **gpufed,
    }
    public = {
        "lead_time_s": 10,
        "max_gpus_per_type": 64,
        "spot_restart_risk_per_hour": risk,
        "clusters": [
            {"name": "aws", "cloud": "AWS", "region": "us-east-1", "accelerators": {"V100": "V100"}}
        ],
    }
    return a_config(
        public=public,
        policies={
            "fixed_waits_s": [50],
            "spot_curve": True,
            **({} if spot_curve_resumable is None else {"spot_curve_resumable": spot_curve_resumable}),
            "gpufed": settings,
        },
    )


def run(cfg: ReplayConfig, jobs: list[TraceJob], policy: str = "gpufed") -> Result:
    spec = next(p for p in policies(cfg) if p.name == policy)
    return simulate(cfg, build_world(cfg, a_price_table(), jobs, 1), spec, jobs)


def resumable(job: TraceJob) -> TraceJob:
    return dataclasses.replace(job, resumable=True)


def runs_of(result: Result, job: str) -> list[tuple[float, float, float, bool]]:
    return [
        (i.start_s, i.end_s, i.usd_per_gpu_hour, i.completed) for i in result.intervals if i.job_id == job
    ]


# -- which jobs resume


JOBS = [a_job(f"j{n}", n, 3600 + n) for n in range(2000)]


def test_a_seeded_share_of_the_jobs_is_resumable_whatever_the_order_or_sample() -> None:
    settings = ResumableSettings(share=0.5, seed=35)
    first = {j.job_id for j in assign_resumable(JOBS, settings) if j.resumable}
    assert 0.45 < len(first) / len(JOBS) < 0.55
    assert first == {j.job_id for j in assign_resumable(list(reversed(JOBS)), settings) if j.resumable}
    sampled = {j.job_id for j in assign_resumable(sample(JOBS, 0, 10), settings) if j.resumable}
    assert sampled == first & {j.job_id for j in sample(JOBS, 0, 10)}
    other = {j.job_id for j in assign_resumable(JOBS, dataclasses.replace(settings, seed=36)) if j.resumable}
    assert other != first
    assert not any(j.resumable for j in assign_resumable(JOBS, ResumableSettings()))
    assert all(j.resumable for j in assign_resumable(JOBS, ResumableSettings(share=1.0)))
    # Nothing else about a job changes.
    assert [dataclasses.replace(j, resumable=False) for j in assign_resumable(JOBS, settings)] == JOBS


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"share": 1.5}, r"jobs\.resumable\.share: must be between 0 and 1 \(got 1\.5\)"),
        ({"share": 0.5, "seeds": 1}, r"jobs\.resumable: unknown keys \['seeds'\]"),
        ([0.5], r"jobs\.resumable: expected a mapping"),
    ],
)
def test_a_bad_resumable_setting_is_refused_naming_it(value: object, message: str) -> None:
    with pytest.raises(ReplayError, match=message):
        a_config(jobs={"runtime_limit_factor": 1.5, "expected_runtime": "exact", "resumable": value})


# -- reclaims


def test_a_reclaimed_resumable_job_restarts_from_its_last_checkpoint() -> None:
    # No bound: both take spot. At 0.5 reclaims per node-hour a 10 h run is reclaimed several times.
    cfg = config(spot_max_restart_slowdown=None)
    result = run(cfg, [HOLD, resumable(LONG)])
    runs = runs_of(result, "long")
    assert result.reclaims >= 2
    assert result.reclaims_resumed == result.reclaims
    assert all(price == 0.9 for _, _, price, _ in runs)
    *lost, (start, end, _, completed) = runs
    assert completed
    # Each reclaimed run kept all but the last half hour of its work (none if it ran less than that),
    # so the last run does only what is left: 10 h less the kept work.
    kept = sum(max(0.0, (e - s) - 0.5 * HOUR) for s, e, _, _ in lost)
    assert end - start == pytest.approx(10 * HOUR - kept)
    # The JCT and the outcome are of the original job, submitted at 1.
    outcome = result.outcomes[JobId("long")]
    assert outcome.job == resumable(LONG)
    assert outcome.finish_s == end


def test_the_same_job_without_checkpoints_restarts_from_scratch() -> None:
    result = run(config(spot_max_restart_slowdown=None), [HOLD, a_job("long", 1, 3 * HOUR)])
    assert result.reclaims >= 1
    assert result.reclaims_resumed == 0
    *_, (start, end, _, completed) = runs_of(result, "long")
    assert completed
    assert end - start == pytest.approx(3 * HOUR)


def test_a_lost_work_setting_changes_what_a_reclaim_costs() -> None:
    # The placer's `spot_lost_work_h` is the replay's too: with 0, a reclaim loses nothing.
    cfg = config(spot_max_restart_slowdown=None)
    policy = next(p for p in policies(cfg) if p.name == "gpufed")
    world = build_world(cfg, a_price_table(), [HOLD, resumable(LONG)], 1)
    sim = Simulator(cfg, world, policy, [HOLD, resumable(LONG)])
    sim.policy_config = dataclasses.replace(sim.policy_config, spot_lost_work_h=0.0)
    result = sim.run()
    runs = runs_of(result, "long")
    assert result.reclaims >= 1
    assert sum(e - s for s, e, _, _ in runs) == pytest.approx(10 * HOUR)


# -- who is told


def test_gpufed_lets_a_resumable_long_job_on_spot_past_its_bound() -> None:
    cfg = config()
    kept_off = run(cfg, [HOLD, LONG])
    assert runs_of(kept_off, "long") == [(11.0, 11.0 + 10 * HOUR, 3.0, True)]
    allowed = run(cfg, [HOLD, resumable(LONG)])
    assert {price for _, _, price, _ in runs_of(allowed, "long")} == {0.9}
    assert allowed.outcomes[JobId("long")].finish_s is not None


def test_the_spot_aware_yardstick_is_told_only_when_the_config_says() -> None:
    jobs = [HOLD, resumable(LONG)]
    blind = run(config(), jobs, "burst_now_spot")
    assert [price for _, _, price, _ in runs_of(blind, "long")] == [3.0]
    told = run(config(spot_curve_resumable=True), jobs, "burst_now_spot")
    assert {price for _, _, price, _ in runs_of(told, "long")} == {0.9}
    # The on-demand yardstick never sees spot: resumable or not, the same run.
    assert run(config(), jobs, "burst_now").intervals == run(config(), [HOLD, LONG], "burst_now").intervals


def test_a_config_that_does_not_say_tells_the_spot_aware_yardstick() -> None:
    """Untold, the yardstick keeps resumable long jobs on demand and flatters gpufed: a config must
    say `spot_curve_resumable: false` to get that."""
    unsaid = config(spot_curve_resumable=None)
    assert unsaid.spot_curve_resumable
    told = run(unsaid, [HOLD, resumable(LONG)], "burst_now_spot")
    assert {price for _, _, price, _ in runs_of(told, "long")} == {0.9}


# -- reports


def test_rows_written_to_csv_read_back_for_reuse(tmp_path: Path) -> None:
    cfg = config()
    result = run(cfg, [HOLD, resumable(LONG)])
    row = summarise(result, 1.0, {"t1": 1.0}, cfg.period_s, 1.5, week="w", replay_cpu_s=1.25)
    path = tmp_path / "rows.csv"
    write_csv([row], path)
    (back,) = read_csv(path)
    assert back == dataclasses.replace(row, missed_deadline_ids=())
    # A column the file lacks (written before it existed) takes its default; a bad number is named.
    with path.open() as handle:
        records = list(csv.DictReader(handle))
    for record in records:
        del record["reclaims_resumed"]
        record["cycles"] = "many"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    with pytest.raises(ValueError, match=r"rows\.csv:2: column cycles"):
        read_csv(path)
