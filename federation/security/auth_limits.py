"""The guard in front of token lookups: failed authentications per peer.

Every bearer token the authenticator has not resolved lately costs an etcd read; with no limit, a
client sending random tokens made 772 reads a second. The guard is a token bucket of failed
authentications per peer address (the client's IP, not its port, which changes with each
connection). A peer that has used its burst of failures is answered RESOURCE_EXHAUSTED, with the
time to retry, before its token is looked up; tokens already resolved (the authenticator's cache)
still work from that address, and so do their re-checks once a cache entry has aged out: a flood
that outlasts the cache's TTL does not lock them out.

There is no negative cache of unknown tokens (issue 30). One was here: a token etcd did not know was
refused without a read for 30 s. Only the server that issued a token could clear its entry, so a
token presented to another server (or to this one before bootstrap, or before `user set` created its
user) was refused there for up to 30 s after it became valid, with the same words as a token that
never existed; and each of those refusals was charged to the peer's failures, so a client retrying
it emptied its address's bucket and locked out every other new token from there. The bucket alone
bounds the reads a peer's wrong tokens cost (burst 20, then 2 a second), so the cache saved at most
those and cost correctness: every unknown token is now looked up, within its peer's budget.

Only a failed lookup (etcd answered: no such token) is charged; a lookup etcd did not answer is not a
failure of the caller's and is charged to no one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from federation.errors import RateLimited
from federation.security.ratelimit import TokenBuckets

# Failed authentications a peer may make per second once its burst is used.
FAILED_AUTH_RATE_PER_S = 2.0
FAILED_AUTH_BURST = 20


def peer_address(peer: str) -> str:
    """The client's address without its port: 'ipv4:127.0.0.1:5123' -> 'ipv4:127.0.0.1'."""
    if peer.startswith("ipv6:[") and "]" in peer:
        return peer[: peer.index("]") + 1]
    if peer.startswith("ipv4:"):
        return peer.rpartition(":")[0]
    return peer  # unix sockets and the like: the whole string is the peer


class AuthLimits:
    def __init__(
        self,
        *,
        failures_per_s: float = FAILED_AUTH_RATE_PER_S,
        failure_burst: int = FAILED_AUTH_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._failures = TokenBuckets(failures_per_s, failure_burst, clock)

    def before_lookup(self, peer: str) -> None:
        """Refuse, without a lookup, a peer out of failures."""
        address = peer_address(peer)
        # No peer: an open stream re-checking the token it was opened with, not a new attempt. Its
        # failures are no one's to charge, and must not lock other streams out of their re-checks.
        wait_s = self._failures.wait_s(address) if address else None
        if wait_s is not None:
            raise RateLimited(f"too many failed authentications from {address}; retry in {wait_s:.2f}s")

    def unknown(self, peer: str) -> None:
        """The lookup found no such token: charge the peer a failure."""
        address = peer_address(peer)
        if address:
            self._failures.take(address)
