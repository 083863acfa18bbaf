"""Hyperparameter sweeps (issue 34): a `Sweep`'s parameters expanded into trials, the metric a trial
prints, and the trials ranked by it. Pure: no I/O, so expansion and ranking are tested alone.

A sweep is a job set whose members are trials: one TrainingJob template, run once per point of the
search. Grid search takes every combination of the listed values, in the order written (the last
parameter varies fastest, as `itertools.product` and Katib's grid do). Random search draws `trials`
points from a `random.Random(seed)`, parameter by parameter in the order written, so the same seed
gives the same trials on any server and any Python (the generator is Mersenne Twister, whose
`random()` and `randrange()` outputs Python keeps stable for a seed).

A trial reports its metric by printing `gpufed-metric: <name>=<value>`; the last such line counts.
Or, with `metric.source: file`, by writing `<name>=<value>` lines to a file (METRIC_FILE unless
`metric.path` says otherwise) that its cluster reads as the container's termination message when it
ends (`terminationMessagePath`, which gpufed sets on each trial's main container; at most 4096 bytes
are read, so the file holds the final values, not a history).
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from federation.errors import InvalidArgument
from federation.jobsets.early_stopping import (
    STOPPING_TYPES,
    EarlyStopping,
    Goal,
    MedianStopping,
    SuccessiveHalving,
    stopping_to_dict,
)

# The most trials one sweep may have: as many members as a set of named jobs (its record in etcd
# holds each trial's values).
MAX_TRIALS = 500
MAX_PARAMETERS = 32
MAX_VALUES = 1000
MAX_VALUE_CHARS = 256
PARAM_ENV_PREFIX = "GPUFED_PARAM_"
SWEEP_ENV = "GPUFED_SWEEP"
TRIAL_ENV = "GPUFED_TRIAL"
METRIC_PREFIX = "gpufed-metric:"
# Where a trial writes its metric when `metric.source: file` names no path: a file directly under
# /etc, which a container runtime creates in the image's writable layer (a path under PARAMS_DIR
# would be inside the read-only downward API volume of the params file, where it cannot be made).
METRIC_FILE = "/etc/gpufed-metric"
# The params file's directory (`jobsets.store.PARAMS_DIR`): a read-only volume in every trial.
_PARAMS_DIR = "/etc/gpufed-sweep"
# A termination message's most bytes (the kubelet's cut, for a pod of up to three containers).
TERMINATION_MESSAGE_BYTES = 4096

_PARAM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}")
_METRIC_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_./-]{0,62}")
_METRIC_LINE = re.compile(
    r"gpufed-metric:\s*([A-Za-z][A-Za-z0-9_./-]{0,62})\s*=\s*(\S+)(?:\s+step\s*=\s*(\d{1,12}))?\s*$"
)

Value = str | int | float | bool


class MetricSource(StrEnum):
    """Where a trial's metric is read: its printed log lines, or the file it writes."""

    LOGS = "logs"
    FILE = "file"


class Search(StrEnum):
    GRID = "grid"
    RANDOM = "random"


@dataclass(frozen=True, slots=True)
class Choice:
    """Values to pick from: every one in grid search, one at random in random search."""

    values: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Range:
    """A continuous distribution for random search: uniform in [low, high], or log-uniform."""

    low: float
    high: float
    log: bool = False


Parameter = Choice | Range


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """What a Sweep file says beside its template, checked."""

    parameters: tuple[tuple[str, Parameter], ...]
    search: Search
    trials: int
    seed: int
    metric: str
    goal: Goal
    early_stopping: EarlyStopping | None = None
    metric_source: MetricSource = MetricSource.LOGS
    # The file a trial writes its metric to (its termination message path); "" for logs.
    metric_path: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The sweep as the API carries and etcd keeps it (the Sweep file's own keys)."""
        params: dict[str, Any] = {}
        for name, p in self.parameters:
            if isinstance(p, Choice):
                params[name] = {"values": list(p.values)}
            else:
                params[name] = {"min": p.low, "max": p.high, "log": p.log}
        return {
            "parameters": params,
            "search": self.search.value,
            "trials": self.trials,
            "seed": self.seed,
            # A logs metric is written as before file metrics were known: an old sweep's digest, and
            # so its idempotent resubmission, stay the same.
            "metric": {"name": self.metric, "goal": self.goal.value}
            | (
                {}
                if self.metric_source is MetricSource.LOGS
                else {"source": self.metric_source.value, "path": self.metric_path}
            ),
            **({} if (rule := self.early_stopping) is None else {"earlyStopping": stopping_to_dict(rule)}),
        }


def _fail(field: str, problem: str) -> InvalidArgument:
    return InvalidArgument(f"sweep {field}: {problem}")


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(field, f"must be a number, got {value!r}"[:200])
    if not math.isfinite(value):
        raise _fail(field, f"must be a finite number, got {value!r}")
    return float(value)


def _value(value: Any, field: str) -> Value:
    if isinstance(value, bool | int | str):
        if isinstance(value, str) and (len(value) > MAX_VALUE_CHARS or "\n" in value or "\0" in value):
            raise _fail(field, f"a value is one line of at most {MAX_VALUE_CHARS} characters")
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise _fail(field, f"a value must be a string, a number or a boolean, got {value!r}"[:200])


def _parameter(name: str, raw: Any, search: Search) -> Parameter:
    field = f"parameters.{name}"
    if isinstance(raw, list):
        raw = {"values": raw}
    if not isinstance(raw, dict):
        raise _fail(field, "a list of values, {values: [...]} or {min, max, log}")
    if "values" in raw:
        extra = sorted(set(raw) - {"values"})
        if extra:
            raise _fail(field, f"unknown key {extra[0]!r} beside values")
        values = raw["values"]
        if not isinstance(values, list) or not values:
            raise _fail(field, "values: give at least one value")
        if len(values) > MAX_VALUES:
            raise _fail(field, f"values: at most {MAX_VALUES}, got {len(values)}")
        return Choice(tuple(_value(v, field) for v in values))
    extra = sorted(set(raw) - {"min", "max", "log"})
    if extra:
        raise _fail(field, f"unknown key {extra[0]!r} (known: values, or min, max and log)")
    if "min" not in raw or "max" not in raw:
        raise _fail(field, "a distribution needs both min and max")
    if search is Search.GRID:
        raise _fail(field, "grid search needs a list of values; min and max are for search: random")
    low, high = _number(raw["min"], f"{field}.min"), _number(raw["max"], f"{field}.max")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise _fail(f"{field}.log", "must be true or false")
    if low > high:
        raise _fail(field, f"min {low:g} is greater than max {high:g}")
    if log and low <= 0:
        raise _fail(field, f"log: true needs min > 0, got {low:g}")
    return Range(low, high, log)


def _whole(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(field, f"must be a whole number from {low} to {high}, got {value!r}"[:200])
    return value


def parse_sweep(raw: Mapping[str, Any]) -> SweepSpec:
    """A Sweep's spec without its template: parameters, search, trials, seed and metric."""
    known = {"parameters", "search", "trials", "seed", "metric", "earlyStopping"}
    extra = sorted(set(raw) - known)
    if extra:
        raise _fail(extra[0], f"unknown key (known: {', '.join(sorted(known))})")
    search_text = raw.get("search", "grid")
    try:
        search = Search(search_text)
    except ValueError:
        raise _fail("search", f"must be grid or random, got {search_text!r}"[:200]) from None
    params = raw.get("parameters")
    if not isinstance(params, dict) or not params:
        raise _fail("parameters", "give at least one parameter (name: list of values, or {min, max, log})")
    if len(params) > MAX_PARAMETERS:
        raise _fail("parameters", f"at most {MAX_PARAMETERS}, got {len(params)}")
    parameters: list[tuple[str, Parameter]] = []
    seen: dict[str, str] = {}
    for name, p in params.items():
        if not isinstance(name, str) or not _PARAM_NAME.fullmatch(name):
            raise _fail(
                f"parameters.{name}",
                "a name is a letter then letters, digits or _ (it becomes GPUFED_PARAM_<NAME>)",
            )
        if name.upper() in seen:
            raise _fail(
                f"parameters.{name}", f"same variable GPUFED_PARAM_{name.upper()} as {seen[name.upper()]}"
            )
        seen[name.upper()] = name
        parameters.append((name, _parameter(name, p, search)))
    metric = raw.get("metric")
    if not isinstance(metric, dict) or not isinstance(metric.get("name"), str):
        raise _fail("metric", "give {name: NAME, goal: minimize|maximize}")
    extra = sorted(set(metric) - {"name", "goal", "source", "path"})
    if extra:
        raise _fail(f"metric.{extra[0]}", "unknown key (known: name, goal, source, path)")
    source, path = _metric_source(metric)
    if not _METRIC_NAME.fullmatch(metric["name"]):
        raise _fail("metric.name", "a letter then letters, digits, _ . / or -")
    try:
        goal = Goal(metric.get("goal", "minimize"))
    except ValueError:
        raise _fail(
            "metric.goal", f"must be minimize or maximize, got {metric.get('goal')!r}"[:200]
        ) from None
    seed = _whole(raw.get("seed", 0), "seed", 0, 2**63 - 1)
    if search is Search.RANDOM:
        if "trials" not in raw:
            raise _fail("trials", "random search needs the number of trials")
        trials = _whole(raw["trials"], "trials", 1, MAX_TRIALS)
    else:
        if "trials" in raw:
            raise _fail("trials", "grid search runs every combination; trials is for search: random")
        trials = math.prod(len(p.values) for _, p in parameters if isinstance(p, Choice))
        if trials > MAX_TRIALS:
            raise _fail(
                "parameters",
                f"the grid has {trials} combinations, more than {MAX_TRIALS} (the most one sweep may "
                "have); use fewer values or search: random",
            )
    stopping = _early_stopping(raw.get("earlyStopping"))
    if stopping is not None and source is MetricSource.FILE:
        # Early stopping judges running trials by their intermediate values; a file's metric is read
        # only when the trial has ended, so no running trial could ever be judged.
        raise _fail(
            "earlyStopping",
            "needs intermediate values while trials run, and a metric read from a file (metric.source: "
            "file) is known only when a trial ends; print the metric instead (gpufed-metric: NAME=VALUE "
            "step=N, metric.source: logs) or drop earlyStopping",
        )
    return SweepSpec(tuple(parameters), search, trials, seed, metric["name"], goal, stopping, source, path)


def _metric_source(metric: Mapping[str, Any]) -> tuple[MetricSource, str]:
    """The metric's source and, for a file, its absolute path (METRIC_FILE when none is given)."""
    text = metric.get("source", "logs")
    try:
        source = MetricSource(text)
    except ValueError:
        raise _fail("metric.source", f"must be logs or file, got {text!r}"[:200]) from None
    if source is MetricSource.LOGS:
        if "path" in metric:
            raise _fail("metric.path", "is for metric.source: file (a printed metric has no path)")
        return source, ""
    path = metric.get("path", METRIC_FILE)
    if not isinstance(path, str) or not path.startswith("/") or len(path) > 256:
        raise _fail("metric.path", f"must be an absolute path of at most 256 characters, got {path!r}"[:200])
    if path.endswith("/") or any(part in ("", ".", "..") for part in path[1:].split("/")):
        raise _fail("metric.path", f"must name a file, without . or .. or empty parts, got {path!r}"[:200])
    if any(ch.isspace() or not ch.isprintable() for ch in path):
        raise _fail("metric.path", "must not contain spaces or control characters")
    if path == _PARAMS_DIR or path.startswith(_PARAMS_DIR + "/"):
        raise _fail(
            "metric.path",
            f"{_PARAMS_DIR} is the trial's read-only params volume; use another path, such as {METRIC_FILE}",
        )
    return source, path


def _early_stopping(raw: Any) -> EarlyStopping | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _fail(
            "earlyStopping",
            "give {type: median, minTrials: N, minStep: S} or {type: successiveHalving, minTrials: N, "
            "minStep: S, reductionFactor: R}",
        )
    kind = raw.get("type", "median")
    if kind not in STOPPING_TYPES:
        raise _fail("earlyStopping.type", f"must be median or successiveHalving, got {kind!r}"[:200])
    known = ["type", "minTrials", "minStep"] + (["reductionFactor"] if kind == "successiveHalving" else [])
    extra = sorted(set(raw) - set(known))
    if extra:
        raise _fail(f"earlyStopping.{extra[0]}", f"unknown key for {kind} (known: {', '.join(known)})")
    min_trials = _whole(raw.get("minTrials", 3), "earlyStopping.minTrials", 1, MAX_TRIALS)
    if kind == "median":
        return MedianStopping(
            min_trials=min_trials, min_step=_whole(raw.get("minStep", 1), "earlyStopping.minStep", 0, 10**12)
        )
    # Rungs are minStep times powers of the factor: a first rung at step 0 would make every rung 0.
    return SuccessiveHalving(
        min_trials=min_trials,
        min_step=_whole(raw.get("minStep", 1), "earlyStopping.minStep", 1, 10**12),
        reduction_factor=_whole(raw.get("reductionFactor", 3), "earlyStopping.reductionFactor", 2, 100),
    )


def _draw(p: Parameter, rng: random.Random) -> Value:
    if isinstance(p, Choice):
        return p.values[rng.randrange(len(p.values))]
    if p.log:
        return math.exp(rng.uniform(math.log(p.low), math.log(p.high)))
    return rng.uniform(p.low, p.high)


def expand(spec: SweepSpec) -> list[dict[str, Value]]:
    """Every trial's values, in trial order: the grid's combinations, or `trials` seeded draws."""
    names = [name for name, _ in spec.parameters]
    if spec.search is Search.GRID:
        lists = [p.values for _, p in spec.parameters if isinstance(p, Choice)]
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*lists)]
    rng = random.Random(spec.seed)
    return [{name: _draw(p, rng) for name, p in spec.parameters} for _ in range(spec.trials)]


def value_text(value: Value) -> str:
    """A value as the trial's environment holds it: `true`, `3`, `0.001`, the string itself."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def trial_env(sweep: str, trial: int, values: Mapping[str, Value]) -> dict[str, str]:
    env = {SWEEP_ENV: sweep, TRIAL_ENV: str(trial)}
    env |= {PARAM_ENV_PREFIX + name.upper(): value_text(v) for name, v in values.items()}
    return env


def params_json(values: Mapping[str, Value]) -> str:
    """The trial's values as the file in its pods holds them (JSON, keys as written)."""
    return json.dumps(dict(values), separators=(",", ":"))


# ---- the metric a trial prints, and the ranking


def metric_lines(lines: Iterable[str], name: str) -> Iterable[tuple[float, int | None]]:
    """Each `gpufed-metric: NAME=VALUE [step=N]` line for `name`, as (value, step or None). A line
    whose value is not a finite number is skipped (a trial's `nan` loss ranks nowhere)."""
    for line in lines:
        at = line.find(METRIC_PREFIX)
        if at < 0:
            continue
        match = _METRIC_LINE.match(line[at:].rstrip("\r"))
        if match is None or match.group(1) != name:
            continue
        try:
            value = float(match.group(2))
        except ValueError:
            continue
        if math.isfinite(value):
            yield value, None if match.group(3) is None else int(match.group(3))


def parse_metric(lines: Iterable[str], name: str) -> float | None:
    """The value of the last `gpufed-metric: NAME=VALUE` line for `name` (with a step or without);
    None when there is none."""
    found: float | None = None
    for value, _ in metric_lines(lines, name):
        found = value
    return found


def history(lines: Iterable[str], name: str) -> dict[int, float]:
    """The intermediate values a trial printed with a step (`... step=N`), the last one per step."""
    return {step: value for value, step in metric_lines(lines, name) if step is not None}


def file_metric(text: str, name: str) -> float | None:
    """The metric from the text of a trial's metric file (its termination message): the value of the
    last `NAME=VALUE [step=N]` line for `name`, the printed syntax without its `gpufed-metric:` prefix
    (which may be there too); None when there is none. A value that is not a finite number is
    skipped, as in a printed line."""
    lines = (
        line if line.lstrip().startswith(METRIC_PREFIX) else f"{METRIC_PREFIX} {line.strip()}"
        for line in text.splitlines()
    )
    return parse_metric(lines, name)


@dataclass(frozen=True, slots=True)
class Trial:
    key: str
    number: int
    values: dict[str, Value]
    metric: float | None


def ranked(trials: Sequence[Trial], goal: Goal) -> list[Trial]:
    """Best first by the metric; trials without one last, each group in trial order."""
    with_metric = [t for t in trials if t.metric is not None]
    without = [t for t in trials if t.metric is None]
    sign = 1.0 if goal is Goal.MINIMIZE else -1.0
    with_metric.sort(key=lambda t: (sign * (t.metric or 0.0), t.number))
    return [*with_metric, *sorted(without, key=lambda t: t.number)]
