"""Deadlines in the replay (issue 35): which jobs get one (seeded, reproducible), what the placer is
told, what the simulator does with a deadline it can no longer meet, and how misses are counted and
compared with burst-now's, job by job."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from federation.replay.config import DeadlineSettings, ReplayConfig
from federation.replay.errors import ReplayError
from federation.replay.metrics import Metrics, missed_deadlines, summarise
from federation.replay.policies import policies
from federation.replay.report import headlines, write_all
from federation.replay.sim import JobOutcome, Result, simulate
from federation.replay.trace import TraceJob, assign_deadlines, sample
from federation.replay.world import build_world
from placement.model import JobId
from tests.unit.replay_builders import a_config, a_job, a_price_table

SETTINGS = DeadlineSettings(share=0.3, min_factor=2.0, max_factor=4.0, seed=35)
JOBS = [a_job(f"j{i}", float(i), 100.0 + i) for i in range(400)]


def deadlines_of(jobs: Sequence[TraceJob]) -> dict[JobId, float | None]:
    return {j.job_id: j.deadline_s for j in jobs}


def test_a_seeded_share_of_jobs_gets_a_deadline_within_the_factors() -> None:
    dated = [j for j in assign_deadlines(JOBS, SETTINGS) if j.deadline_s is not None]
    # 30 % of 400, within the binomial spread (sd about 9).
    assert 90 <= len(dated) <= 150
    for job in dated:
        assert job.deadline_s is not None
        factor = (job.deadline_s - job.submit_time_s) / job.duration_s
        assert 2.0 <= factor <= 4.0
    factors = [((j.deadline_s or 0.0) - j.submit_time_s) / j.duration_s for j in dated]
    assert len(set(factors)) > 1


def test_deadlines_depend_only_on_the_seed_and_the_job_id() -> None:
    first = deadlines_of(assign_deadlines(JOBS, SETTINGS))
    assert first == deadlines_of(assign_deadlines(JOBS, SETTINGS))
    assert first == deadlines_of(assign_deadlines(list(reversed(JOBS)), SETTINGS))
    # A sample (every 10th job) gets the deadlines the full trace gives those jobs.
    sampled = deadlines_of(assign_deadlines(sample(JOBS, 0, 10), SETTINGS))
    assert sampled == {job: first[job] for job in sampled}
    other = deadlines_of(assign_deadlines(JOBS, dataclasses.replace(SETTINGS, seed=36)))
    assert other != first


def test_no_share_no_deadlines_and_the_slack_floor_applies() -> None:
    assert all(j.deadline_s is None for j in assign_deadlines(JOBS, DeadlineSettings()))
    floor = dataclasses.replace(SETTINGS, share=1.0, min_slack_s=3600)
    for job in assign_deadlines(JOBS, floor):
        assert job.deadline_s == pytest.approx(
            job.submit_time_s + max(job.duration_s * 2.0, job.duration_s + 3600), abs=job.duration_s * 2.0
        )
        assert job.deadline_s is not None
        assert job.deadline_s >= job.submit_time_s + job.duration_s + 3600


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        pytest.param({"share": 1.5}, "share: must be between 0 and 1", id="share-over-one"),
        pytest.param({"share": 0.2, "min_factor": 0.5}, "1 <= min_factor", id="before-the-run"),
        pytest.param(
            {"share": 0.2, "min_factor": 3, "max_factor": 2}, "min_factor <= max_factor", id="order"
        ),
        pytest.param({"share": 0.2, "min_slack_s": -1}, "min_slack_s: must be >= 0", id="negative-slack"),
        pytest.param([0.2], "expected a mapping", id="not-a-mapping"),
    ],
)
def test_bad_deadline_settings_are_named(doc: Any, message: str) -> None:
    with pytest.raises(ReplayError, match=message):
        a_config(jobs={"runtime_limit_factor": 1.5, "deadlines": doc})


def config_with_deadlines(**policies_doc: Any) -> ReplayConfig:
    return a_config(
        jobs={"runtime_limit_factor": 1.5, "expected_runtime": "exact"},
        policies={
            "fixed_waits_s": [50],
            "gpufed": {"private_wait_s_per_gpu_hour": 3600, "private_wait_max_s": 400, **policies_doc},
        },
    )


def run(policy: str, jobs: Sequence[TraceJob], config: ReplayConfig) -> Result:
    spec = next(p for p in policies(config) if p.name == policy)
    return simulate(config, build_world(config, a_price_table(), jobs, 1), spec, jobs)


def test_gpufeds_wait_ends_in_time_for_the_deadline_and_the_yardsticks_ignore_it() -> None:
    # One private GPU busy until 300; b's 100 s of work would wait 100 s under gpufed's rate. With a
    # deadline at 170, its wait ends when its run-time limit (150 s) still fits before it once the
    # burst is running: the placer is told the world's cycle (0 s here) and the cloud's 10 s lead time
    # as its margin, so the wait ends at 10, and the gang runs from 20, its limit ending on the
    # deadline. (Without the margin it waited until 20 and ran from 30: its limit no longer fit.)
    config = config_with_deadlines()
    assert (config.cycle_s, config.lead_time_s) == (0.0, 10.0)
    b = dataclasses.replace(a_job("b", 0, 100), deadline_s=170.0)
    jobs = [a_job("a", 0, 300), b]
    gpufed = run("gpufed", jobs, config)
    start_s = gpufed.outcomes[b.job_id].start_s
    assert start_s == 20
    assert start_s + 150 <= 170
    assert gpufed.outcomes[b.job_id].finish_s == 120
    assert missed_deadlines(gpufed) == []
    # Without the deadline it waits its full 100 s.
    plain = run("gpufed", [a_job("a", 0, 300), a_job("b", 0, 100)], config)
    assert plain.outcomes[b.job_id].start_s == 110
    # The fixed wait does not know the deadline: it waits its 50 s whatever.
    fixed = run("fixed_wait_0.833333m", jobs, config)
    assert fixed.outcomes[b.job_id].start_s == 60


def test_a_deadline_the_placer_cannot_meet_is_dropped_and_the_job_still_runs() -> None:
    # b's deadline (90) is closer than its work (100 s) on any GPU: the placer refuses every placement
    # as late; the simulator drops the deadline, the job runs and is counted as missed.
    config = config_with_deadlines()
    b = dataclasses.replace(a_job("b", 0, 100), deadline_s=90.0)
    result = run("gpufed", [a_job("a", 0, 300), b], config)
    assert result.deadlines_dropped == 1
    assert result.outcomes[b.job_id].finish_s is not None
    assert missed_deadlines(result) == [b.job_id]


def test_missed_deadlines_are_late_or_unfinished_jobs_with_one() -> None:
    on_time = dataclasses.replace(a_job("on_time", 0, 100), deadline_s=100.0)
    late = dataclasses.replace(a_job("late", 0, 100), deadline_s=150.0)
    never = dataclasses.replace(a_job("never", 0, 100), deadline_s=500.0)
    free = a_job("free", 0, 100)
    result = Result(
        "gpufed",
        1,
        {
            on_time.job_id: JobOutcome(on_time, 0, 100, 1),
            late.job_id: JobOutcome(late, 60, 160, 1),
            never.job_id: JobOutcome(never),
            free.job_id: JobOutcome(free, 900, 1000, 1),
        },
        [],
    )
    assert missed_deadlines(result) == ["late", "never"]
    metrics = summarise(result, 1.0, {"t1": 1.0}, period_s=1000, replay_s=0.1)
    assert (metrics.deadlines, metrics.deadlines_missed) == (3, 2)
    assert metrics.missed_deadline_ids == ("late", "never")
    assert "missed_deadline_ids" not in metrics.row()


def row(policy: str, jct_h: float, cost: float, missed: tuple[str, ...], week: str = "") -> Metrics:
    zero = Metrics(policy, 1.0, 8, 1, 0, cost, 0, 0, jct_h, 0, 0, 0, 0, 1, 0, 0, 0, 0, week)
    return dataclasses.replace(zero, deadlines=10, deadlines_missed=len(missed), missed_deadline_ids=missed)


def test_the_headline_counts_deadlines_gpufed_missed_that_burst_now_met(tmp_path: Path) -> None:
    rows = [
        row("burst_now", 2.0, 1000, ("x", "y")),
        row("fixed_wait_1h", 3.0, 600, ("x", "y", "z")),
        row("gpufed", 2.5, 300, ("y", "w")),
    ]
    (head,) = headlines(rows)
    assert (head.deadlines, head.deadlines_missed, head.burst_now_deadlines_missed) == (10, 2, 2)
    # w: missed by gpufed, met by burst-now; y: missed by both.
    assert head.missed_by_gpufed_met_by_burst_now == 1
    lines = write_all(rows, tmp_path, "test")
    assert lines[-3:] == [
        "deadlines_missed_1x: 2 jobs",
        "deadlines_missed_by_burst_now_1x: 2 jobs",
        "deadlines_missed_by_gpufed_met_by_burst_now_1x: 1 jobs",
    ]
    table = (tmp_path / "replay.md").read_text()
    assert "| 2 / 2 (of 10) | 1 |" in table
    assert "deadlines_missed" in (tmp_path / "replay.csv").read_text().splitlines()[0]


def test_the_worst_week_of_deadlines(tmp_path: Path) -> None:
    rows = [
        row("burst_now", 2.0, 1000, (), "a"),
        row("gpufed", 2.5, 300, ("p",), "a"),
        row("burst_now", 2.0, 1000, ("q", "r"), "b"),
        row("gpufed", 2.5, 300, ("q", "r", "s"), "b"),
    ]
    lines = write_all(rows, tmp_path, "test")
    assert lines[-2:] == [
        "deadlines_missed_1x: 3 jobs",
        "deadlines_missed_by_gpufed_met_by_burst_now_1x: 1 jobs",
    ]
