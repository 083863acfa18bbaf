"""Console sessions in a key-value store: idle expiry by lease, the absolute age limit, fresh ids,
what the store holds (no id, no token), and the cookie's attributes."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from federation.console.session import (
    COOKIE_NAME,
    PREFIX,
    SessionStore,
    clear_cookie,
    csrf_of,
    set_cookie,
)
from federation.store.kv_memory import MemoryKv


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_ends_when_its_idle_lease_runs_out_and_after_its_maximum_age() -> None:
    async def body() -> None:
        clock = Clock()
        kv = MemoryKv(clock=clock)
        store = SessionStore(kv, idle_timeout_s=60, max_age_s=3600, clock=clock)
        s = await store.create(token="t", user="alice", tenant="vision", role="member")
        clock.now += 59
        assert (await store.get(s.session_id)) is not None
        clock.now += 61
        assert await store.get(s.session_id) is None  # etcd (here its twin) dropped the lease
        t = await store.create(token="t", user="alice", tenant="vision", role="member")
        clock.now += 3601
        assert await store.get(t.session_id) is None

    asyncio.run(body())


def test_the_store_holds_neither_the_id_nor_the_token_and_two_stores_share_it() -> None:
    async def body() -> None:
        kv = MemoryKv()
        one, two = SessionStore(kv), SessionStore(kv)
        s = await one.create(token="secret-token", user="alice", tenant="vision", role="member")
        page = await kv.range_prefix(PREFIX)
        assert len(page.kvs) == 1
        held = page.kvs[0].key + page.kvs[0].value
        assert s.session_id.encode() not in held
        assert b"secret-token" not in held
        assert s.csrf.encode() not in held
        seen = await two.get(s.session_id)
        assert seen is not None
        assert (seen.token, seen.user, seen.csrf) == ("secret-token", "alice", csrf_of(s.session_id))
        await two.end(s.session_id)
        assert await one.get(s.session_id) is None

    asyncio.run(body())


@pytest.mark.parametrize(
    "given", [None, "", "not-a-session", "x" * 5000], ids=["none", "empty", "unknown", "long"]
)
def test_unknown_ids_find_nothing(given: str | None) -> None:
    assert asyncio.run(SessionStore().get(given)) is None


def test_ids_and_csrf_tokens_are_random_and_distinct() -> None:
    async def body() -> None:
        store = SessionStore()
        a = await store.create(token="t", user="alice", tenant="vision", role="member")
        b = await store.create(token="t", user="alice", tenant="vision", role="member")
        assert a.session_id != b.session_id
        assert a.csrf != b.csrf
        assert len(a.session_id) >= 43

    asyncio.run(body())


@pytest.mark.parametrize("secure", [False, True], ids=["plain-http", "tls"])
def test_the_cookie_is_httponly_strict_and_secure_only_with_tls(secure: bool) -> None:
    s = asyncio.run(SessionStore().create(token="t", user="alice", tenant="vision", role="member"))
    response = web.Response()
    set_cookie(response, s, secure=secure)
    morsel = response.cookies[COOKIE_NAME]
    assert morsel.value == s.session_id
    assert morsel["httponly"] is True
    assert morsel["samesite"] == "Strict"
    assert bool(morsel["secure"]) is secure
    cleared = web.Response()
    clear_cookie(cleared, secure=secure)
    assert cleared.cookies[COOKIE_NAME]["max-age"] == "0"
