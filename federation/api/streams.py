"""Open streams are re-authorized: a revoked token, or a user moved to another tenant or role,
ends the stream within the token cache's TTL, as a new call would be refused.

A unary call is authorized once and is over in milliseconds; a stream (`WatchJobs`) may stay open
for days, and what it was allowed at its start says nothing about now. `StreamGuard.check` resolves
the stream's token again, at most every `RECHECK_S`, and raises Unauthenticated (revoked, expired)
or PermissionDenied (the user's tenant or role changed: the stream's scope was decided for the old
ones) for the servicer to end the stream with.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from federation.errors import PermissionDenied
from federation.security.auth import TOKEN_CACHE_TTL_S, Authenticator, Principal

# Between re-checks; a check trusts a token resolution up to TTL - RECHECK_S old, so a revocation
# ends a stream at most TOKEN_CACHE_TTL_S after it, even when no event flows.
RECHECK_S = 1.0

T = TypeVar("T")


class StreamGuard:
    def __init__(
        self,
        auth: Authenticator,
        metadata: Iterable[tuple[str, str | bytes]] | None,
        who: Principal,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._auth = auth
        self._metadata = tuple(metadata or ())
        self._who = who
        self._clock = clock
        self._checked_at = clock()

    def due_in_s(self) -> float:
        """Seconds until the next re-check is due (0: now)."""
        return max(0.0, self._checked_at + RECHECK_S - self._clock())

    async def check(self, *, force: bool = False) -> None:
        """Re-authorize if due (or forced); raise Unauthenticated or PermissionDenied to end the stream."""
        if not force and self.due_in_s() > 0:
            return
        now = await self._auth.authenticate(self._metadata, max_age_s=TOKEN_CACHE_TTL_S - RECHECK_S)
        self._checked_at = self._clock()
        if (now.user, now.tenant, now.role) != (self._who.user, self._who.tenant, self._who.role):
            raise PermissionDenied(
                f"user {self._who.user} is now {now.role} of tenant {now.tenant} (was {self._who.role} of "
                f"{self._who.tenant}) since this stream began; open it again"
            )


async def next_event(queue: asyncio.Queue[T], guard: StreamGuard) -> T:
    """The queue's next item, re-authorizing on schedule while waiting and once more before handing
    it over, so a stream whose caller lost its rights delivers nothing more, events or not."""
    await guard.check()
    if not queue.empty():
        return queue.get_nowait()
    getter = asyncio.ensure_future(queue.get())
    try:
        while True:
            done, _ = await asyncio.wait((getter,), timeout=max(guard.due_in_s(), 0.01))
            await guard.check()
            if getter in done:
                return getter.result()
    finally:
        if not getter.done():
            getter.cancel()
