"""The scheduling cycle steps aside for API calls.

The cycle's CPU-bound work (snapshot, plan, reasons) runs on a worker thread, and the API's calls on
the event loop, in one process: they take turns on the GIL. With a deep queue, a call that arrived
during a cycle got the GIL only every other switch interval, and ran at half speed for the cycle's
length; with 20,000 of one tenant's jobs queued, another tenant's ListJobs p99 rose by half
(issue 30, item 15). So, between chunks of its work, the cycle sleeps briefly while any call is in
flight, and the event loop runs the call at full speed. What it gives away is bounded: it pauses only
while it has slept less than it has worked, so a cycle under a flood of calls takes about twice as
long at most.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from federation.metrics import Metrics

# Long enough for a typical call to finish (ListJobs of one page: about 1.5 ms of CPU), short enough
# that the cycle resumes soon when calls are few.
PAUSE_S: Final = 0.0005


class StepAside:
    """Called by the cycle's worker thread between chunks of work; one per cycle."""

    def __init__(
        self,
        metrics: Metrics,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self._sleep = sleep
        self._started = clock()
        self._slept = 0.0

    def __call__(self) -> None:
        if not self._metrics.calls_in_flight:
            return
        now = self._clock()
        if self._slept >= now - self._started - self._slept:
            return  # as long asleep as at work: the cycle's turn
        self._sleep(PAUSE_S)
        self._slept += self._clock() - now

    @property
    def slept_s(self) -> float:
        return self._slept
