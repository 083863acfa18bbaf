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
