"""The server freezes its long-lived heap as the job cache grows, so that full collections do not
walk it while calls wait (`federation.runtime.heap`)."""

from __future__ import annotations

import gc
import weakref

import pytest

from federation.runtime.heap import HeapFreezer, Policy, Step, next_step


class _Node:
    other: object = None


POLICY = Policy(grow_jobs=100, max_age_s=60.0, refresh_s=600.0)


@pytest.mark.parametrize(
    ("jobs", "frozen", "since_freeze", "since_refresh", "step"),
    [
        (50, 0, 10.0, 10.0, Step.NOTHING),  # grown too little, too soon
        (100, 0, 10.0, 10.0, Step.FREEZE),  # grown by enough
        (150, 100, 61.0, 61.0, Step.FREEZE),  # old enough, and something changed
        (100, 100, 61.0, 61.0, Step.NOTHING),  # old, but the same size: nothing new to freeze
        (100, 100, 10.0, 600.0, Step.REFRESH),  # time to let a cycle's garbage go
        (10_000, 0, 0.0, 600.0, Step.REFRESH),  # a refresh freezes too
    ],
)
def test_the_next_step(jobs: int, frozen: int, since_freeze: float, since_refresh: float, step: Step) -> None:
    got = next_step(
        POLICY, jobs=jobs, frozen_jobs=frozen, since_freeze_s=since_freeze, since_refresh_s=since_refresh
    )
    assert got is step


def test_a_freeze_collects_first_and_a_refresh_unfreezes() -> None:
    now = [0.0]
    freezer = HeapFreezer(POLICY, clock=lambda: now[0])
    try:
        # Garbage in a cycle before the freeze is collected, not frozen for ever.
        cyclic = _Node()
        cyclic.other = cyclic
        gone = weakref.ref(cyclic)
        del cyclic
        assert freezer.tick(jobs=150) is Step.FREEZE
        assert gone() is None
        frozen = gc.get_freeze_count()
        assert frozen > 0
        assert freezer.tick(jobs=160) is Step.NOTHING  # 10 more jobs: not yet
        now[0] = 600.0
        assert freezer.tick(jobs=160) is Step.REFRESH
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
