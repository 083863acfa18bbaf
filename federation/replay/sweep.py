"""Running every policy at every private size, on one week or several: serially, in a local process
pool, or with Ray.

One unit is one (week, policy, size) replay. A unit reads its inputs itself (the trace and prices load in a
fraction of a second), so units share nothing and any executor can run them; results come back as
`Metrics` rows in the order of the plan, whatever order they finished in.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from federation.replay.config import ReplayConfig
from federation.replay.errors import ReplayError
from federation.replay.metrics import Metrics, summarise
from federation.replay.policies import PolicySpec, policies
from federation.replay.prices import read_prices
from federation.replay.sim import Result, simulate
from federation.replay.trace import (
    TraceJob,
    assign_deadlines,
    assign_gpu_types,
    assign_resumable,
    mean_demand_gpus,
    read_trace,
    sample,
)
from federation.replay.world import World, build_world, demand_by_team

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Inputs:
    jobs: tuple[TraceJob, ...]
    # The mean GPU demand of the whole trace, before sampling.
    mean_demand_gpus: float
    # Of the replayed jobs (after sampling): what one private size of 1.0 means for them.
    sample_fraction: float


def load_inputs(config: ReplayConfig) -> Inputs:
    typed = assign_gpu_types(read_trace(config.trace_path), config.gpu_mix, config.seed)
    every = assign_resumable(assign_deadlines(typed, config.deadlines), config.resumable)
    picked = sample(every, config.limit_jobs, config.every_nth_job)
    demand = mean_demand_gpus(every, config.period_s)
    work = sum(j.num_gpus * j.duration_s for j in every)
    fraction = sum(j.num_gpus * j.duration_s for j in picked) / work if work else 1.0
    return Inputs(tuple(picked), demand, fraction)


def entitled_shares(world: World) -> dict[str, float]:
    """A team's entitlement: its guarantees summed over types (the private-GPU share it is owed)."""
    return {t.tenant: float(sum(q.guaranteed_gpus for q in t.quotas)) for t in world.teams}


def world_for(config: ReplayConfig, inputs: Inputs, size: float) -> World:
    prices = read_prices(config.prices_path, config.placeholder_prices_usd_per_hour)
    # A sample is replayed on a federation scaled down with it, so the load per GPU stays the same.
    target = size * inputs.mean_demand_gpus * inputs.sample_fraction
    return build_world(config, prices, inputs.jobs, target)


def run_one(
    config: ReplayConfig, policy: PolicySpec, size: float, *, record: bool = False
) -> tuple[Metrics, Result]:
    inputs = load_inputs(config)
    world = world_for(config, inputs, size)
    started, started_cpu = time.perf_counter(), time.process_time()
    result = simulate(config, world, policy, inputs.jobs, record=record)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - started_cpu
    metrics = summarise(
        result,
        size,
        entitled_shares(world),
        config.period_s,
        elapsed,
        week=week_name(config.trace_path),
        replay_cpu_s=cpu,
    )
    log.info(
        "replay_finished",
        week=metrics.week,
        policy=policy.name,
        size=size,
        replay_s=round(elapsed, 1),
        replay_cpu_s=round(cpu, 1),
    )
    return metrics, result


def _unit(args: tuple[ReplayConfig, PolicySpec, float]) -> Metrics:
    config, policy, size = args
    return run_one(config, policy, size)[0]


Executor = Callable[[Sequence[tuple[ReplayConfig, PolicySpec, float]]], list[Metrics]]


def serial(units: Sequence[tuple[ReplayConfig, PolicySpec, float]]) -> list[Metrics]:
    return [_unit(u) for u in units]


def process_pool(workers: int) -> Executor:
    def run(units: Sequence[tuple[ReplayConfig, PolicySpec, float]]) -> list[Metrics]:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(_unit, units))

    return run


def ray_executor(num_cpus: int = 2) -> Executor:
    """Ray on loopback only, imported when asked for (it takes seconds and most of a GiB to start)."""

    def run(units: Sequence[tuple[ReplayConfig, PolicySpec, float]]) -> list[Metrics]:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        import ray

        ray.init(num_cpus=num_cpus, include_dashboard=False, ignore_reinit_error=True)
        try:
            remote: Any = ray.remote(_unit)
            return list(ray.get([remote.remote(u) for u in units]))
        finally:
            ray.shutdown()

    return run


def week_name(trace: Path) -> str:
    """`philly_week_2017-10-16.csv.gz` -> `philly_week_2017-10-16`: how tables and figures name a week."""
    name = trace.name
    for suffix in (".gz", ".csv"):
        name = name.removesuffix(suffix)
    return name


def weeks_beside(trace: Path) -> list[Path]:
    """Every trace in the directory of the config's trace (`*.csv`, `*.csv.gz`), in name order."""
    found = sorted({*trace.parent.glob("*.csv"), *trace.parent.glob("*.csv.gz")})
    if not found:
        raise ReplayError(f"{trace.parent}: no traces (*.csv, *.csv.gz)")
    return found


def for_weeks(config: ReplayConfig, traces: Sequence[Path]) -> list[ReplayConfig]:
    """One config per week: the same assumptions, only the trace differs (sizes follow each week's demand)."""
    return [dataclasses.replace(config, trace_path=trace) for trace in traces]


def sweep(config: ReplayConfig, executor: Executor = serial) -> list[Metrics]:
    """Every policy at every private size of the config."""
    return sweep_weeks([config], executor)


def sweep_weeks(configs: Sequence[ReplayConfig], executor: Executor = serial) -> list[Metrics]:
    """Every policy at every private size of every config, in one batch so that workers stay busy."""
    units = [
        (config, policy, size)
        for config in configs
        for size in config.private_sizes
        for policy in policies(config)
    ]
    return executor(units)


__all__ = [
    "Inputs",
    "demand_by_team",
    "for_weeks",
    "load_inputs",
    "run_one",
    "sweep",
    "sweep_weeks",
    "week_name",
    "weeks_beside",
]
