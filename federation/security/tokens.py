"""API tokens an admin issues and revokes, and the audit trail of admin actions, in etcd.

Tokens are kept only as SHA-256 hashes (`/gpufed/tokens/<sha256>`): a copy of etcd holds no
credential. A token's id is the first 12 hex digits of its hash, so an admin can list and revoke
tokens without ever seeing one again. Every admin action is appended to `/gpufed/audit/` with who did
it; keys sort by time, so the trail reads in order.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Any

from federation.store.kv import KeyValueStore
from federation.store.schema_version import dumps, loads, unversioned

TOKENS = b"/gpufed/tokens/"
AUDIT = b"/gpufed/audit/"
TOKEN_ID_DIGITS = 12


@dataclass(frozen=True, slots=True)
class TokenRecord:
    token_id: str
    user: str
    issued_by: str
    issued_at_s: float
    # None: until revoked.
    expires_at_s: float | None = None


@dataclass(frozen=True, slots=True)
class AuditEvent:
    at_s: float
    user: str
    role: str
    action: str
    target: str
    detail: str = ""


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "gpf_" + secrets.token_urlsafe(32)


def token_to_dict(t: TokenRecord) -> dict[str, Any]:
    return {
        "user": t.user,
        "token_id": t.token_id,
        "issued_by": t.issued_by,
        "issued_at_s": t.issued_at_s,
        "expires_at_s": t.expires_at_s,
    }


def token_from_dict(hash_hex: str, d: dict[str, Any]) -> TokenRecord:
    # Tokens written before ids and issuers existed (bootstrap token files) carry only the user.
    expires = d.get("expires_at_s")
    return TokenRecord(
        token_id=str(d.get("token_id") or hash_hex[:TOKEN_ID_DIGITS]),
        user=str(d["user"]),
        issued_by=str(d.get("issued_by", "bootstrap")),
        issued_at_s=float(d.get("issued_at_s", 0.0)),
        expires_at_s=None if expires is None else float(expires),
    )


class SecurityStore:
    def __init__(self, kv: KeyValueStore) -> None:
        self._kv = kv

    async def put_token(self, token: str, record: TokenRecord) -> None:
        await self._kv.put(TOKENS + token_hash(token).encode(), dumps(token_to_dict(record)))

    async def get_token(self, token: str) -> TokenRecord | None:
        hash_hex = token_hash(token)
        kv = await self._kv.get(TOKENS + hash_hex.encode())
        return None if kv is None else token_from_dict(hash_hex, loads(kv.value, kv.key))

    async def list_tokens(self) -> list[TokenRecord]:
        page = await self._kv.range_prefix(TOKENS)
        out = []
        for kv in page.kvs:
            hash_hex = kv.key[len(TOKENS) :].decode()
            out.append(token_from_dict(hash_hex, loads(kv.value, kv.key)))
        return out

    async def revoke_token_id(self, token_id: str) -> TokenRecord | None:
        """Delete the one token whose id this is; None if there is none (or the id is ambiguous)."""
        page = await self._kv.range_prefix(TOKENS + token_id.encode())
        if len(page.kvs) != 1:
            return None
        kv = page.kvs[0]
        record = token_from_dict(kv.key[len(TOKENS) :].decode(), loads(kv.value, kv.key))
        await self._kv.delete(kv.key)
        return record

    async def append_audit(self, event: AuditEvent) -> None:
        key = AUDIT + f"{int(event.at_s * 1e9):020d}-{secrets.token_hex(4)}".encode()
        value = {
            "at_s": event.at_s,
            "user": event.user,
            "role": event.role,
            "action": event.action,
            "target": event.target,
            "detail": event.detail,
        }
        # Unversioned (version 0): the build before schema versions reads audit records with
        # `AuditEvent(**doc)`, which refuses a key it does not know (federation.store.schema_version).
        await self._kv.put(key, json.dumps(value).encode())

    async def list_audit(self, *, limit: int = 1000) -> list[AuditEvent]:
        page = await self._kv.range_prefix(AUDIT)
        events = [AuditEvent(**unversioned(loads(kv.value, kv.key))) for kv in page.kvs]
        return events[-limit:]
