"""Polling with a deadline, for state the cluster reaches asynchronously."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(check: Callable[[], T | None], *, timeout_s: float = 60, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})")
