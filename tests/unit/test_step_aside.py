"""The scheduling cycle's worker thread steps aside while API calls are in flight, only while it has
slept less than it has worked (`federation.scheduling.yielding`). Its effect on latency is measured
by bench/listjobs_queue.py; these check the rule on a manual clock."""

from __future__ import annotations

import pytest

from federation.metrics import Metrics
from federation.scheduling.yielding import PAUSE_S, StepAside


class Clock:
    """A manual clock; a sleep takes `stretch` if set (a busy host oversleeps), else what was asked."""

    def __init__(self, stretch: float | None = None) -> None:
        self.now = 100.0
        self.sleeps = 0
        self.stretch = stretch

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds if self.stretch is None else self.stretch


def _step(calls: int, stretch: float | None = None) -> tuple[StepAside, Clock]:
    metrics = Metrics()
    metrics.calls_in_flight = calls
    clock = Clock(stretch)
    return StepAside(metrics, clock=clock, sleep=clock.sleep), clock


def test_no_call_in_flight_no_pause() -> None:
    step, clock = _step(calls=0)
    clock.now += 0.005
    for _ in range(50):
        step()
    assert (step.slept_s, clock.sleeps) == (0.0, 0)


def test_a_call_in_flight_gets_a_pause_after_work() -> None:
    step, clock = _step(calls=1)
    clock.now += 0.005
    step()
    assert clock.sleeps == 1
    assert step.slept_s == pytest.approx(PAUSE_S)


def test_under_a_flood_of_calls_it_sleeps_only_while_it_has_worked_longer() -> None:
    """Work 0.2 ms between checks: the cycle sleeps about half the time, never much more."""
    step, clock = _step(calls=3)
    started = clock.now
    for _ in range(1_000):
        clock.now += 0.0002
        step()
    elapsed = clock.now - started
    worked = elapsed - step.slept_s
    # A pause starts only while less was slept than worked: it may end one pause past that.
    assert worked - PAUSE_S - 0.0002 <= step.slept_s <= worked + PAUSE_S
    assert clock.sleeps > 100


def test_an_oversleep_is_paid_back_by_work_before_the_next_pause() -> None:
    """A pause the host stretched counts whole: no pause until work catches up with it."""
    step, clock = _step(calls=1, stretch=0.02)
    clock.now += 0.001
    step()
    assert abs(step.slept_s - 0.02) < 1e-9
    for _ in range(10):
        clock.now += 0.001
        step()
    assert clock.sleeps == 1  # 11 ms of work since the start: still less than the 20 ms slept
    for _ in range(10):
        clock.now += 0.001
        step()
    assert clock.sleeps == 2  # 21 ms worked: the next pause


def test_the_gauge_reads_the_calls_in_flight() -> None:
    metrics = Metrics()
    metrics.calls_in_flight = 2
    assert metrics.registry.get_sample_value("gpufed_api_calls_in_flight") == 2.0
