"""Object stores as the federation knows them: the config's `objectStores:` section, their etcd records,
and the store clients a server opens from them.

A store's record holds no secret: credentials come from environment variables (or files) the record
names, read on the server when the client is built (see docs/datasync.md). The config keys are datasync's
store keys in the config file's camelCase (`accessKeyIdEnv` for `access_key_id_env`), plus two of
federation's: `capacityGiB` (the cache's size there; unset: unbounded), `seaweed` (only under `gpufed
up`: a local SeaweedFS server of that name serves the store's bucket; stores naming one server share it)
and `datasetPrefixes` (who may register what there: `federation.datasets.grants`).

Key: /gpufed/stores/<name> -> {"config": {...datasync keys...}, "capacity_bytes": int | null}
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from datasync import DatasyncError, ObjectStore, StoreConfig, open_store, parse_store_config
from federation.datasets.grants import DEFAULT_PREFIXES, parse_dataset_prefixes
from federation.errors import InvalidSpec, NotFound
from federation.spec.validate import name_field, number_field, shown
from federation.store.kv import KeyValueStore
from federation.store.schema_version import checked, dumps

log = structlog.get_logger("gpufed.stores")

STORES = b"/gpufed/stores/"
_KIND_OF = {
    "S3StoreConfig": "s3",
    "GcsStoreConfig": "gcs",
    "AzureStoreConfig": "azure",
    "LocalStoreConfig": "local",
    "MemoryStoreConfig": "memory",
}
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


@dataclass(frozen=True, slots=True)
class StoreRecord:
    name: str
    config: StoreConfig
    # The most the federation's cached copies may take there (None: no limit).
    capacity_bytes: int | None = None
    # `gpufed up` only: the local SeaweedFS server that serves this store.
    seaweed: str | None = None
    # Where each tenant (or '*') may register datasets in this store (`federation.datasets.grants`).
    dataset_prefixes: tuple[tuple[str, tuple[str, ...]], ...] = DEFAULT_PREFIXES


def config_doc(config: StoreConfig) -> dict[str, Any]:
    doc = {k: v for k, v in dataclasses.asdict(config).items() if v is not None}
    return {"kind": _KIND_OF[type(config).__name__], **doc}


def parse_object_stores(doc: Mapping[str, Any]) -> tuple[StoreRecord, ...]:
    section = doc.get("objectStores")
    section = {} if section is None else section
    if not isinstance(section, dict):
        raise InvalidSpec("objectStores", "must be a mapping of store name to its keys")
    records = []
    for raw_name, raw in section.items():
        at = f"objectStores.{raw_name}"
        name = name_field(raw_name, at)
        if not isinstance(raw, dict):
            raise InvalidSpec(at, f"must be a mapping with kind and the store's keys, got {shown(raw)}")
        keys = {_CAMEL.sub("_", str(k)).lower(): v for k, v in raw.items()}
        capacity = keys.pop("capacity_gi_b", None)
        seaweed = keys.pop("seaweed", None)
        prefixes = parse_dataset_prefixes(keys.pop("dataset_prefixes", None), f"{at}.datasetPrefixes")
        if seaweed is not None:
            seaweed = name_field(seaweed, f"{at}.seaweed")
            if keys.get("kind") != "s3":
                raise InvalidSpec(f"{at}.seaweed", "serves only stores of kind s3")
        try:
            config = parse_store_config(keys)
        except DatasyncError as error:
            raise InvalidSpec(at, str(error)) from error
        records.append(
            StoreRecord(
                name=name,
                config=config,
                capacity_bytes=None
                if capacity is None
                else int(number_field(capacity, f"{at}.capacityGiB", minimum=0) * 2**30),
                seaweed=seaweed,
                dataset_prefixes=prefixes,
            )
        )
    return tuple(records)


def check_cluster_stores(
    cluster_stores: Sequence[tuple[str, str | None]], stores: Sequence[StoreRecord]
) -> None:
    """Every cluster's `objectStore` must be configured once any store is: staging needs somewhere to go."""
    if not stores:
        return
    known = {s.name for s in stores}
    for i, (_cluster, store) in enumerate(cluster_stores):
        if store is not None and store not in known:
            raise InvalidSpec(
                f"clusters[{i}].objectStore",
                f"{store!r} is not under objectStores ({', '.join(sorted(known))})",
            )


def store_to_json(s: StoreRecord) -> bytes:
    doc: dict[str, Any] = {"config": config_doc(s.config), "capacity_bytes": s.capacity_bytes}
    if s.dataset_prefixes != DEFAULT_PREFIXES:
        doc["dataset_prefixes"] = {t: list(p) for t, p in s.dataset_prefixes}
    return dumps(doc, sort_keys=True)


def store_from_json(name: str, value: bytes) -> StoreRecord:
    d = json.loads(value)
    capacity = d.get("capacity_bytes")
    held = d.get("dataset_prefixes")
    prefixes = (
        DEFAULT_PREFIXES
        if held is None
        else tuple(sorted((str(t), tuple(str(x) for x in p)) for t, p in held.items()))
    )
    return StoreRecord(
        name,
        parse_store_config(d["config"]),
        None if capacity is None else int(capacity),
        dataset_prefixes=prefixes,
    )


class StoreDirectory:
    """Store records in etcd, and one client per store, opened on first use and kept."""

    def __init__(self, kv: KeyValueStore, env: Mapping[str, str] | None = None) -> None:
        self._kv = kv
        self._env = env
        self._clients: dict[str, tuple[StoreRecord, ObjectStore]] = {}

    async def put(self, record: StoreRecord) -> None:
        await self._kv.put(STORES + record.name.encode(), store_to_json(record))

    async def get(self, name: str) -> StoreRecord | None:
        kv = await self._kv.get(STORES + name.encode())
        return None if kv is None else store_from_json(name, checked(kv.value, kv.key))

    async def list(self) -> list[StoreRecord]:
        page = await self._kv.range_prefix(STORES)
        return [store_from_json(kv.key[len(STORES) :].decode(), checked(kv.value, kv.key)) for kv in page.kvs]

    async def require(self, name: str, field: str = "store") -> StoreRecord:
        record = await self.get(name)
        if record is None:
            raise NotFound(f"{field}: object store {shown(name)} is not configured")
        return record

    async def client(self, name: str) -> ObjectStore:
        """The store's client; rebuilt when its record changed (a new endpoint after `gpufed up` restarts)."""
        record = await self.require(name)
        held = self._clients.get(name)
        if held is not None and held[0] == record:
            return held[1]
        store = open_store(name, record.config, env=self._env)
        self._clients[name] = (record, store)
        if held is not None:
            await held[1].close()
        return store

    async def close(self) -> None:
        for _record, store in self._clients.values():
            await store.close()
        self._clients.clear()
