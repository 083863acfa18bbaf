"""Guards in front of token lookups: failed authentications per peer, and unknown tokens remembered.

Every bearer token the authenticator has not seen lately costs an etcd read; with no limit, a
client sending random tokens made 772 reads a second. Two guards, both in front of that read:

- A token bucket of failed authentications per peer address (the client's IP, not its port, which
  changes with each connection). A peer that has used its burst of failures is answered
  RESOURCE_EXHAUSTED, with the time to retry, before its token is looked up; tokens already
  resolved (the authenticator's cache) still work from that address, and so do their re-checks
  once a cache entry has aged out: a flood that outlasts the cache's TTL does not lock them out.
- A negative cache of token hashes etcd did not know: the same wrong token again (a client with a
  revoked token in its config, retrying) is refused without a read. Issuing a token removes its
  hash at once (`forget`), so a new token works on its first call; entries expire after
  NEGATIVE_TTL_S, which bounds how long a token issued by another server, and presented here before
  it existed, is refused.

Only SHA-256 hashes of tokens are kept, as in etcd.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable

from federation.errors import RateLimited, Unauthenticated
from federation.security.ratelimit import TokenBuckets

# Failed authentications a peer may make per second once its burst is used.
FAILED_AUTH_RATE_PER_S = 2.0
FAILED_AUTH_BURST = 20
NEGATIVE_TTL_S = 30.0
MAX_NEGATIVE = 100_000


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


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
        negative_ttl_s: float = NEGATIVE_TTL_S,
        max_negative: int = MAX_NEGATIVE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._failures = TokenBuckets(failures_per_s, failure_burst, clock)
        self._negative_ttl_s = negative_ttl_s
        self._max_negative = max_negative
        # token hash -> when etcd said it did not know it; oldest first.
        self._unknown: OrderedDict[str, float] = OrderedDict()

    def before_lookup(self, token: str, peer: str) -> None:
        """Refuse, without a lookup, a token known to be unknown or a peer out of failures."""
        address = peer_address(peer)
        digest = token_digest(token)
        seen = self._unknown.get(digest)
        if seen is not None:
            if self._clock() - seen < self._negative_ttl_s:
                self._failed(address)
                raise Unauthenticated("unknown or revoked token")
            del self._unknown[digest]
        # No peer: an open stream re-checking the token it was opened with, not a new attempt. Its
        # failures are no one's to charge, and must not lock other streams out of their re-checks.
        wait_s = self._failures.wait_s(address) if address else None
        if wait_s is not None:
            raise RateLimited(f"too many failed authentications from {address}; retry in {wait_s:.2f}s")

    def unknown(self, token: str, peer: str) -> None:
        """The lookup found no such token: remember its hash, and charge the peer a failure."""
        digest = token_digest(token)
        self._unknown[digest] = self._clock()
        self._unknown.move_to_end(digest)
        while len(self._unknown) > self._max_negative:
            self._unknown.popitem(last=False)
        self._failed(peer_address(peer))

    def forget(self, token: str) -> None:
        """A token was just issued (or re-stored): it must work at once."""
        self._unknown.pop(token_digest(token), None)

    def _failed(self, address: str) -> None:
        if address:
            self._failures.take(address)
