"""Per-tenant limits on submissions: a token bucket per tenant, per server.

One team's runaway script must not crowd out other teams' submissions or flood etcd. Each server
keeps its own buckets (no coordination on the hot path), so with N servers a tenant's ceiling is N
times its configured rate; the limit is a guard against floods, not an exact quota.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from federation.errors import RateLimited


class SubmitRateLimiter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # tenant -> (tokens, last refill time, rate, burst)
        self._buckets: dict[str, tuple[float, float, float, int]] = {}

    def admit(self, tenant: str, rate_per_s: float | None, burst: int | None) -> None:
        """Take one submission from the tenant's bucket, or raise RateLimited saying when to retry."""
        if rate_per_s is None or rate_per_s <= 0:
            return
        capacity = burst if burst is not None and burst > 0 else max(1, int(rate_per_s * 2))
        now = self._clock()
        tokens, last, old_rate, old_capacity = self._buckets.get(
            tenant, (float(capacity), now, rate_per_s, capacity)
        )
        if (old_rate, old_capacity) != (rate_per_s, capacity):
            # The admin changed the limit: keep what was saved, within the new burst.
            tokens = min(tokens, float(capacity))
        tokens = min(float(capacity), tokens + (now - last) * rate_per_s)
        if tokens < 1.0:
            self._buckets[tenant] = (tokens, now, rate_per_s, capacity)
            raise RateLimited(
                f"tenant {tenant} submits faster than its limit of {rate_per_s:g}/s (burst {capacity}); "
                f"retry in {retry_after_s((1.0 - tokens) / rate_per_s):.2f}s"
            )
        self._buckets[tenant] = (tokens - 1.0, now, rate_per_s, capacity)

    def refund(self, tenant: str) -> None:
        """Give back the submission `admit` took for a call that created nothing (a retry of an
        idempotency key already accepted): a retry is not a new submission."""
        bucket = self._buckets.get(tenant)
        if bucket is not None:
            tokens, last, rate, capacity = bucket
            self._buckets[tenant] = (min(float(capacity), tokens + 1.0), last, rate, capacity)


def retry_after_s(wait_s: float) -> float:
    """The wait a refusal tells, rounded up to the hundredth it is shown with: a client that waits
    what it read is admitted (never 'retry in 0.00s', which a client would retry at once)."""
    return max(0.01, math.ceil(wait_s * 100 - 1e-9) / 100)


# Reads one caller may make per second on one server, and at once: lists, watches, and job lookups
# that miss the cache and so read etcd (a lookup the cache answers costs next to nothing). Generous
# for people and scripts; a loop that lists as fast as it can is held to it instead of taking the server.
READ_RATE_PER_S = 100.0
READ_BURST = 200
# Above this many buckets, full ones (callers idle long enough to have refilled) are forgotten.
_MAX_BUCKETS = 10_000


class TokenBuckets:
    """One token bucket per key, all with the same rate and burst."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate_per_s = rate_per_s
        self.burst = max(1, burst)
        self._clock = clock
        # key -> (tokens, last refill time)
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, key: str) -> float | None:
        """Take one token from `key`'s bucket: None when taken, else the seconds until one is there."""
        now = self._clock()
        tokens, last = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - last) * self.rate_per_s)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return retry_after_s((1.0 - tokens) / self.rate_per_s)
        if key not in self._buckets and len(self._buckets) >= _MAX_BUCKETS:
            self._forget_full(now)
        self._buckets[key] = (tokens - 1.0, now)
        return None

    def wait_s(self, key: str) -> float | None:
        """Like `take` without taking: None when a token is there now."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return None
        tokens = min(float(self.burst), bucket[0] + (self._clock() - bucket[1]) * self.rate_per_s)
        return None if tokens >= 1.0 else retry_after_s((1.0 - tokens) / self.rate_per_s)

    def _forget_full(self, now: float) -> None:
        full = [
            k for k, (t, last) in self._buckets.items() if t + (now - last) * self.rate_per_s >= self.burst
        ]
        for key in full:
            del self._buckets[key]
        if len(self._buckets) >= _MAX_BUCKETS:
            # Every caller is busy: forgetting some only gives them a fresh burst.
            self._buckets.clear()


class ReadRateLimiter:
    """Per-caller limits on reads: one caller's polling loop must not slow everyone's reads."""

    def __init__(
        self,
        rate_per_s: float | None = READ_RATE_PER_S,
        burst: int = READ_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # None or 0: no limit (a benchmark measuring the cost of reads, not the limit).
        self._buckets = None if not rate_per_s or rate_per_s <= 0 else TokenBuckets(rate_per_s, burst, clock)

    def admit(self, caller: str) -> None:
        """Take one read from the caller's bucket, or raise RateLimited saying when to retry."""
        if self._buckets is None:
            return
        wait_s = self._buckets.take(caller)
        if wait_s is not None:
            raise RateLimited(
                f"{caller} reads faster than the limit of {self._buckets.rate_per_s:g}/s "
                f"(burst {self._buckets.burst}); retry in {wait_s:.2f}s"
            )
