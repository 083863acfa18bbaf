"""Guards in front of token lookups and per-caller read limits, on a clock the test moves.

Over the in-memory store (the same keys and reads as on etcd), counting the token lookups that
would each be an etcd read. Before these guards every unknown token was one lookup, without limit.
"""

from __future__ import annotations

import re

import pytest

from federation.errors import RateLimited, Unauthenticated
from federation.security.auth import Authenticator
from federation.security.auth_limits import FAILED_AUTH_BURST, FAILED_AUTH_RATE_PER_S, peer_address
from federation.security.ratelimit import ReadRateLimiter
from federation.store.job_store import InMemoryJobStore
from federation.store.records import Role, UserRecord
from placement.model import TenantId

PEER = "ipv4:10.0.0.7:51234"
OTHER_PEER = "ipv4:10.0.0.8:40000"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingStore:
    """The store's token lookups, counted: each is an etcd read on a real server."""

    def __init__(self) -> None:
        self.store = InMemoryJobStore()
        self.lookups = 0

    async def resolve_token(self, token: str) -> UserRecord | None:
        self.lookups += 1
        return await self.store.resolve_token(token)

    async def put_token(self, token: str, user: str) -> None:
        await self.store.put_token(token, user)


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def retry_in(error: RateLimited) -> float:
    found = re.search(r"retry in ([0-9.]+)s", str(error))
    assert found is not None, str(error)
    return float(found.group(1))


@pytest.fixture
async def world() -> tuple[Authenticator, CountingStore, Clock]:
    store = CountingStore()
    await store.store.put_user(UserRecord("alice", TenantId("vision"), Role.MEMBER))
    await store.put_token("alice-token", "alice")
    clock = Clock()
    return Authenticator(store, clock=clock), store, clock  # type: ignore[arg-type]


async def test_the_same_unknown_token_again_reaches_the_store_only_within_the_peers_limit(
    world: tuple[Authenticator, CountingStore, Clock],
) -> None:
    """A client retrying a revoked token: looked up each time (there is no negative cache that could
    outlive the token's absence), but only within its address's budget of failures."""
    auth, store, _ = world
    for _ in range(FAILED_AUTH_BURST + 10):
        with pytest.raises((Unauthenticated, RateLimited)):
            await auth.authenticate(bearer("revoked-long-ago"), peer=PEER)
    assert store.lookups == FAILED_AUTH_BURST


async def test_a_flood_of_random_tokens_reaches_the_store_only_within_the_peers_limit(
    world: tuple[Authenticator, CountingStore, Clock],
) -> None:
    auth, store, clock = world
    await auth.authenticate(bearer("alice-token"), peer=PEER)  # resolved before the flood
    lookups_before = store.lookups
    refused = None
    for i in range(500):
        try:
            await auth.authenticate(bearer(f"random-{i}"), peer=PEER)
        except Unauthenticated:
            continue
        except RateLimited as error:
            refused = error
    assert store.lookups - lookups_before == FAILED_AUTH_BURST, "500 random tokens, one lookup each"
    assert refused is not None
    assert "10.0.0.7" in str(refused)
    # Alice, already resolved, still gets in from the same address; another address is not limited.
    assert (await auth.authenticate(bearer("alice-token"), peer=PEER)).user == "alice"
    with pytest.raises(Unauthenticated):
        await auth.authenticate(bearer("someone-else"), peer=OTHER_PEER)

    # The retry time is truthful: a moment before it, still refused; at it, looked up again.
    wait_s = retry_in(refused)
    assert wait_s == pytest.approx(1 / FAILED_AUTH_RATE_PER_S, abs=0.02)
    clock.now += wait_s - 0.05
    with pytest.raises(RateLimited):
        await auth.authenticate(bearer("random-late"), peer=PEER)
    clock.now += 0.05
    before = store.lookups
    with pytest.raises(Unauthenticated):
        await auth.authenticate(bearer("random-later"), peer=PEER)
    assert store.lookups == before + 1


async def test_a_flood_that_outlasts_the_token_cache_does_not_lock_out_a_known_user(
    world: tuple[Authenticator, CountingStore, Clock],
) -> None:
    """Found beside stress-ng: a flood from alice's address outlasted her cache entry, and the
    re-check of her token waited behind the strangers' failed-authentication limit."""
    auth, store, clock = world
    await store.store.put_user(UserRecord("bob", TenantId("nlp"), Role.MEMBER))
    await store.put_token("bob-token", "bob")
    await auth.authenticate(bearer("alice-token"), peer=PEER)
    await auth.authenticate(bearer("bob-token"), peer=PEER)
    clock.now += 6  # past the positive cache (5 s)
    for i in range(2 * FAILED_AUTH_BURST):
        with pytest.raises((Unauthenticated, RateLimited)):
            await auth.authenticate(bearer(f"random-{i}"), peer=PEER)
    with pytest.raises(RateLimited):
        await auth.authenticate(bearer("random-last"), peer=PEER)
    # Her token is looked up again (one read), past the strangers' gate, and works.
    before = store.lookups
    assert (await auth.authenticate(bearer("alice-token"), peer=PEER)).user == "alice"
    assert store.lookups == before + 1
    # A token revoked meanwhile gets that one lookup too, which refuses it; from then on it is an
    # unknown token like any other, behind the strangers' gate.
    assert await store.store.revoke_token("bob-token")
    with pytest.raises(Unauthenticated):
        await auth.authenticate(bearer("bob-token"), peer=PEER)
    before = store.lookups
    for _ in range(5):
        with pytest.raises(RateLimited):
            await auth.authenticate(bearer("bob-token"), peer=PEER)
    assert store.lookups == before


async def test_an_issued_token_works_at_once_even_if_it_was_tried_before(
    world: tuple[Authenticator, CountingStore, Clock],
) -> None:
    auth, store, _ = world
    with pytest.raises(Unauthenticated):
        await auth.authenticate(bearer("chosen-token"), peer=PEER)
    await store.put_token("chosen-token", "alice")
    alice = await store.store.get_user("alice")
    assert alice is not None
    auth.issued("chosen-token", alice)  # what IssueToken does once it has stored the token
    before = store.lookups
    assert (await auth.authenticate(bearer("chosen-token"), peer=PEER)).user == "alice"
    assert store.lookups == before


async def test_a_token_stored_elsewhere_works_at_once_after_it_was_refused_here(
    world: tuple[Authenticator, CountingStore, Clock],
) -> None:
    """Issue 30: stored by another server (or by bootstrap, or its user created only now), which
    cannot tell this one. The old negative cache refused it here for 30 s more."""
    auth, store, _ = world
    with pytest.raises(Unauthenticated):
        await auth.authenticate(bearer("later-token"), peer=PEER)
    await store.put_token("later-token", "alice")
    assert (await auth.authenticate(bearer("later-token"), peer=PEER)).user == "alice"


def test_peer_addresses_drop_the_port() -> None:
    assert peer_address("ipv4:127.0.0.1:5123") == "ipv4:127.0.0.1"
    assert peer_address("ipv6:[::1]:5123") == "ipv6:[::1]"
    assert peer_address("unix:/tmp/s") == "unix:/tmp/s"


def test_reads_are_limited_per_caller_with_a_truthful_retry_time() -> None:
    clock = Clock()
    limiter = ReadRateLimiter(10.0, 20, clock)
    for _ in range(20):
        limiter.admit("alice")
    with pytest.raises(RateLimited) as refused:
        limiter.admit("alice")
    limiter.admit("bob")  # another caller has its own bucket
    wait_s = retry_in(refused.value)
    assert wait_s == pytest.approx(0.1, abs=0.011)
    clock.now += wait_s - 0.02
    with pytest.raises(RateLimited):
        limiter.admit("alice")
    clock.now += 0.02
    limiter.admit("alice")


def test_no_read_limit_when_turned_off() -> None:
    limiter = ReadRateLimiter(0, 1, Clock())
    for _ in range(1000):
        limiter.admit("alice")


async def test_stream_rechecks_without_a_peer_lock_no_one_out(
    world: tuple[Authenticator, CountingStore, Clock],
) -> None:
    """Open streams re-check their tokens with no peer: revoked ones fail, the others keep going."""
    auth, _, clock = world
    for i in range(3 * 20):
        with pytest.raises(Unauthenticated):
            await auth.authenticate(bearer(f"revoked-{i}"), max_age_s=4.0)
    clock.now += 10  # past the positive cache: alice's stream must look her token up again
    assert (await auth.authenticate(bearer("alice-token"), max_age_s=4.0)).user == "alice"
