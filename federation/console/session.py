"""Console sessions: kept in the store (etcd), one random id in an HttpOnly cookie.

The browser holds only the session id; the token stays on the server side, so script in a page
(there is none of ours inline, and the CSP forbids any) could not read it. Sessions live in etcd,
not in one process's memory (issue 30): a second server sharing the etcd, or this one after a
restart, knows the same cookie, and a sign-out on any server ends the session on all of them.

What etcd holds must not let a reader of etcd sign in. The record's key is the SHA-256 of the
session id, never the id; the bearer token is sealed with keys derived from the id (a SHAKE-256
keystream and an HMAC-SHA256 tag), so only a request that carries the cookie can open it; the CSRF
token is derived from the id and not stored at all. Each record is attached to its own etcd lease
of `idle_timeout_s`, renewed (at most once a minute) while the session is used: etcd itself drops a
session left idle, on every server at once. A session also ends `max_age_s` after sign-in however
busy, on sign-out, and at the first call its token is refused (revoked or expired): every page calls
the servicers with the token, which re-authenticate it as they do any gRPC call.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from aiohttp import web

from federation.store.kv import KeyValueStore, LeaseNotFound
from federation.store.kv_memory import MemoryKv
from federation.store.schema_version import dumps, loads

log = structlog.get_logger("gpufed.console.session")

COOKIE_NAME = "gpufed_session"
IDLE_TIMEOUT_S = 8 * 3600.0
# However busy, a session ends this long after sign-in: a stolen cookie is not good for ever.
MAX_AGE_S = 7 * 24 * 3600.0
# A used session's lease is renewed at most this often (one etcd call per minute, not per page).
RENEW_EVERY_S = 60.0
PREFIX = b"/gpufed/console/sessions/"
# A longer cookie value is not one of ours: refused before any hashing or etcd read.
MAX_ID_LENGTH = 64
RECORD_VERSION = 1


@dataclass(slots=True)
class Session:
    session_id: str
    token: str
    user: str
    tenant: str
    role: str
    csrf: str
    created_s: float

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def session_key(session_id: str) -> bytes:
    """The record's key: a hash of the id, so a reader of etcd cannot present it as a cookie."""
    return PREFIX + hashlib.sha256(session_id.encode()).hexdigest().encode()


def _derive(session_id: str, purpose: bytes) -> bytes:
    return hmac.new(session_id.encode(), b"gpufed console session\0" + purpose, hashlib.sha256).digest()


def _keystream(session_id: str, length: int) -> bytes:
    return hashlib.shake_256(_derive(session_id, b"token keystream")).digest(length)


def seal_token(session_id: str, token: str) -> tuple[str, str]:
    """(sealed token, tag), both base64: the token XOR a keystream only the session id yields (one
    id seals one token, so the keystream is never reused), and an HMAC over the sealed bytes."""
    plain = token.encode()
    sealed = bytes(a ^ b for a, b in zip(plain, _keystream(session_id, len(plain)), strict=True))
    tag = hmac.new(_derive(session_id, b"token tag"), sealed, hashlib.sha256).digest()
    return base64.b64encode(sealed).decode(), base64.b64encode(tag).decode()


def open_token(session_id: str, sealed_b64: str, tag_b64: str) -> str | None:
    """The token sealed under this id; None when the tag does not match (not this id's record)."""
    sealed = base64.b64decode(sealed_b64)
    tag = hmac.new(_derive(session_id, b"token tag"), sealed, hashlib.sha256).digest()
    if not hmac.compare_digest(tag, base64.b64decode(tag_b64)):
        return None
    plain = bytes(a ^ b for a, b in zip(sealed, _keystream(session_id, len(sealed)), strict=True))
    return plain.decode()


def csrf_of(session_id: str) -> str:
    """The session's CSRF token: derived from the id, the same on every server, never stored."""
    return base64.urlsafe_b64encode(_derive(session_id, b"csrf")).decode().rstrip("=")


class SessionStore:
    """Sessions in a `KeyValueStore` (etcd in a server; an in-memory twin when none is given)."""

    def __init__(
        self,
        kv: KeyValueStore | None = None,
        *,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kv: KeyValueStore = kv if kv is not None else MemoryKv()
        self._idle_timeout_s = idle_timeout_s
        self._max_age_s = max_age_s
        self._clock = clock
        # session key -> when this process last renewed its lease (monotonic): throttles renewals.
        self._renewed: dict[bytes, float] = {}

    async def create(self, *, token: str, user: str, tenant: str, role: str) -> Session:
        session_id = secrets.token_urlsafe(32)
        sealed, tag = seal_token(session_id, token)
        now = self._clock()
        record = {
            "v": RECORD_VERSION,
            "user": user,
            "tenant": tenant,
            "role": role,
            "created_s": now,
            "token_sealed": sealed,
            "token_tag": tag,
        }
        key = session_key(session_id)
        lease = await self._kv.grant_lease(max(1, int(self._idle_timeout_s)))
        await self._kv.put(key, dumps(record), lease=lease)
        self._renewed[key] = time.monotonic()
        log.info("console_session_stored", user=user, role=role)
        return Session(session_id, token, user, tenant, role, csrf_of(session_id), now)

    async def _read(self, session_id: str | None) -> tuple[Session, int] | None:
        if not session_id or len(session_id) > MAX_ID_LENGTH:
            return None
        key = session_key(session_id)
        kv = await self._kv.get(key)
        if kv is None:
            self._renewed.pop(key, None)
            return None
        try:
            d = loads(kv.value, kv.key)
            token = open_token(session_id, d["token_sealed"], d["token_tag"])
            created_s = float(d["created_s"])
            session = Session(
                session_id, token or "", str(d["user"]), str(d["tenant"]), str(d["role"]),
                csrf_of(session_id), created_s,
            )  # fmt: skip
        except (ValueError, KeyError, TypeError):
            log.warning("console_session_unreadable", key=key.decode(errors="replace"))
            token = None
        if token is None:
            return None
        if self._clock() - session.created_s > self._max_age_s:
            await self._delete(key, kv.lease)
            return None
        return session, kv.lease

    async def get(self, session_id: str | None) -> Session | None:
        """The live session with this id, its idle lease renewed; None if unknown, ended or idle
        too long (etcd dropped it)."""
        found = await self._read(session_id)
        if found is None:
            return None
        session, lease = found
        key = session_key(session.session_id)
        now = time.monotonic()
        if lease and now - self._renewed.get(key, 0.0) >= RENEW_EVERY_S:
            try:
                left = await self._kv.keepalive(lease)
            except LeaseNotFound:
                left = 0
            if left <= 0:
                self._renewed.pop(key, None)
                return None
            self._renewed[key] = now
        return session

    async def alive(self, session_id: str) -> bool:
        """Whether the session still exists, on any server (an open event stream checks this
        without renewing it)."""
        return await self._read(session_id) is not None

    async def end(self, session_id: str | None) -> None:
        if not session_id or len(session_id) > MAX_ID_LENGTH:
            return
        key = session_key(session_id)
        kv = await self._kv.get(key)
        await self._delete(key, 0 if kv is None else kv.lease)

    async def _delete(self, key: bytes, lease: int) -> None:
        self._renewed.pop(key, None)
        await self._kv.delete(key)
        if lease:
            await self._kv.revoke_lease(lease)


def set_cookie(response: web.StreamResponse, session: Session, *, secure: bool) -> None:
    response.set_cookie(
        COOKIE_NAME, session.session_id, httponly=True, samesite="Strict", path="/", secure=secure
    )


def clear_cookie(response: web.StreamResponse, *, secure: bool) -> None:
    response.del_cookie(COOKIE_NAME, path="/", secure=secure, httponly=True, samesite="Strict")


SESSIONS_KEY = web.AppKey("gpufed_console_sessions", SessionStore)
SESSION_KEY = web.RequestKey("gpufed_console_session", Session)
