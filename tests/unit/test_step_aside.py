"""The scheduling cycle's worker thread steps aside while API calls are in flight, for at most as
long as it has worked (`federation.scheduling.yielding`). Its effect on latency is measured by
bench/listjobs_queue.py; these check the rule."""

from __future__ import annotations

import time

from federation.metrics import Metrics
from federation.scheduling.yielding import PAUSE_S, StepAside


def _work(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def test_no_call_in_flight_no_pause() -> None:
    metrics = Metrics()
    step = StepAside(metrics)
    _work(0.005)
    for _ in range(50):
        step()
    assert step.slept_s == 0.0


def test_a_call_in_flight_gets_pauses_after_work() -> None:
    metrics = Metrics()
    metrics.calls_in_flight = 1
    step = StepAside(metrics)
    _work(0.005)
    step()
    assert step.slept_s >= PAUSE_S


def test_it_never_sleeps_longer_than_it_worked() -> None:
    """Under a flood of calls the cycle still gets half the time: each pause comes after as much work."""
    metrics = Metrics()
    metrics.calls_in_flight = 3
    step = StepAside(metrics)
    started = time.perf_counter()
    for _ in range(200):
        step()  # no work in between: after the first pause, the cycle's turn every time
    elapsed = time.perf_counter() - started
    assert step.slept_s <= elapsed - step.slept_s + PAUSE_S * 3
    _work(0.003)
    before = step.slept_s
    step()
    assert step.slept_s > before


def test_the_gauge_reads_the_calls_in_flight() -> None:
    metrics = Metrics()
    metrics.calls_in_flight = 2
    assert metrics.registry.get_sample_value("gpufed_api_calls_in_flight") == 2.0
