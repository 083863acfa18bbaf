"""A call's Principal comes from the token's cached resolution: made once a resolution, and gone with
it. A revoked token, or a user moved to another tenant or role, is refused or seen anew at the first
call after the resolution's TTL, exactly as when each call made its Principal."""

from __future__ import annotations

import asyncio

import pytest

from federation.errors import Unauthenticated
from federation.security.auth import TOKEN_CACHE_TTL_S, Authenticator, Principal
from federation.store.job_store import InMemoryJobStore, KvStore
from federation.store.records import Role, UserRecord
from placement.model import TenantId

METADATA = (("authorization", "Bearer tok"),)
VISION, NLP = TenantId("vision"), TenantId("nlp")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _store() -> KvStore:
    store = InMemoryJobStore()
    asyncio.run(store.put_user(UserRecord("carol", VISION, Role.MEMBER, "high")))
    asyncio.run(store.put_token("tok", "carol"))
    return store


def test_the_principal_is_the_users_and_made_once_a_resolution() -> None:
    store, clock = _store(), Clock()
    auth = Authenticator(store, clock=clock)
    first = asyncio.run(auth.authenticate(METADATA))
    assert first == Principal(user="carol", tenant=VISION, role=Role.MEMBER, max_priority_class="high")
    clock.now += TOKEN_CACHE_TTL_S / 2
    assert asyncio.run(auth.authenticate(METADATA)) is first


def test_a_revoked_token_is_refused_at_the_first_call_after_the_ttl() -> None:
    store, clock = _store(), Clock()
    auth = Authenticator(store, clock=clock)
    asyncio.run(auth.authenticate(METADATA))
    asyncio.run(store.revoke_token("tok"))
    clock.now += TOKEN_CACHE_TTL_S - 0.01
    asyncio.run(auth.authenticate(METADATA))  # within the TTL, as before: the cached resolution
    clock.now += 0.01
    with pytest.raises(Unauthenticated):
        asyncio.run(auth.authenticate(METADATA))
    # And every call after it, the entry gone with the refusal.
    with pytest.raises(Unauthenticated):
        asyncio.run(auth.authenticate(METADATA))


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(UserRecord("carol", NLP, Role.MEMBER), id="moved-tenant"),
        pytest.param(UserRecord("carol", VISION, Role.FINANCE), id="new-role"),
        pytest.param(UserRecord("carol", VISION, Role.MEMBER, "low"), id="class-limit"),
    ],
)
def test_a_changed_user_is_seen_at_the_first_call_after_the_ttl(change: UserRecord) -> None:
    store, clock = _store(), Clock()
    auth = Authenticator(store, clock=clock)
    before = asyncio.run(auth.authenticate(METADATA))
    asyncio.run(store.put_user(change))
    clock.now += TOKEN_CACHE_TTL_S
    after = asyncio.run(auth.authenticate(METADATA))
    assert after == Principal(
        user="carol", tenant=change.tenant, role=change.role, max_priority_class=change.max_priority_class
    )
    assert after != before


def test_an_issued_token_works_at_once_as_its_user() -> None:
    store, clock = _store(), Clock()
    auth = Authenticator(store, clock=clock)
    auth.issued("fresh", UserRecord("dave", NLP, Role.ADMIN))
    principal = asyncio.run(auth.authenticate((("authorization", "Bearer fresh"),)))
    assert principal == Principal(user="dave", tenant=NLP, role=Role.ADMIN)
    assert principal.is_admin
