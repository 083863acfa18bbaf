"""Simulated-time timers for pod durations, deadlines and graceful termination.

Callbacks re-check the world when they fire (is the pod still there, with the same uid, still
running?), so nothing ever needs to cancel a timer: a stale one is a no-op.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from clusters.sim.clock import Clock


class Timers:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def at(self, when_s: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (when_s, next(self._seq), callback))

    def after(self, delay_s: float, callback: Callable[[], None]) -> None:
        self.at(self._clock.now_s() + max(0.0, delay_s), callback)

    def run_due(self) -> bool:
        """Fire every timer whose time has come; True if any fired."""
        now = self._clock.now_s()
        fired = False
        while self._heap and self._heap[0][0] <= now:
            _, _, callback = heapq.heappop(self._heap)
            callback()
            fired = True
        return fired

    def next_delay_s(self) -> float | None:
        """Real seconds until the next timer, or None when there is none."""
        if not self._heap:
            return None
        return self._clock.real_delay_s(self._heap[0][0] - self._clock.now_s())

    def __len__(self) -> int:
        return len(self._heap)
