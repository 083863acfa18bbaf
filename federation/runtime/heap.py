"""Keeping the garbage collector's full passes off the API's latency.

A server with a deep queue holds hundreds of thousands of long-lived objects (job records, their
specs, the placer's requests). CPython's full collection walks every one of them while holding the
GIL: 40 ms and more at 20,000 queued jobs, during which no call is answered. The scheduling cycle
allocates enough (every waiting job's wait, every cycle) to set one off every few seconds; that, not
the cycle's own work, was the tail of another tenant's ListJobs beside a deep queue (issue 30,
item 15: a thread sleeping 0.2 ms woke up to 44 ms late beside a cycle, 3 ms with the heap frozen).

So the server freezes its heap (`gc.freeze`: the objects alive now move to a generation no
collection walks) once a full collection has made sure nothing unreachable is among them, whenever
the job cache has grown by `grow_jobs` since the last freeze or `max_age_s` has passed. A frozen
object that later becomes garbage is still freed by reference counting; only one caught in a cycle
stays until the next refresh, which unfreezes and collects everything every `refresh_s`. Each freeze
and refresh is one full collection, the pause this avoids, taken once per thousands of jobs instead
of every few seconds.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Final

import structlog

log = structlog.get_logger("gpufed.heap")

GROW_JOBS: Final = 5_000
MAX_AGE_S: Final = 600.0
REFRESH_S: Final = 3_600.0


class Step(Enum):
    NOTHING = "nothing"
    FREEZE = "freeze"  # collect what is unreachable, then freeze what is alive
    REFRESH = "refresh"  # unfreeze, collect everything, freeze again


@dataclass(frozen=True, slots=True)
class Policy:
    grow_jobs: int = GROW_JOBS
    max_age_s: float = MAX_AGE_S
    refresh_s: float = REFRESH_S


def next_step(
    policy: Policy, *, jobs: int, frozen_jobs: int, since_freeze_s: float, since_refresh_s: float
) -> Step:
    """What to do now (pure). `frozen_jobs`: the job cache's size at the last freeze."""
    if since_refresh_s >= policy.refresh_s:
        return Step.REFRESH
    if jobs - frozen_jobs >= policy.grow_jobs or (since_freeze_s >= policy.max_age_s and jobs != frozen_jobs):
        return Step.FREEZE
    return Step.NOTHING


class HeapFreezer:
    """Called every few seconds by the server with its job cache's size."""

    def __init__(self, policy: Policy = Policy(), clock: Callable[[], float] = time.monotonic) -> None:
        self._policy = policy
        self._clock = clock
        now = clock()
        self._frozen_jobs = 0
        self._frozen_at = now
        self._refreshed_at = now

    def tick(self, jobs: int) -> Step:
        now = self._clock()
        step = next_step(
            self._policy,
            jobs=jobs,
            frozen_jobs=self._frozen_jobs,
            since_freeze_s=now - self._frozen_at,
            since_refresh_s=now - self._refreshed_at,
        )
        if step is Step.NOTHING:
            return step
        started = time.perf_counter()
        if step is Step.REFRESH:
            gc.unfreeze()
            self._refreshed_at = now
        gc.collect()
        gc.freeze()
        self._frozen_jobs, self._frozen_at = jobs, now
        log.info(
            "heap_frozen",
            step=step.value,
            jobs=jobs,
            frozen_objects=gc.get_freeze_count(),
            pause_ms=round((time.perf_counter() - started) * 1e3, 1),
        )
        return step
