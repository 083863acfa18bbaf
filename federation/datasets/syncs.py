"""Sync records: one per (target store, dataset, version), the shared view of a copy in progress.

The API writes a request (a user's `gpufed dataset sync`, or the dispatcher when an admitted job's data
is not where it will run); the leader's stager runs it and rewrites the record with the plan (bytes and
egress estimate, before copying), then progress about once a second, then `done` or `failed` with the
reason. Any server answers status calls from these records, so progress is visible whoever leads.

Key: /gpufed/syncs/<store>/<name>/<version>
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from enum import StrEnum

from datasync import DatasetVersion
from federation.store.kv import Compare, KeyValueStore, Put
from federation.store.schema_version import loads, unversioned

SYNCS = b"/gpufed/syncs/"


class SyncState(StrEnum):
    REQUESTED = "requested"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    # The copy was evicted after this sync: what it copied is gone, and nothing is verified any more.
    EVICTED = "evicted"

    @property
    def active(self) -> bool:
        return self in (SyncState.REQUESTED, SyncState.RUNNING)


@dataclass(frozen=True, slots=True)
class SyncRecord:
    dataset: str
    version: str
    store: str
    source_store: str
    state: SyncState
    updated_at_s: float
    job_ids: tuple[str, ...] = ()
    bytes_done: int = 0
    bytes_total: int = 0
    objects_done: int = 0
    objects_total: int = 0
    rate_bytes_per_s: float = 0.0
    eta_s: float | None = None
    elapsed_s: float = 0.0
    # The plan, known before any byte moves.
    bytes_to_copy: int = 0
    objects_to_copy: int = 0
    egress_usd: float = 0.0
    egress_usd_per_gb: float = 0.0
    bytes_copied: int = 0
    # What this run did, by kind (datasync's `SyncProgress`): objects found up to date, copied from the
    # source, reused server-side from another version's copy in the target store, failed; bytes that
    # passed through this process, were copied inside the target's endpoint, reused, or resumed from a
    # killed run's uploaded parts. The rate counts transferred bytes only.
    objects_up_to_date: int = 0
    objects_copied: int = 0
    objects_reused: int = 0
    objects_failed: int = 0
    bytes_transferred: int = 0
    bytes_server_copied: int = 0
    bytes_reused: int = 0
    bytes_resumed: int = 0
    verified: bool = False
    error: str = ""
    # Whether trying again may help (a timeout) or not (the source object is gone).
    retryable: bool = False

    def with_job(self, job_id: str) -> SyncRecord:
        return self if job_id in self.job_ids else replace(self, job_ids=(*self.job_ids, job_id))

    @classmethod
    def requested(cls, version: DatasetVersion, store: str, now_s: float) -> SyncRecord:
        """A sync of `version` from its home store to `store`, asked for and not yet planned: the
        one shape both staging (for a job) and the API (for a user) start a sync from."""
        return cls(
            dataset=version.dataset,
            version=version.version,
            store=store,
            source_store=version.home.store,
            state=SyncState.REQUESTED,
            updated_at_s=now_s,
            bytes_total=version.size_bytes,
            objects_total=version.object_count,
        )


def sync_key(store: str, dataset: str, version: str) -> bytes:
    return SYNCS + f"{store}/{dataset}/{version}".encode()


def encode_record(r: SyncRecord) -> bytes:
    return _to_json(r)


def _to_json(r: SyncRecord) -> bytes:
    d = asdict(r)
    d["state"] = r.state.value
    d["job_ids"] = list(r.job_ids)
    # Unversioned (version 0): the build before schema versions decodes sync records with
    # `SyncRecord(**doc)`, which refuses a key it does not know (federation.store.schema_version).
    return json.dumps(d, sort_keys=True).encode()


def _from_json(value: bytes, key: bytes | None = None) -> SyncRecord:
    d = unversioned(loads(value, key))
    d["state"] = SyncState(d["state"])
    d["job_ids"] = tuple(d["job_ids"])
    return SyncRecord(**d)


class SyncRecords:
    def __init__(self, kv: KeyValueStore) -> None:
        self._kv = kv

    async def get(self, store: str, dataset: str, version: str) -> tuple[SyncRecord, int] | None:
        kv = await self._kv.get(sync_key(store, dataset, version))
        return None if kv is None else (_from_json(kv.value, kv.key), kv.mod_revision)

    async def list(self, store: str | None = None, dataset: str | None = None) -> list[SyncRecord]:
        prefix = SYNCS if store is None else SYNCS + f"{store}/".encode()
        page = await self._kv.range_prefix(prefix)
        records = [_from_json(kv.value, kv.key) for kv in page.kvs]
        return [r for r in records if dataset is None or r.dataset == dataset]

    async def put(self, record: SyncRecord, *, expect_revision: int | None = -1) -> bool:
        """Write the record; expect_revision None: only if absent; -1: unconditionally."""
        key = sync_key(record.store, record.dataset, record.version)
        if expect_revision == -1:
            await self._kv.put(key, _to_json(record))
            return True
        compare = (
            Compare.absent(key) if expect_revision is None else Compare.mod_revision_is(key, expect_revision)
        )
        return (await self._kv.txn([compare], [Put(key, _to_json(record))])).succeeded

    async def request(self, record: SyncRecord, job_id: str | None = None) -> SyncRecord:
        """Ask for a sync, unless one is already asked for or running (then join it). CAS-retried."""
        for _ in range(5):
            held = await self.get(record.store, record.dataset, record.version)
            if held is not None and held[0].state.active:
                current = held[0] if job_id is None else held[0].with_job(job_id)
                if current is held[0] or await self.put(current, expect_revision=held[1]):
                    return current
                continue
            fresh = record if job_id is None else record.with_job(job_id)
            if await self.put(fresh, expect_revision=None if held is None else held[1]):
                return fresh
        return record
