"""Console sessions: idle expiry, fresh ids, the memory bound, the cookie's attributes."""

from __future__ import annotations

import pytest
from aiohttp import web

from federation.console import session as session_module
from federation.console.session import COOKIE_NAME, SessionStore, clear_cookie, set_cookie


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_lives_while_used_and_ends_after_eight_idle_hours() -> None:
    clock = Clock()
    store = SessionStore(clock=clock)
    s = store.create(token="t", user="alice", tenant="vision", role="member")
    clock.now += 7 * 3600
    assert store.get(s.session_id) is s  # used: its idle clock restarts
    clock.now += 7 * 3600
    assert store.get(s.session_id) is s
    clock.now += 8 * 3600 + 1
    assert not store.alive(s.session_id)
    assert store.get(s.session_id) is None
    assert len(store) == 0


def test_ids_and_csrf_tokens_are_random_and_distinct() -> None:
    store = SessionStore()
    a = store.create(token="t", user="alice", tenant="vision", role="member")
    b = store.create(token="t", user="alice", tenant="vision", role="member")
    assert a.session_id != b.session_id
    assert a.csrf != b.csrf
    assert len(a.session_id) >= 43  # 32 random bytes, URL-safe base64
    assert len(a.csrf) >= 43


@pytest.mark.parametrize("given", [None, "", "not-a-session"], ids=["none", "empty", "unknown"])
def test_unknown_ids_find_nothing(given: str | None) -> None:
    assert SessionStore().get(given) is None


def test_ending_a_session_forgets_it() -> None:
    store = SessionStore()
    s = store.create(token="t", user="alice", tenant="vision", role="member")
    store.end(s.session_id)
    assert store.get(s.session_id) is None


def test_the_store_is_bounded_dropping_the_least_recently_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module, "MAX_SESSIONS", 3)
    clock = Clock()
    store = SessionStore(clock=clock)
    made = []
    for _ in range(3):
        clock.now += 1
        made.append(store.create(token="t", user="u", tenant="t", role="member"))
    clock.now += 1
    assert store.get(made[0].session_id) is not None  # the oldest, just used
    store.create(token="t", user="u", tenant="t", role="member")
    assert len(store) == 3
    assert store.get(made[1].session_id) is None
    assert store.get(made[0].session_id) is not None


@pytest.mark.parametrize("secure", [False, True], ids=["plain-http", "tls"])
def test_the_cookie_is_httponly_strict_and_secure_only_with_tls(secure: bool) -> None:
    s = SessionStore().create(token="t", user="alice", tenant="vision", role="member")
    response = web.Response()
    set_cookie(response, s, secure=secure)
    morsel = response.cookies[COOKIE_NAME]
    assert morsel.value == s.session_id
    assert morsel["httponly"] is True
    assert morsel["samesite"] == "Strict"
    assert morsel["path"] == "/"
    assert bool(morsel["secure"]) is secure
    assert not morsel.get("max-age")  # a browser-session cookie: the server decides when it ends
    cleared = web.Response()
    clear_cookie(cleared, secure=secure)
    assert cleared.cookies[COOKIE_NAME]["max-age"] == "0"
