"""Simulated time: what "now" is for the kubelet and the controllers, and how long to sleep for it.

Everything in the simulator reads time from a `Clock`, never from `time` directly, so that a test
can drive a cluster on a manual clock and a benchmark can run one ten times faster than real time
(`time_scale`) while pod durations, deadlines and timestamps stay consistent with each other.
"""

from __future__ import annotations

import functools
import math
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float:
        """Simulated monotonic seconds."""
        ...

    def wall_s(self) -> float:
        """Simulated seconds since the epoch, for timestamps on objects."""
        ...

    def real_delay_s(self, sim_delay_s: float) -> float:
        """How long to really sleep for `sim_delay_s` of simulated time to pass."""
        ...


class ScaledClock:
    """Real time sped up by `time_scale`: with 10, a 60 s pod finishes after 6 real seconds."""

    def __init__(self, time_scale: float = 1.0, wall0_s: float | None = None) -> None:
        """`wall0_s`: the simulated wall time now (default: the real one), for a cluster restored from
        a snapshot whose simulated time ran ahead of the real one."""
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.time_scale = time_scale
        self._mono0 = time.monotonic()
        self._wall0 = time.time() if wall0_s is None else wall0_s

    def now_s(self) -> float:
        return (time.monotonic() - self._mono0) * self.time_scale

    def wall_s(self) -> float:
        return self._wall0 + self.now_s()

    def real_delay_s(self, sim_delay_s: float) -> float:
        return max(0.0, sim_delay_s / self.time_scale)


class ManualClock:
    """Time that moves only when a test says so; timers never fire on their own."""

    def __init__(self, start_s: float = 0.0, wall0_s: float = 1_700_000_000.0) -> None:
        self._now_s = start_s
        self._wall0_s = wall0_s

    def advance(self, seconds: float) -> None:
        self._now_s += seconds

    def now_s(self) -> float:
        return self._now_s

    def wall_s(self) -> float:
        return self._wall0_s + self._now_s

    def real_delay_s(self, sim_delay_s: float) -> float:
        return math.inf


def rfc3339(wall_s: float) -> str:
    return _rfc3339_second(int(wall_s))


@functools.lru_cache(maxsize=256)
def _rfc3339_second(second: int) -> str:
    # Thousands of objects are stamped within the same second; formatting once per second is enough.
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(wall_s: float) -> str:
    return datetime.fromtimestamp(wall_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
