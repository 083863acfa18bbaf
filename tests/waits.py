"""Waiting without hoping, for any tier: poll a condition until a deadline, or move a clock.

`until` polls a condition on the event loop and fails naming what it waited for; `LoopClock` moves the
running loop's own clock forward, so that the loop's timers (`asyncio.sleep`, `asyncio.timeout`,
`call_at`) fire as if that much time had passed, at once. The `loop_clock` fixture
(tests/unit/conftest.py) installs one on the test's loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import IO


class LoopClock:
    """The running event loop's clock, moved forward by the test: for the waits that the code under
    test measures on the loop (a pool's request deadline, a keepalive interval, a watch's patience, a
    cache's backoff).

    Only ever forward, and never put back: moving the loop's time backwards would hold every timer
    already scheduled for that much longer. The loop is the test's own (function scope)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._real_time = loop.time
        self.skew_s = 0.0
        loop.time = self.time  # type: ignore[method-assign]

    def time(self) -> float:
        return self._real_time() + self.skew_s

    def advance(self, seconds: float) -> None:
        self.skew_s += seconds


async def until(condition: Callable[[], bool], what: str, *, timeout_s: float = 10.0) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout_s` of wall time (generous:
    a passing test waits only as long as the condition takes)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting until {what}"
        await asyncio.sleep(0.001)


def collect_lines(stream: IO[str]) -> list[str]:
    """Every line `stream` yields, appended by a daemon thread as it arrives, so a test can poll."""
    lines: list[str] = []

    def read() -> None:
        for line in stream:
            lines.append(line)

    threading.Thread(target=read, name="collect-lines", daemon=True).start()
    return lines
