"""Sweeps' pure parts (federation/jobsets/sweeps.py): a Sweep's parameters expanded into trials (grid
order, random search reproducible by its seed), bad input named, the metric line a trial prints,
and the ranking of trials by it."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

from federation.errors import InvalidArgument
from federation.jobsets.early_stopping import (
    Goal,
    MedianStopping,
    SuccessiveHalving,
    halving_stop,
    median_stop,
    stop_reason,
)
from federation.jobsets.sweeps import (
    MAX_TRIALS,
    Trial,
    Value,
    expand,
    history,
    params_json,
    parse_metric,
    parse_sweep,
    ranked,
    trial_env,
)


def sweep(**fields: Any) -> dict[str, Any]:
    return {"metric": {"name": "loss", "goal": "minimize"}, **fields}


def test_grid_search_runs_every_combination_the_last_parameter_fastest() -> None:
    spec = parse_sweep(sweep(parameters={"lr": [0.1, 0.01], "batch": [32, 64, 128]}))
    trials = expand(spec)
    assert spec.trials == 6
    assert trials == [
        {"lr": 0.1, "batch": 32},
        {"lr": 0.1, "batch": 64},
        {"lr": 0.1, "batch": 128},
        {"lr": 0.01, "batch": 32},
        {"lr": 0.01, "batch": 64},
        {"lr": 0.01, "batch": 128},
    ]


def test_random_search_with_a_seed_gives_the_same_trials_and_another_seed_others() -> None:
    raw = sweep(
        search="random",
        trials=20,
        seed=7,
        parameters={
            "lr": {"min": 1e-5, "max": 1e-1, "log": True},
            "dropout": {"min": 0.0, "max": 0.5},
            "optimizer": {"values": ["adam", "sgd", "lion"]},
        },
    )
    first = expand(parse_sweep(raw))
    again = expand(parse_sweep(json.loads(json.dumps(raw))))  # as the server gets it, over the wire
    assert first == again
    assert len(first) == 20
    other = expand(parse_sweep({**raw, "seed": 8}))
    assert other != first
    for t in first:
        assert 1e-5 <= t["lr"] <= 1e-1  # type: ignore[operator]
        assert 0.0 <= t["dropout"] <= 0.5  # type: ignore[operator]
        assert t["optimizer"] in ("adam", "sgd", "lion")
    # Log-uniform: as many draws in each decade, roughly; a uniform draw would put ~90% in the last.
    many = expand(parse_sweep({**raw, "trials": 400}))
    low_decades = len([t for t in many if float(t["lr"]) < 1e-2])
    assert low_decades > 200
    # Pinned: this seed's first trial is these numbers on any server (Mersenne Twister, whose
    # output for a seed Python keeps stable), so a re-run of the file reproduces the sweep.
    assert math.isclose(first[0]["lr"], 0.00019739268719706258)  # type: ignore[arg-type]
    assert math.isclose(first[0]["dropout"], 0.07542458696225096)  # type: ignore[arg-type]
    assert first[0]["optimizer"] == "lion"


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (sweep(parameters={"lr": []}), "sweep parameters.lr: values: give at least one value"),
        (sweep(parameters={"lr": {"values": []}}), "sweep parameters.lr: values: give at least one value"),
        (
            sweep(search="random", trials=3, parameters={"lr": {"min": 0.5, "max": 0.1}}),
            "sweep parameters.lr: min 0.5 is greater than max 0.1",
        ),
        (
            sweep(search="random", trials=3, parameters={"lr": {"min": 0, "max": 1, "log": True}}),
            "log: true needs min > 0",
        ),
        (sweep(search="bayes", parameters={"lr": [1]}), "sweep search: must be grid or random, got 'bayes'"),
        (
            sweep(search="random", trials=MAX_TRIALS + 1, parameters={"lr": [1]}),
            f"sweep trials: must be a whole number from 1 to {MAX_TRIALS}, got {MAX_TRIALS + 1}",
        ),
        (
            sweep(parameters={"a": list(range(30)), "b": list(range(30))}),
            f"the grid has 900 combinations, more than {MAX_TRIALS}",
        ),
        (sweep(search="random", parameters={"lr": [1]}), "random search needs the number of trials"),
        (sweep(parameters={"lr": {"min": 0.1, "max": 1}}), "grid search needs a list of values"),
        (sweep(parameters={}), "sweep parameters: give at least one parameter"),
        (sweep(parameters={"learning-rate": [1]}), "sweep parameters.learning-rate: a name is a letter"),
        (sweep(parameters={"lr": [1], "LR": [2]}), "same variable GPUFED_PARAM_LR as lr"),
        (sweep(parameters={"lr": [[1]]}), "a value must be a string, a number or a boolean"),
        (sweep(parameters={"lr": [1]}, epochs=3), "sweep epochs: unknown key"),
        ({"parameters": {"lr": [1]}}, "sweep metric: give {name: NAME, goal: minimize|maximize}"),
        (
            {"parameters": {"lr": [1]}, "metric": {"name": "loss", "goal": "lowest"}},
            "sweep metric.goal: must be minimize or maximize",
        ),
        (sweep(parameters={"lr": [1]}, seed=-1), "sweep seed: must be a whole number"),
    ],
)
def test_bad_input_is_refused_naming_the_problem(raw: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_sweep(raw)
    assert words in str(refused.value)


def test_a_trial_sees_its_values_by_upper_cased_name_and_as_json() -> None:
    values: dict[str, Value] = {"lr": 0.001, "batch": 64, "optimizer": "adam", "warmup": True}
    env = trial_env("lr-sweep", 3, values)
    assert env == {
        "GPUFED_SWEEP": "lr-sweep",
        "GPUFED_TRIAL": "3",
        "GPUFED_PARAM_LR": "0.001",
        "GPUFED_PARAM_BATCH": "64",
        "GPUFED_PARAM_OPTIMIZER": "adam",
        "GPUFED_PARAM_WARMUP": "true",
    }
    assert json.loads(params_json(values)) == values


def test_the_last_metric_line_of_that_name_counts() -> None:
    lines = [
        "epoch 1",
        "gpufed-metric: loss=0.9",
        "gpufed-metric: accuracy=0.5",
        "[rank0] gpufed-metric: loss = 0.42",  # a prefix (a launcher's) and spaces are fine
        "gpufed-metric: loss=nan",  # not a finite number: ignored
        "gpufed-metric: loss=oops",
        "the metric gpufed-metric: loss=0.1 is not at the end of this line",
    ]
    assert parse_metric(lines, "loss") == 0.42
    assert parse_metric(lines, "accuracy") == 0.5
    assert parse_metric(lines, "f1") is None
    assert parse_metric([], "loss") is None
    assert parse_metric(["gpufed-metric: loss=1e-3\r"], "loss") == 0.001


def test_trials_rank_best_first_and_those_without_a_metric_last() -> None:
    trials = [
        Trial("trial-0", 0, {}, 0.5),
        Trial("trial-1", 1, {}, None),
        Trial("trial-2", 2, {}, 0.1),
        Trial("trial-3", 3, {}, 0.9),
        Trial("trial-4", 4, {}, 0.1),
        Trial("trial-5", 5, {}, None),
    ]
    assert [t.number for t in ranked(trials, Goal.MINIMIZE)] == [2, 4, 0, 3, 1, 5]
    assert [t.number for t in ranked(trials, Goal.MAXIMIZE)] == [3, 0, 2, 4, 1, 5]


def test_intermediate_values_carry_their_step_and_the_last_line_still_counts() -> None:
    lines = [
        "gpufed-metric: loss=0.9 step=1",
        "gpufed-metric: loss=0.7 step=2",
        "gpufed-metric: loss=0.8 step=2",
    ]
    assert history(lines, "loss") == {1: 0.9, 2: 0.8}
    assert parse_metric([*lines, "gpufed-metric: loss=0.5"], "loss") == 0.5
    assert parse_metric(lines, "loss") == 0.8


RULE = MedianStopping(min_trials=2, min_step=2)


def test_median_stopping_stops_a_trial_worse_than_the_median_of_others_at_its_step() -> None:
    others = [{1: 0.5, 2: 0.4, 3: 0.3}, {1: 0.6, 2: 0.5, 3: 0.45}, {1: 0.7, 4: 0.2}]
    # At step 2 the others stood at 0.4, 0.5 and 0.7 (the third's value at step 1, its last by then).
    reason = median_stop({1: 0.9, 2: 0.8}, others, Goal.MINIMIZE, RULE)
    assert reason == (
        "early stopping (median rule): 0.8 at step 2 is worse than the median 0.5 of 3 other trials at that step"
    )
    assert median_stop({1: 0.9, 2: 0.45}, others, Goal.MINIMIZE, RULE) is None  # better than the median
    assert median_stop({1: 0.9, 2: 0.5}, others, Goal.MINIMIZE, RULE) is None  # equal: not worse
    assert median_stop({1: 0.1, 2: 0.45}, others, Goal.MAXIMIZE, RULE) is not None
    # Too early (before minStep), too few others at that step, or nothing printed yet: it runs on.
    assert median_stop({1: 5.0}, others, Goal.MINIMIZE, RULE) is None
    assert median_stop({4: 5.0}, others, Goal.MINIMIZE, RULE) is None  # only one other reached step 4
    assert median_stop({}, others, Goal.MINIMIZE, RULE) is None
    assert median_stop({2: 5.0}, [{}, {}], Goal.MINIMIZE, RULE) is None


@pytest.mark.parametrize(
    ("stopping", "words"),
    [
        (
            {"type": "hyperband"},
            "sweep earlyStopping.type: must be median or successiveHalving, got 'hyperband'",
        ),
        ({"minTrials": 0}, "sweep earlyStopping.minTrials: must be a whole number from 1"),
        ({"grace": 3}, "sweep earlyStopping.grace: unknown key for median (known: type, minTrials, minStep)"),
        ({"reductionFactor": 3}, "sweep earlyStopping.reductionFactor: unknown key for median"),
        (
            {"type": "successiveHalving", "reductionFactor": 1},
            "sweep earlyStopping.reductionFactor: must be a whole number from 2",
        ),
        (
            {"type": "successiveHalving", "minStep": 0},
            "sweep earlyStopping.minStep: must be a whole number from 1",
        ),
        ("median", "sweep earlyStopping: give {type: median"),
    ],
)
def test_bad_early_stopping_is_named(stopping: Any, words: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_sweep(sweep(parameters={"lr": [1]}, earlyStopping=stopping))
    assert words in str(refused.value)
    spec = parse_sweep(sweep(parameters={"lr": [1]}, earlyStopping={"minTrials": 4}))
    assert spec.early_stopping == MedianStopping(min_trials=4, min_step=1)
    halving = {"type": "successiveHalving", "minStep": 2, "reductionFactor": 4}
    spec = parse_sweep(sweep(parameters={"lr": [1]}, earlyStopping=halving))
    assert spec.early_stopping == SuccessiveHalving(min_trials=3, min_step=2, reduction_factor=4)
    assert spec.to_dict()["earlyStopping"] == {**halving, "minTrials": 3}


HALVING = SuccessiveHalving(min_trials=3, min_step=1, reduction_factor=3)


def test_successive_halving_rungs_are_min_step_times_powers_of_the_factor() -> None:
    rungs = SuccessiveHalving(min_trials=1, min_step=2, reduction_factor=3)
    assert [rungs.rung(step) for step in (0, 1, 2, 5, 6, 17, 18, 54)] == [None, None, 2, 2, 6, 6, 18, 54]


def test_successive_halving_keeps_the_best_third_at_each_rung_and_stops_the_rest() -> None:
    # At rung 3 (steps 3 to 8) five others stood at 0.1 .. 0.5; with the trial, six values: the best
    # 6 // 3 = 2 go on, so the cutoff is the second best.
    others = [{1: 0.9, 3: v} for v in (0.1, 0.2, 0.3, 0.4, 0.5)]
    assert halving_stop({1: 0.9, 3: 0.15}, others, Goal.MINIMIZE, HALVING) is None  # second best
    assert halving_stop({1: 0.9, 3: 0.2}, others, Goal.MINIMIZE, HALVING) is None  # tied with the cutoff
    reason = halving_stop({1: 0.9, 3: 0.25, 4: 0.1}, others, Goal.MINIMIZE, HALVING)
    assert reason == (
        "early stopping (successive halving): 0.25 at rung step 3 is not among the best 2 of 6 trials at "
        "that step (1/3 go on; the cutoff is 0.2)"
    )
    # Judged at the rung, not at its latest step: its value at step 3 is its report at step 2.
    assert halving_stop({2: 0.05, 4: 0.9}, others, Goal.MINIMIZE, HALVING) is None
    assert halving_stop({1: 0.1, 3: 0.45}, others, Goal.MAXIMIZE, HALVING) is None  # best when maximizing
    assert halving_stop({1: 0.1, 3: 0.15}, others, Goal.MAXIMIZE, HALVING) is not None
    # Before the first rung, with too few others at its rung, or nothing printed: it runs on.
    assert halving_stop({}, others, Goal.MINIMIZE, HALVING) is None
    assert halving_stop({0: 9.0}, others, Goal.MINIMIZE, replace(HALVING, min_step=1)) is None
    assert halving_stop({9: 5.0}, others, Goal.MINIMIZE, HALVING) is None  # nobody else reached rung 9
    assert halving_stop({3: 5.0}, others[:2], Goal.MINIMIZE, HALVING) is None  # two others, three needed
    # The sweep's rule decides which: the same trial passes the median rule and fails halving.
    median = MedianStopping(min_trials=3, min_step=1)
    assert stop_reason({3: 0.25}, others, Goal.MINIMIZE, median) is None
    assert stop_reason({3: 0.25}, others, Goal.MINIMIZE, HALVING) is not None


def test_the_sweep_in_the_user_guide_is_one_gpufed_accepts() -> None:
    from pathlib import Path

    import yaml

    from federation.cli.sweeps import sweep_request

    page = (Path(__file__).resolve().parents[2] / "docs" / "jobsets.md").read_text()
    blocks = [b.split("```", 1)[0] for b in page.split("```yaml\n")[1:]]
    (text,) = [b for b in blocks if "kind: Sweep" in b]
    request = sweep_request(yaml.safe_load(text))
    spec = parse_sweep(json.loads(request.sweep))
    assert (request.name, request.max_parallel, spec.trials, spec.seed) == ("lr-sweep", 8, 40, 7)
    assert spec.early_stopping == MedianStopping(min_trials=3, min_step=2)
    assert len(expand(spec)) == 40
    # The errors the guide quotes are the ones given.
    for line in page.splitlines():
        if line.startswith("INVALID_ARGUMENT: sweep "):
            assert line.removeprefix("INVALID_ARGUMENT: ") in _quoted_errors(), line


def _quoted_errors() -> set[str]:
    cases = [
        sweep(parameters={"lr": []}),
        sweep(search="random", trials=3, parameters={"lr": {"min": 0.5, "max": 0.1}}),
        sweep(search="bayes", parameters={"lr": [1]}),
        sweep(search="random", trials=MAX_TRIALS + 1, parameters={"lr": [1]}),
        sweep(parameters={"a": list(range(30)), "b": list(range(30))}),
        sweep(parameters={"lr": {"min": 0.1, "max": 1}}),
    ]
    out = set()
    for raw in cases:
        with pytest.raises(InvalidArgument) as refused:
            parse_sweep(raw)
        out.add(str(refused.value))
    return out
