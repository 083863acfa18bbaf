"""Transfer progress as values: what the API and CLI show while a sync runs (bytes, objects, rate, ETA).

Totals cover the whole version, with objects already up to date counted as done from the start, so a
resumed sync shows where it really is. What this run did is counted apart by how it got there, because
each costs something different: `bytes_transferred` passed through this process to the target (egress on
a paid route), `bytes_server_copied` were copied inside the target's endpoint from the source (no egress),
`bytes_reused` came from a copy of another version already in the target store (no egress), and
`bytes_resumed` are parts a killed run had already uploaded (nothing moved now). The rate is
`bytes_transferred / elapsed_s` of this run only: reused and resumed bytes never inflate it.
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
    # What this run did, by kind (see the module docstring). Objects are counted once verified.
    objects_up_to_date: int = 0
    objects_copied: int = 0
    objects_reused: int = 0
    objects_failed: int = 0
    bytes_transferred: int = 0
    bytes_server_copied: int = 0
    bytes_reused: int = 0
    bytes_resumed: int = 0

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
        self.bytes_done = bytes_done
        self.objects_done = objects_done
        self.objects_up_to_date = objects_done
        self.objects_copied = 0
        self.objects_reused = 0
        self.objects_failed = 0
        self.bytes_transferred = 0
        self.bytes_server_copied = 0
        self.bytes_reused = 0
        self.bytes_resumed = 0
        self._clock = clock
        self._started = clock()

    def add_bytes(self, n: int) -> None:
        """Bytes sent through this process to the target (a PUT or a part)."""
        self.bytes_done += n
        self.bytes_transferred += n

    def add_server_copied(self, n: int) -> None:
        self.bytes_done += n
        self.bytes_server_copied += n

    def add_reused(self, n: int) -> None:
        self.bytes_done += n
        self.bytes_reused += n

    def add_resumed(self, n: int) -> None:
        self.bytes_done += n
        self.bytes_resumed += n

    def object_done(self, *, reused: bool = False) -> None:
        self.objects_done += 1
        if reused:
            self.objects_reused += 1
        else:
            self.objects_copied += 1

    def object_failed(self) -> None:
        self.objects_failed += 1

    def snapshot(self, *, finished: bool = False) -> SyncProgress:
        elapsed = max(self._clock() - self._started, 1e-9)
        rate = self.bytes_transferred / elapsed
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
            objects_up_to_date=self.objects_up_to_date,
            objects_copied=self.objects_copied,
            objects_reused=self.objects_reused,
            objects_failed=self.objects_failed,
            bytes_transferred=self.bytes_transferred,
            bytes_server_copied=self.bytes_server_copied,
            bytes_reused=self.bytes_reused,
            bytes_resumed=self.bytes_resumed,
        )
