"""Replay metrics and the headline figures on inputs whose answers are known."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from federation.replay.metrics import Metrics, fairness, jain, summarise
from federation.replay.report import headlines, worst_lines, write_all
from federation.replay.sim import Interval, JobOutcome, Result
from placement.model import JobId
from tests.unit.replay_builders import a_job


def interval(tenant: str, start: float, end: float, private: bool = True, gpus: int = 1) -> Interval:
    return Interval(JobId("j"), tenant, "c", "V100", private, gpus, start, end, 2.0, True)


@pytest.mark.parametrize(
    ("values", "index"),
    [
        pytest.param([1.0, 1.0, 1.0], 1.0, id="equal"),
        pytest.param([1.0, 0.0, 0.0, 0.0], 0.25, id="one-takes-all"),
        pytest.param([], 1.0, id="empty"),
    ],
)
def test_jain(values: list[float], index: float) -> None:
    assert jain(values) == pytest.approx(index)


def test_fairness_compares_private_shares_with_entitlements_within_the_period() -> None:
    intervals = [
        interval("a", 0, 30),
        interval("b", 0, 10),
        interval("b", 90, 200),  # only 10 s fall in the period of 100 s
        interval("a", 0, 50, private=False),  # cloud does not count
    ]
    index, gap = fairness(intervals, {"a": 1.0, "b": 1.0}, period_s=100)
    # a got 30 of 50 private GPU-seconds (60 %), entitled to 50 %.
    assert gap == pytest.approx(10.0)
    assert index == pytest.approx(jain([1.2, 0.8]))


def test_summary_of_a_known_result() -> None:
    a, b = a_job("a", 0, 100), a_job("b", 0, 100)
    result = Result(
        "burst_now",
        1,
        {
            a.job_id: JobOutcome(a, 0, 100, 1, 0, "onprem", "V100", True),
            b.job_id: JobOutcome(b, 10, 110, 1, 0, "aws", "V100", False),
        },
        [interval("t1", 0, 100), interval("t1", 10, 110, private=False)],
    )
    m = summarise(result, 1.0, {"t1": 1.0}, period_s=200, replay_s=0.5)
    assert m.cloud_cost_usd == pytest.approx(2.0 * 100 / 3600)
    assert m.avg_jct_h == pytest.approx(105 / 3600)
    assert m.avg_queue_h == pytest.approx(5 / 3600)
    assert m.private_utilisation == pytest.approx(0.5)
    assert (m.jobs_in_cloud, m.unfinished, m.preemptions) == (1, 0, 0)


def row(policy: str, jct_h: float, cost: float, size: float = 1.0, week: str = "") -> Metrics:
    zero = Metrics(policy, size, 8, 1, 0, cost, 0, 0, jct_h, 0, 0, 0, 0, 1, 0, 0, 0, 0, week)
    return dataclasses.replace(zero, avg_jct_h=jct_h, cloud_cost_usd=cost)


def test_headline_interpolates_the_fixed_wait_curve_at_gpufeds_jct(tmp_path: Path) -> None:
    rows = [
        row("private_only", 5.0, 0),
        row("burst_now", 2.0, 1000),
        row("fixed_wait_1h", 3.0, 600),
        row("fixed_wait_4h", 4.0, 200),
        row("gpufed", 3.5, 300),
    ]
    (head,) = headlines(rows)
    assert head.curve_cost_usd == pytest.approx(400)
    assert head.cost_ratio_vs_fixed_wait_curve == pytest.approx(0.75)
    assert head.cloud_cost_cut_vs_burst_now == pytest.approx(0.7)
    assert not head.clamped
    lines = write_all(rows, tmp_path, "test")
    assert lines == [
        "cost_ratio_vs_fixed_wait_curve_1x: 0.750 ratio",
        "cloud_cost_cut_vs_burst_now_1x: 70.0 %",
        "avg_jct_vs_burst_now_1x: +75.0 %",
    ]
    assert (tmp_path / "replay_cost_vs_jct_1x.png").stat().st_size > 0
    assert "gpufed" in (tmp_path / "replay.csv").read_text()


def week_rows(week: str, gpufed_cost: float, gpufed_jct_h: float) -> list[Metrics]:
    """At each of two sizes: burst-now 1,000 USD at 2 h, a 1 h fixed wait 600 USD at 3 h."""
    return [
        row(policy, jct, cost, size, week)
        for size in (0.75, 1.0)
        for policy, jct, cost in (
            ("burst_now", 2.0, 1000),
            ("fixed_wait_1h", 3.0, 600),
            ("gpufed", gpufed_jct_h, gpufed_cost),
        )
    ]


def test_several_weeks_get_a_curve_each_and_the_worst_week_per_size(tmp_path: Path) -> None:
    # Week a: gpufed at 2.5 h, where a's curve costs 800: ratio 0.5, cut 60 %, JCT +25 %.
    # Week b: gpufed at 2.2 h (curve 920): ratio 0.75 (690 / 920), cut 31 %, JCT +10 %.
    rows = week_rows("a", 400, 2.5) + week_rows("b", 690, 2.2)
    lines = write_all(rows, tmp_path, "test")
    assert lines[:3] == [
        "cost_ratio_vs_fixed_wait_curve_a_0.75x: 0.500 ratio",
        "cloud_cost_cut_vs_burst_now_a_0.75x: 60.0 %",
        "avg_jct_vs_burst_now_a_0.75x: +25.0 %",
    ]
    assert lines[-6:] == [
        "worst_cost_ratio_vs_fixed_wait_curve_0.75x: 0.750 ratio",
        "worst_cloud_cost_cut_vs_burst_now_0.75x: 31.0 %",
        "worst_avg_jct_vs_burst_now_0.75x: +25.0 %",
        "worst_cost_ratio_vs_fixed_wait_curve_1x: 0.750 ratio",
        "worst_cloud_cost_cut_vs_burst_now_1x: 31.0 %",
        "worst_avg_jct_vs_burst_now_1x: +25.0 %",
    ]
    assert len(lines) == 2 * 2 * 3 + 6
    for week in ("a", "b"):
        assert (tmp_path / week / "replay_cost_vs_jct_0.75x.png").stat().st_size > 0
        assert f"| {week} |" in (tmp_path / week / "replay.md").read_text()
    assert "worst_cost_ratio_vs_fixed_wait_curve_1x: 0.750 ratio" in (tmp_path / "weeks.md").read_text()


def test_headline_beyond_the_curve_is_clamped_and_says_so() -> None:
    (head,) = headlines(
        [row("burst_now", 2.0, 1000), row("fixed_wait_1h", 3.0, 600), row("gpufed", 9.0, 100)]
    )
    assert head.clamped
    assert head.curve_cost_usd == 600


def spot_rows(gpufed_cost: float, week: str = "") -> list[Metrics]:
    """On demand: burst-now 1,000 USD at 2 h, a 1 h wait 600 USD at 3 h. With gpufed's spot rule:
    500 USD at 2 h, 400 at 3 h. gpufed at 2.5 h, where the curves cost 800 and 450."""
    return [
        row("burst_now", 2.0, 1000, week=week),
        row("fixed_wait_1h", 3.0, 600, week=week),
        row("burst_now_spot", 2.0, 500, week=week),
        row("fixed_wait_1h_spot", 3.0, 400, week=week),
        row("gpufed", 2.5, gpufed_cost, week=week),
    ]


def test_the_spot_aware_curve_is_a_second_yardstick_not_mixed_into_the_first(tmp_path: Path) -> None:
    rows = spot_rows(300)
    (head,) = headlines(rows)
    assert head.curve_cost_usd == pytest.approx(800)
    assert head.cost_ratio_vs_fixed_wait_curve == pytest.approx(0.375)
    assert head.spot_curve_cost_usd == pytest.approx(450)
    assert head.cost_ratio_vs_spot_fixed_wait_curve == pytest.approx(300 / 450)
    assert head.cloud_cost_cut_vs_spot_burst_now == pytest.approx(0.4)
    lines = write_all(rows, tmp_path, "test")
    assert lines == [
        "cost_ratio_vs_fixed_wait_curve_1x: 0.375 ratio",
        "cloud_cost_cut_vs_burst_now_1x: 70.0 %",
        "avg_jct_vs_burst_now_1x: +25.0 %",
        "cost_ratio_vs_spot_fixed_wait_curve_1x: 0.667 ratio",
        "cloud_cost_cut_vs_spot_burst_now_1x: 40.0 %",
    ]
    assert "| 450 | 0.667 | 40.0 % |" in (tmp_path / "replay.md").read_text()


def test_the_worst_week_against_the_spot_aware_curve() -> None:
    lines = worst_lines(headlines(spot_rows(300, "a") + spot_rows(360, "b")))
    assert "worst_cost_ratio_vs_spot_fixed_wait_curve_1x: 0.800 ratio" in lines
    assert "worst_cloud_cost_cut_vs_spot_burst_now_1x: 28.0 %" in lines
