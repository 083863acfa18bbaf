"""`--weeks all`: which traces count as weeks, how they are named, and that each gets the same config."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from federation.replay.errors import ReplayError
from federation.replay.policies import policies
from federation.replay.sweep import for_weeks, week_name, weeks_beside
from tests.unit.replay_builders import a_config


@pytest.mark.parametrize(
    ("file_name", "week"),
    [
        pytest.param("philly_week_2017-10-16.csv.gz", "philly_week_2017-10-16", id="gzipped"),
        pytest.param("mine.csv", "mine", id="plain"),
    ],
)
def test_a_week_is_named_by_its_file_without_extensions(file_name: str, week: str) -> None:
    assert week_name(Path("/traces") / file_name) == week


def test_every_trace_beside_the_configs_is_a_week_in_name_order(tmp_path: Path) -> None:
    for name in ("b.csv.gz", "a.csv", "notes.md", "c.csv.gz"):
        (tmp_path / name).write_text("")
    assert [p.name for p in weeks_beside(tmp_path / "b.csv.gz")] == ["a.csv", "b.csv.gz", "c.csv.gz"]


def test_a_directory_without_traces_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match="no traces"):
        weeks_beside(tmp_path / "missing.csv")


def test_each_week_gets_the_same_config_but_its_own_trace() -> None:
    config = a_config()
    weeks = for_weeks(config, [Path("/t/a.csv"), Path("/t/b.csv")])
    assert [w.trace_path for w in weeks] == [Path("/t/a.csv"), Path("/t/b.csv")]
    assert {(w.gpufed, w.private_sizes, w.fixed_waits_s) for w in weeks} == {
        (config.gpufed, config.private_sizes, config.fixed_waits_s)
    }


def test_tuning_runs_may_keep_only_some_policies() -> None:
    config = dataclasses.replace(a_config(), only_policies=("gpufed", "burst_now"))
    assert [p.name for p in policies(config)] == ["burst_now", "gpufed"]
