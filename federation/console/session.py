"""Console sessions: server-side, in memory, one random id in an HttpOnly cookie.

The browser holds only the session id; the token stays on the server, so script in a page (there is
none of ours inline, and the CSP forbids any) could not read it. A session ends on sign-out, after
8 hours without a request, or at the first call its token is refused (revoked or expired): every
page calls the servicers with the token, which re-authenticate it as they do any gRPC call.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

COOKIE_NAME = "gpufed_session"
IDLE_TIMEOUT_S = 8 * 3600.0
# A bound on memory: signing in this many times without signing out drops the least recently used.
MAX_SESSIONS = 10_000


@dataclass(slots=True)
class Session:
    session_id: str
    token: str
    user: str
    tenant: str
    role: str
    csrf: str
    last_seen_s: float

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


class SessionStore:
    def __init__(
        self, *, idle_timeout_s: float = IDLE_TIMEOUT_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._idle_timeout_s = idle_timeout_s
        self._clock = clock
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, *, token: str, user: str, tenant: str, role: str) -> Session:
        if len(self._sessions) >= MAX_SESSIONS:
            oldest = min(self._sessions.values(), key=lambda s: s.last_seen_s)
            self._sessions.pop(oldest.session_id, None)
        session = Session(
            session_id=secrets.token_urlsafe(32),
            token=token,
            user=user,
            tenant=tenant,
            role=role,
            csrf=secrets.token_urlsafe(32),
            last_seen_s=self._clock(),
        )
        self._sessions[session.session_id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id, its idle clock restarted; None if unknown or idle too long."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        now = self._clock()
        if now - session.last_seen_s > self._idle_timeout_s:
            self._sessions.pop(session_id, None)
            return None
        session.last_seen_s = now
        return session

    def alive(self, session_id: str) -> bool:
        """Whether the session still exists (an open event stream checks this without touching it)."""
        session = self._sessions.get(session_id)
        return session is not None and self._clock() - session.last_seen_s <= self._idle_timeout_s

    def end(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)


def set_cookie(response: web.StreamResponse, session: Session, *, secure: bool) -> None:
    response.set_cookie(
        COOKIE_NAME, session.session_id, httponly=True, samesite="Strict", path="/", secure=secure
    )


def clear_cookie(response: web.StreamResponse, *, secure: bool) -> None:
    response.del_cookie(COOKIE_NAME, path="/", secure=secure, httponly=True, samesite="Strict")


SESSIONS_KEY = web.AppKey("gpufed_console_sessions", SessionStore)
SESSION_KEY = web.RequestKey("gpufed_console_session", Session)
