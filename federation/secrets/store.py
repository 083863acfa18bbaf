"""Tenants' secrets in etcd: names, key names, versions and times in clear; the values sealed.

Key: /gpufed/secrets/<tenant>/<name> -> {"schema": 1, "tenant", "name", "version", "keys": [...],
"created_at_s", "updated_at_s", "updated_by", "key_id", "nonce", "ciphertext"} (nonce and ciphertext
in base64). Nothing here ever returns a value except `open`, which only the dispatcher calls (to copy
the secret into a job's namespace on a member cluster): the API lists metadata and never reads values.

A put replaces the whole secret (all its keys) and bumps its version, in a compare-and-swap
transaction, so two puts at once cannot lose one's version count. Put again to re-seal a secret with
the key file's first key (rotation).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass

from federation.errors import Conflict, InvalidSpec, NotFound
from federation.secrets.crypto import Keyring, Sealed, SecretUnreadable
from federation.spec.validate import name_field, shown
from federation.store.kv import Compare, Delete, KeyValueStore, Put
from federation.store.schema_version import dumps, loads

SECRETS = b"/gpufed/secrets/"
# Kubernetes' rule for a Secret's data keys (IsConfigMapKey): they become keys of the Secret that
# gpufed creates on the member cluster, and file names in a secret volume.
_KEY = re.compile(r"[-._a-zA-Z0-9]+")
MAX_KEY_LENGTH = 253
MAX_KEYS = 64
# A Kubernetes Secret holds at most 1 MiB; etcd's request limit is 1.5 MiB. Tokens and credentials
# are small: a quarter of a Secret leaves room for its base64 and the record around it.
MAX_VALUE_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class SecretInfo:
    """What anyone allowed may know of a secret: never a value."""

    tenant: str
    name: str
    version: int
    keys: tuple[str, ...]
    created_at_s: float
    updated_at_s: float
    updated_by: str


@dataclass(frozen=True, slots=True)
class _Stored:
    info: SecretInfo
    sealed: Sealed
    mod_revision: int


def secret_key_field(key: object, field: str) -> str:
    if not isinstance(key, str) or len(key) > MAX_KEY_LENGTH or not _KEY.fullmatch(key) or key in (".", ".."):
        raise InvalidSpec(
            field,
            "a secret's key must be letters, digits, '-', '_' or '.' (as a Kubernetes Secret's), "
            f"at most {MAX_KEY_LENGTH} characters, got {shown(key)}",
        )
    return key


def checked_values(values: Mapping[str, bytes]) -> dict[str, bytes]:
    """The values of a put, or InvalidSpec naming the key at fault (never quoting a value)."""
    if not values:
        raise InvalidSpec("data", "a secret needs at least one key")
    if len(values) > MAX_KEYS:
        raise InvalidSpec("data", f"a secret has at most {MAX_KEYS} keys, got {len(values)}")
    for key in values:
        secret_key_field(key, f"data[{key!r}]" if len(key) <= 80 else "data")
    total = sum(len(v) for v in values.values())
    if total > MAX_VALUE_BYTES:
        raise InvalidSpec(
            "data", f"a secret's values are at most {MAX_VALUE_BYTES} bytes in all, got {total}"
        )
    return dict(values)


def _key(tenant: str, name: str) -> bytes:
    return SECRETS + f"{tenant}/{name}".encode()


def _decode(value: bytes, key: bytes, mod_revision: int) -> _Stored:
    doc = loads(value, key)
    info = SecretInfo(
        tenant=str(doc["tenant"]),
        name=str(doc["name"]),
        version=int(doc["version"]),
        keys=tuple(str(k) for k in doc["keys"]),
        created_at_s=float(doc["created_at_s"]),
        updated_at_s=float(doc["updated_at_s"]),
        updated_by=str(doc.get("updated_by", "")),
    )
    sealed = Sealed(
        key_id=str(doc["key_id"]),
        nonce=base64.b64decode(doc["nonce"]),
        ciphertext=base64.b64decode(doc["ciphertext"]),
    )
    return _Stored(info, sealed, mod_revision)


def _encode(info: SecretInfo, sealed: Sealed) -> bytes:
    return dumps(
        {
            "tenant": info.tenant,
            "name": info.name,
            "version": info.version,
            "keys": list(info.keys),
            "created_at_s": info.created_at_s,
            "updated_at_s": info.updated_at_s,
            "updated_by": info.updated_by,
            "key_id": sealed.key_id,
            "nonce": base64.b64encode(sealed.nonce).decode(),
            "ciphertext": base64.b64encode(sealed.ciphertext).decode(),
        }
    )


class SecretStore:
    """The secrets of every tenant. `keyring` None: the server has no key file, and every call
    that would seal or open says how to give it one (metadata still lists and deletes)."""

    def __init__(self, kv: KeyValueStore, keyring: Keyring | None) -> None:
        self._kv = kv
        self._keyring = keyring

    @property
    def enabled(self) -> bool:
        return self._keyring is not None

    def _ring(self) -> Keyring:
        if self._keyring is None:
            raise SecretsDisabled(
                "this server has no secrets key file: start it with GPUFED_SECRETS_KEY_FILE=PATH, or "
                "with secrets.key in its state dir (`gpufed up` makes one there)"
            )
        return self._keyring

    async def _get(self, tenant: str, name: str) -> _Stored | None:
        held = await self._kv.get(_key(tenant, name))
        return None if held is None else _decode(held.value, held.key, held.mod_revision)

    async def info(self, tenant: str, name: str) -> SecretInfo | None:
        stored = await self._get(tenant, name)
        return None if stored is None else stored.info

    async def list(self, tenant: str | None) -> list[SecretInfo]:
        prefix = SECRETS if tenant is None else SECRETS + f"{tenant}/".encode()
        page = await self._kv.range_prefix(prefix)
        return [_decode(kv.value, kv.key, kv.mod_revision).info for kv in page.kvs]

    async def put(
        self, tenant: str, name: str, values: Mapping[str, bytes], *, by: str, at_s: float
    ) -> SecretInfo:
        name_field(name, "name")
        checked = checked_values(values)
        ring = self._ring()
        key = _key(tenant, name)
        before = await self._get(tenant, name)
        info = SecretInfo(
            tenant=tenant,
            name=name,
            version=1 if before is None else before.info.version + 1,
            keys=tuple(sorted(checked)),
            created_at_s=at_s if before is None else before.info.created_at_s,
            updated_at_s=at_s,
            updated_by=by,
        )
        guard = Compare.absent(key) if before is None else Compare.mod_revision_is(key, before.mod_revision)
        result = await self._kv.txn([guard], [Put(key, _encode(info, ring.seal(tenant, name, checked)))])
        if not result.succeeded:
            raise Conflict(f"secret {name!r} changed while it was being put: put it again")
        return info

    async def delete(self, tenant: str, name: str) -> SecretInfo:
        stored = await self._get(tenant, name)
        if stored is None:
            raise NotFound(secret_not_found(tenant, name))
        key = _key(tenant, name)
        result = await self._kv.txn([Compare.mod_revision_is(key, stored.mod_revision)], [Delete(key)])
        if not result.succeeded:
            raise Conflict(f"secret {name!r} changed while it was being deleted: try again")
        return stored.info

    async def open(self, tenant: str, name: str) -> dict[str, bytes]:
        """The values, for the dispatcher only. NotFound if the secret is gone."""
        stored = await self._get(tenant, name)
        if stored is None:
            raise NotFound(secret_not_found(tenant, name))
        return self._ring().open(tenant, name, stored.sealed)


class SecretsDisabled(SecretUnreadable):
    """The server was started without a secrets key file: nothing can be sealed or opened."""


def secret_not_found(tenant: str, name: str) -> str:
    """One answer for a secret that does not exist and for another tenant's: names cannot be probed."""
    return f"secret {name!r} not found in tenant {tenant!r}"
