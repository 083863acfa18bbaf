"""Transfer progress as values: what the API and CLI show while a sync runs (bytes, objects, rate, ETA).

Totals cover the whole version, with objects already up to date counted as done from the start, so a
resumed sync shows where it really is. The rate counts only bytes moved in this run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SyncProgress:
    bytes_done: int
    bytes_total: int
    objects_done: int
    objects_total: int
    rate_bytes_per_s: float
    eta_s: float | None
    elapsed_s: float
    finished: bool = False

    @property
    def fraction(self) -> float:
        return 1.0 if self.bytes_total == 0 else self.bytes_done / self.bytes_total


ProgressCallback = Callable[[SyncProgress], None]


class ProgressTracker:
    """Counters the transfers bump; `snapshot()` turns them into a `SyncProgress`."""

    def __init__(
        self,
        bytes_total: int,
        objects_total: int,
        bytes_done: int = 0,
        objects_done: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bytes_total = bytes_total
        self.objects_total = objects_total
        self._bytes_at_start = bytes_done
        self.bytes_done = bytes_done
        self.objects_done = objects_done
        self._clock = clock
        self._started = clock()

    def add_bytes(self, n: int) -> None:
        self.bytes_done += n

    def object_done(self) -> None:
        self.objects_done += 1

    def snapshot(self, *, finished: bool = False) -> SyncProgress:
        elapsed = max(self._clock() - self._started, 1e-9)
        moved = self.bytes_done - self._bytes_at_start
        rate = moved / elapsed
        left = max(self.bytes_total - self.bytes_done, 0)
        eta = 0.0 if left == 0 else (left / rate if rate > 0 else None)
        return SyncProgress(
            bytes_done=self.bytes_done,
            bytes_total=self.bytes_total,
            objects_done=self.objects_done,
            objects_total=self.objects_total,
            rate_bytes_per_s=rate,
            eta_s=eta,
            elapsed_s=elapsed,
            finished=finished,
        )
