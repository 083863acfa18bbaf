"""AES-256-GCM sealing of a secret's values, with the tenant and name bound to the ciphertext.

The key never goes to etcd: it lives in a key file beside the server (`federation.secrets.keyfile`),
so a copy of etcd (a backup, a snapshot, a reader of the raw keys) holds ciphertext only. The tenant
and the secret's name are the associated data of the seal, so a ciphertext copied to another key
(another tenant's secret, another name) fails its integrity check instead of decrypting there. A
keyring holds several keys so that the key can be rotated: the first seals, every key opens what it
sealed (found by its id, the first bytes of its SHA-256, never the key itself).

Errors name the secret and the reason, never a value.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from federation.errors import FailedPrecondition

KEY_BYTES = 32
NONCE_BYTES = 12
# Versioned, so that a later format cannot be confused with this one under the same key.
_AAD_PREFIX = b"gpufed-secret/v1\x00"


class SecretUnreadable(FailedPrecondition):
    """A stored secret could not be opened with the server's keys. Permanent until an admin fixes
    the key file or the secret is put again. The message names the secret, never its values."""


@dataclass(frozen=True, slots=True)
class Sealed:
    """One secret's values as etcd keeps them."""

    key_id: str
    nonce: bytes
    ciphertext: bytes


def key_id_of(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:16]


def associated_data(tenant: str, name: str) -> bytes:
    return _AAD_PREFIX + tenant.encode() + b"\x00" + name.encode()


class Keyring:
    """The server's keys, the first of which seals. Its repr shows key ids only."""

    __slots__ = ("_keys", "_primary")

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("a keyring needs at least one key")
        for key in keys:
            if len(key) != KEY_BYTES:
                raise ValueError(f"a secrets key is {KEY_BYTES} bytes, got {len(key)}")
        self._primary = key_id_of(keys[0])
        self._keys = {key_id_of(k): AESGCM(k) for k in keys}

    @property
    def primary_id(self) -> str:
        return self._primary

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def __repr__(self) -> str:
        return f"Keyring(primary={self._primary}, keys={len(self._keys)})"

    def seal(self, tenant: str, name: str, values: Mapping[str, bytes]) -> Sealed:
        nonce = os.urandom(NONCE_BYTES)
        plain = json.dumps(
            {k: base64.b64encode(v).decode() for k, v in sorted(values.items())}, separators=(",", ":")
        ).encode()
        sealed = self._keys[self._primary].encrypt(nonce, plain, associated_data(tenant, name))
        return Sealed(self._primary, nonce, sealed)

    def open(self, tenant: str, name: str, sealed: Sealed) -> dict[str, bytes]:
        where = f"secret {name!r} of tenant {tenant!r}"
        cipher = self._keys.get(sealed.key_id)
        if cipher is None:
            raise SecretUnreadable(
                f"{where} was sealed with key {sealed.key_id}, which the server's secrets key file does "
                f"not hold (it holds {', '.join(self._keys)}): restore that key to the file, or put the "
                "secret again"
            )
        try:
            plain = cipher.decrypt(sealed.nonce, sealed.ciphertext, associated_data(tenant, name))
        except InvalidTag:
            raise SecretUnreadable(
                f"{where} failed its integrity check: its stored record was changed, or copied from "
                "another tenant's or another name's secret; put the secret again"
            ) from None
        try:
            doc = json.loads(plain)
            return {str(k): base64.b64decode(v, validate=True) for k, v in doc.items()}
        except (ValueError, AttributeError):
            raise SecretUnreadable(f"{where} decrypted to a document this build cannot read") from None
