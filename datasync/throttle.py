"""Pacing for transfers: a token bucket for the bandwidth cap, a byte budget for memory, and retries
with exponential backoff.

The bucket's arithmetic (`reserve`) is pure, with time as an argument, so unit tests check it without
sleeping. A request larger than the burst is let through by going into debt, so that a 16 MiB part under
a 1 MiB/s cap waits 16 s rather than forever, and the long-run rate still holds.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import structlog

from datasync.errors import DatasyncError

_log = structlog.get_logger(__name__)
T = TypeVar("T")


class TokenBucket:
    """`rate_bytes_per_s` sustained, up to `burst_bytes` at once after a pause."""

    def __init__(
        self,
        rate_bytes_per_s: float,
        burst_bytes: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rate_bytes_per_s <= 0:
            raise ValueError("rate_bytes_per_s must be positive")
        self.rate_bytes_per_s = rate_bytes_per_s
        self.burst_bytes = burst_bytes if burst_bytes is not None else rate_bytes_per_s
        self._tokens = self.burst_bytes
        self._clock = clock
        self._sleep = sleep
        self._updated: float | None = None

    def reserve(self, size_bytes: int, now: float) -> float:
        """Take `size_bytes` of tokens at time `now`; returns how long the caller must wait first."""
        if self._updated is not None:
            self._tokens = min(self.burst_bytes, self._tokens + (now - self._updated) * self.rate_bytes_per_s)
        self._updated = now
        self._tokens -= size_bytes
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate_bytes_per_s

    async def acquire(self, size_bytes: int) -> None:
        wait_s = self.reserve(size_bytes, self._clock())
        if wait_s > 0:
            await self._sleep(wait_s)


class ByteBudget:
    """At most `capacity_bytes` held at once by the copies in flight; the rest wait, first come first
    served. A request larger than the capacity costs the whole capacity (it then runs alone) rather
    than waiting forever. `release` is synchronous, so a `finally` or a cancelled task can call it."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = max(1, capacity_bytes)
        self.held_bytes = 0
        # The most ever held at once: what tests and the benchmark hold against the capacity.
        self.peak_bytes = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def cost_of(self, size_bytes: int) -> int:
        return min(max(size_bytes, 0), self.capacity_bytes)

    def try_acquire(self, size_bytes: int) -> int | None:
        """Take `size_bytes` (cut to the capacity) only if they fit now and nobody is waiting; the
        cost to release, or None. For reading ahead, which must never wait while holding bytes."""
        cost = self.cost_of(size_bytes)
        if self._waiters or self.held_bytes + cost > self.capacity_bytes:
            return None
        self._hold(cost)
        return cost

    def _hold(self, cost: int) -> None:
        self.held_bytes += cost
        self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    async def acquire(self, size_bytes: int) -> int:
        """Wait until `size_bytes` (cut to the capacity) fit; returns the cost to hand to `release`."""
        cost = self.cost_of(size_bytes)
        if not self._waiters and self.held_bytes + cost <= self.capacity_bytes:
            self._hold(cost)
            return cost
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((cost, granted))
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():
                self.release(cost)  # granted just as the waiter was cancelled: hand it on
            else:
                self._waiters = deque(w for w in self._waiters if w[1] is not granted)
                self._grant()
            raise
        return cost

    def release(self, cost: int) -> None:
        self.held_bytes -= cost
        self._grant()

    def _grant(self) -> None:
        while self._waiters:
            cost, granted = self._waiters[0]
            if granted.cancelled():
                self._waiters.popleft()
                continue
            if self.held_bytes + cost > self.capacity_bytes:
                return
            self._waiters.popleft()
            self._hold(cost)
            granted.set_result(None)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 5
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    multiplier: float = 2.0

    def backoff_s(self, attempt: int, rng: random.Random) -> float:
        """The wait before attempt `attempt + 1`: exponential, capped, with jitter in [50%, 100%]."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))
        return base * (0.5 + 0.5 * rng.random())


class Retrier:
    """Runs a call again on retryable `DatasyncError`s; a permanent one, or the last failure, is raised."""

    def __init__(
        self,
        policy: RetryPolicy,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        seed: int | None = None,
    ) -> None:
        self.policy = policy
        self._sleep = sleep
        self._rng = random.Random(seed)
        self.retries = 0

    async def __call__(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        attempt = 1
        while True:
            try:
                return await call()
            except DatasyncError as e:
                if not e.retryable or attempt >= self.policy.max_attempts:
                    raise
                wait_s = self.policy.backoff_s(attempt, self._rng)
                self.retries += 1
                _log.warning(
                    "transfer_retried", what=what, attempt=attempt, wait_s=round(wait_s, 3), error=str(e)
                )
                await self._sleep(wait_s)
                attempt += 1
