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

What the server holds at its start (its imports, the clients of every member cluster, its config:
about 215,000 objects at 100 clusters) is frozen at the first look, not after `grow_jobs` jobs or
`max_age_s`: every full collection walked it, and a new leader's first 5,000 jobs or ten minutes
met several. And the collector runs less often than CPython's defaults (700 new objects a young
collection, a full one every 10th middle one, `GC_THRESHOLDS`): the server makes and drops objects
by the thousand a second (watch events, records, calls), nearly all freed by reference counting, and
at 100 clusters the collector took 3.0 s of the server's CPU over 4,000 jobs, 13 % of it (bench/scale.py,
2026-12-01: 1,532 young, 139 middle and 13 full collections, the full ones 175 ms each); with both,
0.9 s. A cycle of garbage stays a little longer (until 10,000 objects are made, or the full
collection after 100 middle ones), and the freezer's own full collections are as before.
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
# `gc.set_threshold`'s three: new objects between young collections, young collections between
# middle ones, middle ones between full ones (CPython's defaults: 700, 10, 10).
GC_THRESHOLDS: Final = (10_000, 10, 100)
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


def tune_collector() -> None:
    """The collector's thresholds for a server (`GC_THRESHOLDS`), set once at its start."""
    gc.set_threshold(*GC_THRESHOLDS)


def next_step(
    policy: Policy,
    *,
    jobs: int,
    frozen_jobs: int,
    since_freeze_s: float,
    since_refresh_s: float,
    frozen_once: bool = True,
) -> Step:
    """What to do now (pure). `frozen_jobs`: the job cache's size at the last freeze; `frozen_once`:
    whether there was one (the first look freezes what the server made at its start)."""
    if since_refresh_s >= policy.refresh_s:
        return Step.REFRESH
    if not frozen_once:
        return Step.FREEZE
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
        self._frozen_once = False
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
            frozen_once=self._frozen_once,
        )
        if step is Step.NOTHING:
            return step
        started = time.perf_counter()
        if step is Step.REFRESH:
            gc.unfreeze()
            self._refreshed_at = now
        gc.collect()
        gc.freeze()
        self._frozen_jobs, self._frozen_at, self._frozen_once = jobs, now, True
        log.info(
            "heap_frozen",
            step=step.value,
            jobs=jobs,
            frozen_objects=gc.get_freeze_count(),
            pause_ms=round((time.perf_counter() - started) * 1e3, 1),
        )
        return step
