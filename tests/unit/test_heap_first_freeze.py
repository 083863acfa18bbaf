"""The server freezes what it made at its start at its first look, not after its first 5,000 jobs or
ten minutes, and runs the collector less often than CPython's defaults (`federation.runtime.heap`).

Issue 33: at 100 clusters the collector took 13 % of the server's CPU over a 4,000-job lifecycle,
most of it full collections walking the startup heap."""

from __future__ import annotations

import gc

import pytest

from federation.runtime.heap import GC_THRESHOLDS, HeapFreezer, Policy, Step, next_step, tune_collector

POLICY = Policy(grow_jobs=100, max_age_s=60.0, refresh_s=600.0)


@pytest.mark.parametrize(
    ("jobs", "frozen_once", "step"),
    [
        (0, False, Step.FREEZE),  # the first look: what the server made at its start
        (0, True, Step.NOTHING),  # then by growth and age, as before
        (50, True, Step.NOTHING),
        (100, True, Step.FREEZE),
    ],
)
def test_the_first_look_freezes(jobs: int, frozen_once: bool, step: Step) -> None:
    got = next_step(
        POLICY, jobs=jobs, frozen_jobs=0, since_freeze_s=1.0, since_refresh_s=1.0, frozen_once=frozen_once
    )
    assert got is step


def test_a_new_freezer_freezes_at_its_first_tick_then_waits_for_growth() -> None:
    now = [0.0]
    freezer = HeapFreezer(POLICY, clock=lambda: now[0])
    try:
        assert freezer.tick(jobs=0) is Step.FREEZE
        assert gc.get_freeze_count() > 0
        now[0] = 5.0
        assert freezer.tick(jobs=10) is Step.NOTHING
        assert freezer.tick(jobs=100) is Step.FREEZE
    finally:
        gc.unfreeze()


def test_the_collector_runs_less_often_than_cpythons_defaults() -> None:
    before = gc.get_threshold()
    try:
        tune_collector()
        assert gc.get_threshold() == GC_THRESHOLDS
        young, _, full = GC_THRESHOLDS
        assert young > 700
        assert full > 10
    finally:
        gc.set_threshold(*before)
