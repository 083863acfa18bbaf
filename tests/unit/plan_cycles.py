"""Sequences of scheduling cycles, for the proof that the placer's speed-ups change no plan.

Each sequence is what a server or a replay hands the placer cycle after cycle: `(snapshot, now)`
pairs where the next snapshot follows from the last plan (admitted gangs hold their nodes, victims
and ended gangs are gone, new gangs arrive, time moves). `plan_bytes` (`bench.placer_scenario`) is a
plan as bytes, every field in order (the admissions' explanations, every waiting reason worded, the
bursts), so "the same plan" means the same bytes, not equal under some fields' `compare=False`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import placement
from bench.placer_scenario import NOW, advance, build, digest, plan_bytes
from placement.model import Plan, Snapshot

__all__ = ["GOLDEN", "WEEK", "bench_cycles", "digest", "plan_bytes", "recorded", "replay_cycles"]

Cycle = tuple[Snapshot, float]

ROOT = Path(__file__).resolve().parents[2]
WEEK = ROOT.parent / "shared" / "data" / "traces" / "philly_week_2017-10-16.csv.gz"
DATA = Path(__file__).resolve().parent / "data"
GOLDEN = DATA / "placer_cycles_golden.json"
# For the checks that patch the placer's functions: compiled modules call each other directly, so in
# a process that runs the mypyc build (placement/_compiled.py) a patch would compare the placer with
# itself. `make test` and `make check` run them on the sources (`make test-interpreted`).
patches_sources = pytest.mark.skipif(
    placement.COMPILED,
    reason="patches reach only the interpreted placer: make test-interpreted runs this "
    "(GPUFED_PLACEMENT_COMPILED=0)",
)


def bench_cycles(
    gangs: int, cycles: int, plan: Callable[[Snapshot, float], Plan], *, seed: int = 1, churn: int = 20
) -> Iterator[tuple[Snapshot, float, Plan]]:
    """The benchmark's federation, cycle after cycle, each next snapshot following `plan`'s plan."""
    snapshot, now, rng = build(gangs=gangs), NOW, random.Random(seed)
    for _ in range(cycles):
        decided = plan(snapshot, now)
        yield snapshot, now, decided
        snapshot, now = advance(snapshot, decided, now, rng, churn=churn)


def replay_cycles(limit_jobs: int, policy_name: str = "gpufed", size: float = 1.0) -> list[Cycle]:
    """The cycles a replay of the first `limit_jobs` jobs of a Philly week plans, as it planned them."""
    import dataclasses

    from federation.replay import sim
    from federation.replay.config import load_config
    from federation.replay.policies import policies
    from federation.replay.sweep import load_inputs, world_for

    config = dataclasses.replace(load_config(DATA / "placer_cycles_replay.yaml"), limit_jobs=limit_jobs)
    (policy,) = [p for p in policies(config) if p.name == policy_name]
    inputs = load_inputs(config)
    world = world_for(config, inputs, size)
    seen: list[Cycle] = []
    original: Callable[..., Plan] = getattr(sim, "plan")  # noqa: B009 (the module's own name, patched below)

    def recording(snapshot: Snapshot, *, now: float) -> Plan:
        seen.append((snapshot, now))
        return original(snapshot, now=now)

    setattr(sim, "plan", recording)  # noqa: B010 (as above)
    try:
        sim.simulate(config, world, policy, inputs.jobs)
    finally:
        setattr(sim, "plan", original)  # noqa: B010
    return seen


def recorded(plan: Callable[[Snapshot, float], Plan]) -> dict[str, list[str]]:
    """The digests `GOLDEN` holds, made with `plan`: what `python -m tests.unit.plan_cycles` writes."""
    digests = {
        "bench_3000x8": [digest(p) for _, _, p in bench_cycles(3000, 8, plan)],
        "bench_10000x4": [digest(p) for _, _, p in bench_cycles(10_000, 4, plan)],
    }
    for policy in ("gpufed", "burst_now"):
        digests[f"replay_{policy}_250"] = [digest(plan(s, now)) for s, now in replay_cycles(250, policy)]
    return digests


if __name__ == "__main__":
    # Only for a change that means to plan differently (say so in its commit): the digests of today's
    # placer, every gang decided afresh.
    import json

    from placement.plan import _plan

    GOLDEN.write_text(json.dumps(recorded(lambda s, now: _plan(s, now, reuse=False)), indent=1) + "\n")
