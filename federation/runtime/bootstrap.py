"""Write the config file to etcd at start, without undoing what admins changed since.

`gpufed up` and `gpufed serve --bootstrap` run this on every start. The config seeds an empty
store; after that etcd is the source of truth for tenants, users and tokens, which admins change
through the API (and the audit trail records). So a restart:

- creates the tenants and users the config names that the store has never held, and a token for
  each new user (its file in `token_dir`, its hash in etcd);
- leaves every tenant and user the store holds as it is (an admin's rate limit, class limit or move
  to another tenant stays), and never re-creates one an admin deleted, nor a token an admin revoked:
  what bootstrap ever created is remembered under `/gpufed/bootstrap`, so "gone" is told from "new";
- writes the sections only the config sets (scheduling settings, clusters, object stores, capacity,
  datasync) when they differ from what is stored.

Every write is appended to the audit trail as done by user `bootstrap`, role `system`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from federation.capacity.store import CapacityStore
from federation.datasets.executor import get_settings as get_datasync
from federation.datasets.executor import put_settings as put_datasync
from federation.datasets.stores import StoreDirectory, store_to_json
from federation.joblogs.archive import get_logs_settings, put_logs_settings
from federation.runtime.config import FederationConfig
from federation.security.tokens import TOKEN_ID_DIGITS, AuditEvent, SecurityStore, TokenRecord, token_hash
from federation.store.job_store import PREFIX, KvStore
from federation.store.kv import Compare, KeyValueStore, Put
from federation.store.records import TenantRecord, UserRecord
from federation.store.schema_version import dumps, loads

log = structlog.get_logger("gpufed.bootstrap")

# What bootstrap ever created: tenant and user names, so that a restart can tell one an
# admin deleted or revoked (created before, gone now) from one the config newly names.
SEEDED_KEY = PREFIX + b"bootstrap"
BOOTSTRAP_USER = "bootstrap"
BOOTSTRAP_ROLE = "system"
# Held while one server bootstraps (`_one_at_a_time`). A bootstrap takes well under a second; the
# lease only matters when its holder died, and then the next start waits that long once.
BOOTSTRAP_LOCK_KEY = PREFIX + b"locks/bootstrap"
_LOCK_TTL_S = 15
_LOCK_FIRST_WAIT_S = 0.05
_LOCK_MAX_WAIT_S = 1.0


@dataclass(slots=True)
class _Seeded:
    tenants: set[str] = field(default_factory=set)
    users: set[str] = field(default_factory=set)

    def to_json(self) -> bytes:
        return dumps({"tenants": sorted(self.tenants), "users": sorted(self.users)})

    @staticmethod
    def from_json(value: bytes) -> _Seeded:
        d = loads(value, SEEDED_KEY)
        return _Seeded(set(d.get("tenants", ())), set(d.get("users", ())))


class _Audit:
    def __init__(self, security: SecurityStore) -> None:
        self._security = security
        self.count = 0

    async def __call__(self, action: str, target: str, detail: str = "") -> None:
        self.count += 1
        log.info("bootstrap_applied", action=action, target=target, detail=detail)
        event = AuditEvent(time.time(), BOOTSTRAP_USER, BOOTSTRAP_ROLE, action, target, detail[:2000])
        await self._security.append_audit(event)


def _depth(tenant: TenantRecord, config: FederationConfig) -> int:
    parents = {t.name: t.parent for t in config.tenants}
    depth, name = 0, tenant.parent
    while name is not None and depth <= len(parents):  # the config's tree check ruled out cycles
        depth, name = depth + 1, parents.get(name)
    return depth


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)


def _read_token(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


def _new_token_file(path: Path) -> str:
    token = secrets.token_urlsafe(32)
    # Created 0600, never readable by others even for a moment.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


async def _seeded(store: KvStore) -> _Seeded:
    held = await store.kv.get(SEEDED_KEY)
    if held is not None:
        return _Seeded.from_json(held.value)
    # A store bootstrapped before this record existed: what it holds counts as seeded, so nothing an
    # admin deleted or revoked back then comes back either.
    return _Seeded(
        tenants={t.name for t in await store.list_tenants()},
        users={u.name for u in await store.list_users()},
    )


async def _config_sections(store: KvStore, config: FederationConfig, audit: _Audit) -> None:
    """The sections only the config sets: written when they differ from what is stored."""
    if await store.get_settings() != config.settings:
        await store.put_settings(config.settings)
        await audit("settings_set", "scheduling", "from the config file")
    for cluster in config.clusters:
        if await store.get_cluster(cluster.name) != cluster:
            await store.put_cluster(cluster)
            await audit("cluster_set", cluster.name, "from the config file")
    directory = StoreDirectory(store.kv)
    for object_store in config.object_stores:
        held_store = await directory.get(object_store.name)
        # Compared as stored: `seaweed` only tells `gpufed up` which store to start, and is not kept.
        if held_store is None or store_to_json(held_store) != store_to_json(object_store):
            await directory.put(object_store)
            await audit("object_store_set", object_store.name, "from the config file")
    capacity = CapacityStore(store.kv)
    if await capacity.get_settings() != config.capacity:
        await capacity.put_settings(config.capacity)
        await audit("capacity_settings_set", "capacity", "from the config file")
    if await get_logs_settings(store.kv) != config.logs:
        await put_logs_settings(store.kv, config.logs)
        await audit("logs_settings_set", "logs", "from the config file")
    if await get_datasync(store.kv) != config.datasync:
        await put_datasync(store.kv, config.datasync)
        await audit("datasync_settings_set", "datasync", "from the config file")


async def _user(
    store: KvStore, user: UserRecord, seeded: _Seeded, tenants: Mapping[str, TenantRecord], audit: _Audit
) -> bool:
    """Create the config's user if the store never held it; True if created now."""
    held = await store.get_user(user.name)
    if held is not None:
        if held != user:
            log.warning("bootstrap_kept_stored_user", user=user.name, hint="gpufed admin user set")
        return False
    if user.name in seeded.users:
        log.warning("bootstrap_kept_user_deleted", user=user.name)
        return False
    if user.tenant not in tenants:
        log.warning("bootstrap_skipped_user_without_tenant", user=user.name, tenant=user.tenant)
        return False
    await store.put_user(user)
    seeded.users.add(user.name)
    await audit("user_created", user.name, f"tenant={user.tenant} role={user.role.value}")
    return True


@contextlib.asynccontextmanager
async def _one_at_a_time(kv: KeyValueStore) -> AsyncIterator[None]:
    """Hold the bootstrap lock: a key under a lease, created only where absent.

    Servers that start together (the replicas of one Deployment, a test's pair of servers) each read
    what the store holds and create what is missing: without the lock both found a user missing,
    both created it and both wrote a token file with a different token, each hashed into etcd. The
    lease frees the lock of a server that died holding it after `_LOCK_TTL_S`.
    """
    lease = await kv.grant_lease(_LOCK_TTL_S)
    try:
        wait_s = _LOCK_FIRST_WAIT_S
        while not (
            await kv.txn(
                [Compare.absent(BOOTSTRAP_LOCK_KEY)], [Put(BOOTSTRAP_LOCK_KEY, b"held", lease=lease)]
            )
        ).succeeded:
            await asyncio.sleep(wait_s)
            wait_s = min(_LOCK_MAX_WAIT_S, wait_s * 2)
        yield
    finally:
        # Revoking the lease deletes the key: the next server in line takes it.
        await kv.revoke_lease(lease)


async def bootstrap(store: KvStore, config: FederationConfig, token_dir: Path) -> dict[str, Path]:
    """Apply the config as described above; the token files of the users whose token works now.

    Tokens are kept in `token_dir` (mode 0600); etcd holds only their hashes. A restart reuses the
    files, so users keep working across restarts of the embedded default, unless an admin revoked one.
    Servers bootstrapping at once take turns (`_one_at_a_time`).
    """
    async with _one_at_a_time(store.kv):
        return await _bootstrap(store, config, token_dir)


async def _bootstrap(store: KvStore, config: FederationConfig, token_dir: Path) -> dict[str, Path]:
    security = SecurityStore(store.kv)
    audit = _Audit(security)
    seeded = await _seeded(store)
    await _config_sections(store, config, audit)

    held_tenants: dict[str, TenantRecord] = {t.name: t for t in await store.list_tenants()}
    for tenant in sorted(config.tenants, key=lambda t: _depth(t, config)):  # parents first
        held = held_tenants.get(tenant.name)
        if held is not None:
            if held != tenant:
                log.warning(
                    "bootstrap_kept_stored_tenant", tenant=tenant.name, hint="gpufed admin tenant set"
                )
        elif tenant.name in seeded.tenants:
            log.warning("bootstrap_kept_tenant_deleted", tenant=tenant.name)
        elif tenant.parent is not None and tenant.parent not in held_tenants:
            log.warning("bootstrap_skipped_tenant_without_parent", tenant=tenant.name, parent=tenant.parent)
        else:
            await store.put_tenant(tenant)
            held_tenants[tenant.name] = tenant
            seeded.tenants.add(tenant.name)
            await audit("tenant_created", tenant.name, "from the config file")

    _private_dir(token_dir)
    paths: dict[str, Path] = {}
    for user in config.users:
        path = token_dir / f"{user.name}.token"
        if not await _user(store, user, seeded, held_tenants, audit):
            # The user was there before: its token is whatever admins left. A token of its file
            # that etcd no longer holds was revoked (or expired) and stays so.
            kept = _read_token(path)
            if kept is not None and await security.get_token(kept) is not None:
                paths[user.name] = path
            elif kept is not None:
                log.warning("bootstrap_kept_token_revoked", user=user.name, file=str(path))
            continue
        # A user created now: its token file (kept from before, if etcd was wiped), hashed into etcd.
        token = _read_token(path) or _new_token_file(path)
        token_id = token_hash(token)[:TOKEN_ID_DIGITS]
        record = TokenRecord(token_id, user.name, issued_by=BOOTSTRAP_USER, issued_at_s=time.time())
        await security.put_token(token, record)
        await audit("token_issued", user.name, f"token_id={token_id} file={path.name}")
        paths[user.name] = path
    await store.kv.put(SEEDED_KEY, seeded.to_json())
    if audit.count:
        log.info("bootstrap_finished", changes=audit.count)
    return paths
