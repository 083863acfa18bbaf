"""Who may register which data: the object prefixes granted to each tenant, per store.

The server reads a registered prefix with its own credentials, so without grants any member could
register another tenant's unshared data (or gpufed's own cache) as a dataset of its own, copy it to a
cloud store and run jobs on it. A member registers only under a prefix granted to its tenant; admins
register anything. No one registers under the reserved roots (`gpufed-cache/`, `.gpufed/`): see
`federation.datasets.registry.prefix_field`.

The config grants them per store (`objectStores.<store>.datasetPrefixes`, tenant or `"*"` to a list of
prefixes in which `{tenant}` stands for the tenant's name); a store that says nothing grants every
tenant `{tenant}/`. Admins replace one tenant's prefixes in one store through `SetDatasetGrant`
(audited); that record wins over the config until the admin clears it (an empty list).

Key: /gpufed/dataset-grants/<store>/<tenant> -> {"prefixes": [...], "by": user, "at_s": float}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from federation.datasets.registry import prefix_field
from federation.errors import InvalidSpec
from federation.spec.validate import name_field, shown
from federation.store.kv import KeyValueStore
from federation.store.schema_version import dumps, loads

GRANTS = b"/gpufed/dataset-grants/"
ANY_TENANT = "*"
TENANT_SLOT = "{tenant}"
DEFAULT_PREFIXES: tuple[tuple[str, tuple[str, ...]], ...] = ((ANY_TENANT, (TENANT_SLOT + "/",)),)
MAX_PREFIXES = 50


@dataclass(frozen=True, slots=True)
class Grant:
    store: str
    tenant: str
    prefixes: tuple[str, ...]
    source: str  # "config" or "admin"


def parse_dataset_prefixes(raw: Any, at: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The config's `datasetPrefixes` of one store: tenant (or '*') -> prefix templates."""
    if raw is None:
        return DEFAULT_PREFIXES
    if not isinstance(raw, dict):
        raise InvalidSpec(at, f"must map a tenant (or '*') to a list of prefixes, got {shown(raw)}")
    out = []
    for tenant, prefixes in raw.items():
        where = f"{at}.{tenant}"
        if tenant != ANY_TENANT:
            name_field(tenant, where)
        if not isinstance(prefixes, list) or len(prefixes) > MAX_PREFIXES:
            raise InvalidSpec(
                where, f"must be a list of at most {MAX_PREFIXES} prefixes, got {shown(prefixes)}"
            )
        checked = []
        for i, template in enumerate(prefixes):
            if not isinstance(template, str):
                raise InvalidSpec(f"{where}[{i}]", f"must be a prefix, got {shown(template)}")
            # Checked with a sample tenant: the template must make a legal, unreserved prefix.
            prefix_field(template.replace(TENANT_SLOT, "tenant"), f"{where}[{i}]")
            checked.append(template if template.endswith("/") else template + "/")
        out.append((str(tenant), tuple(checked)))
    return tuple(sorted(out))


def config_grant(store: str, tenant: str, configured: Sequence[tuple[str, tuple[str, ...]]]) -> Grant:
    table = dict(configured)
    templates = table.get(tenant, table.get(ANY_TENANT, ()))
    return Grant(store, tenant, tuple(t.replace(TENANT_SLOT, tenant) for t in templates), "config")


def allows(prefixes: Sequence[str], prefix: str) -> bool:
    """Whether `prefix` (ending in '/') lies under one of `prefixes`, segment by segment."""
    return any(prefix.startswith(p if p.endswith("/") else p + "/") for p in prefixes)


def _key(store: str, tenant: str) -> bytes:
    return GRANTS + f"{store}/{tenant}".encode()


class GrantDirectory:
    """Admins' grants in etcd, over the config's (carried by each store's record)."""

    def __init__(self, kv: KeyValueStore) -> None:
        self._kv = kv

    async def admin_grants(self, store: str | None = None) -> dict[tuple[str, str], tuple[str, ...]]:
        prefix = GRANTS if store is None else GRANTS + f"{store}/".encode()
        page = await self._kv.range_prefix(prefix)
        out = {}
        for kv in page.kvs:
            s, t = kv.key[len(GRANTS) :].decode().split("/", 1)
            out[(s, t)] = tuple(str(p) for p in loads(kv.value, kv.key)["prefixes"])
        return out

    async def effective(
        self, store: str, tenant: str, configured: Sequence[tuple[str, tuple[str, ...]]]
    ) -> Grant:
        held = await self._kv.get(_key(store, tenant))
        if held is not None:
            prefixes = tuple(str(p) for p in loads(held.value, held.key)["prefixes"])
            return Grant(store, tenant, prefixes, "admin")
        return config_grant(store, tenant, configured)

    async def set(self, store: str, tenant: str, prefixes: Sequence[str], *, by: str, at_s: float) -> None:
        """Replace the tenant's prefixes in the store (empty: drop the admin's record, the config's apply)."""
        if not prefixes:
            await self._kv.delete(_key(store, tenant))
            return
        body = {"prefixes": list(prefixes), "by": by, "at_s": at_s}
        await self._kv.put(_key(store, tenant), dumps(body, sort_keys=True))


def grant_rows(
    stores: Mapping[str, Sequence[tuple[str, tuple[str, ...]]]],
    admin: Mapping[tuple[str, str], tuple[str, ...]],
    tenants: Sequence[str],
) -> list[Grant]:
    """Every (store, tenant) pair's effective grant, for listing."""
    rows = []
    for store, configured in sorted(stores.items()):
        for tenant in sorted(tenants):
            held = admin.get((store, tenant))
            rows.append(
                Grant(store, tenant, held, "admin")
                if held is not None
                else config_grant(store, tenant, configured)
            )
    return rows
