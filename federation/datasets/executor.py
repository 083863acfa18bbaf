"""Where a staging sync's copies run: in the leader's event loop (the default), or split into shards that
Ray workers execute, when one machine's bandwidth is not enough. Chosen by the config's `datasync:`
section, stored in etcd at bootstrap like the other sections:

```yaml
datasync:
  executor: ray             # local (default) or ray
  rayAddress: auto          # ray only: an existing cluster ("auto", "ray://head:10001"); unset: start
                            # a Ray on this machine, on loopback
  shardBytes: 1073741824    # ray only: about this many bytes per shard (default 1 GiB)
  maxShards: 16             # ray only: at most this many shards per sync
  cpusPerShard: 1           # ray only: the CPUs each shard's task reserves
  scrubIntervalSeconds: 600 # the leader re-reads and re-hashes one cached copy this often (the one
                            # verified longest ago) and repairs what it finds bad; 0: no scrub
  fenceTtlSeconds: 30       # the lease of a copy's fence (federation.datasets.fence): a holder that
                            # died (a crashed leader's sync) keeps the copy busy for up to this long
  maxBytesPerSecond: 0      # local executor: each sync's copying is capped at this rate (a token
                            # bucket), so that staging leaves a shared link to the jobs; 0: no cap
```

Ray is imported, and started or joined, only when a sync actually copies through it: a federation on
the local executor never imports ray, and one on Ray pays its start (about 5 s) once, at the first sync.
Planning, the marker, deletions, progress and the sync record stay with the leader (`run_sync`); the
workers build their own store clients from the store configs, so the credentials those configs name must
be in the workers' environment (a Ray started here inherits the server's).

Key: /gpufed/datasync -> {"executor", "ray_address", "shard_bytes", "max_shards", "cpus_per_shard",
                          "scrub_interval_s", "fence_ttl_s", "max_bytes_per_s"}
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import structlog

from datasync.plan import SyncPlan
from datasync.ray_executor import RayExecutor
from datasync.sync import Executor
from datasync.transfer import SyncOptions
from federation.datasets.stores import StoreRecord
from federation.errors import InvalidSpec
from federation.spec.validate import int_field, number_field, shown
from federation.store.kv import KeyValueStore
from federation.store.schema_version import checked, dumps

log = structlog.get_logger("gpufed.staging")

SETTINGS_KEY = b"/gpufed/datasync"
KEYS = (
    "executor",
    "rayAddress",
    "shardBytes",
    "maxShards",
    "cpusPerShard",
    "scrubIntervalSeconds",
    "fenceTtlSeconds",
    "maxBytesPerSecond",
)
GIB = 2**30


class ExecutorKind(StrEnum):
    LOCAL = "local"
    RAY = "ray"


@dataclass(frozen=True, slots=True)
class DatasyncSettings:
    executor: ExecutorKind = ExecutorKind.LOCAL
    # None: start a Ray on this machine (loopback only); else the address ray.init connects to.
    ray_address: str | None = None
    shard_bytes: int = GIB
    max_shards: int = 16
    cpus_per_shard: float = 1.0
    # One cached copy re-hashed (and repaired) this often; 0 turns the scrub off.
    scrub_interval_s: float = 600.0
    # The lease of a copy's fence (federation.datasets.fence), kept alive while its holder works: long
    # enough that a busy event loop does not lose it between keepalives, and how long a holder that
    # died (a crashed leader's sync) keeps the copy busy before the next one may start.
    fence_ttl_s: int = 30
    # A cap on each local sync's copying rate; 0: none. Ray's shards are not capped (they run where
    # one machine's bandwidth is not enough).
    max_bytes_per_s: float = 0.0

    def sync_options(self) -> SyncOptions | None:
        """The local sync's options these settings imply (None: datasync's defaults)."""
        return SyncOptions(bandwidth_bytes_per_s=self.max_bytes_per_s) if self.max_bytes_per_s > 0 else None


def parse_datasync(doc: dict[str, Any]) -> DatasyncSettings:
    section = doc.get("datasync")
    if section is None:
        return DatasyncSettings()
    if not isinstance(section, dict):
        raise InvalidSpec("datasync", f"must be a mapping, got {shown(section)}")
    for key in section:
        if key not in KEYS:
            raise InvalidSpec(f"datasync.{key}", f"is not a datasync setting (known: {', '.join(KEYS)})")
    try:
        kind = ExecutorKind(section.get("executor", "local"))
    except ValueError as error:
        known = ", ".join(k.value for k in ExecutorKind)
        raise InvalidSpec(
            "datasync.executor", f"must be one of {known}, got {shown(section['executor'])}"
        ) from error
    address = section.get("rayAddress")
    if address is not None and (not isinstance(address, str) or not address.strip()):
        raise InvalidSpec("datasync.rayAddress", f"must be an address such as 'auto', got {shown(address)}")
    defaults = DatasyncSettings()
    return DatasyncSettings(
        executor=kind,
        ray_address=address,
        shard_bytes=int_field(
            section.get("shardBytes", defaults.shard_bytes), "datasync.shardBytes", minimum=1
        ),
        max_shards=int_field(section.get("maxShards", defaults.max_shards), "datasync.maxShards", minimum=1),
        cpus_per_shard=number_field(
            section.get("cpusPerShard", defaults.cpus_per_shard), "datasync.cpusPerShard", minimum=0
        ),
        scrub_interval_s=number_field(
            section.get("scrubIntervalSeconds", defaults.scrub_interval_s),
            "datasync.scrubIntervalSeconds",
            minimum=0,
        ),
        # etcd grants no lease shorter than about 2 s (its election timeout's worth of heartbeats).
        fence_ttl_s=int_field(
            section.get("fenceTtlSeconds", defaults.fence_ttl_s), "datasync.fenceTtlSeconds", minimum=2
        ),
        max_bytes_per_s=number_field(
            section.get("maxBytesPerSecond", defaults.max_bytes_per_s),
            "datasync.maxBytesPerSecond",
            minimum=0,
        ),
    )


def settings_to_json(s: DatasyncSettings) -> bytes:
    return dumps(
        {
            "executor": s.executor.value,
            "ray_address": s.ray_address,
            "shard_bytes": s.shard_bytes,
            "max_shards": s.max_shards,
            "cpus_per_shard": s.cpus_per_shard,
            "scrub_interval_s": s.scrub_interval_s,
            "fence_ttl_s": s.fence_ttl_s,
            "max_bytes_per_s": s.max_bytes_per_s,
        },
        sort_keys=True,
    )


def settings_from_json(value: bytes) -> DatasyncSettings:
    d = json.loads(value)
    return DatasyncSettings(
        executor=ExecutorKind(d["executor"]),
        ray_address=d.get("ray_address"),
        shard_bytes=int(d["shard_bytes"]),
        max_shards=int(d["max_shards"]),
        cpus_per_shard=float(d["cpus_per_shard"]),
        scrub_interval_s=float(d.get("scrub_interval_s", DatasyncSettings().scrub_interval_s)),
        fence_ttl_s=int(d.get("fence_ttl_s", DatasyncSettings().fence_ttl_s)),
        max_bytes_per_s=float(d.get("max_bytes_per_s", 0.0)),
    )


async def put_settings(kv: KeyValueStore, settings: DatasyncSettings) -> None:
    await kv.put(SETTINGS_KEY, settings_to_json(settings))


async def get_settings(kv: KeyValueStore) -> DatasyncSettings:
    """The stored section; the defaults (local) for a federation bootstrapped before it existed."""
    held = await kv.get(SETTINGS_KEY)
    return DatasyncSettings() if held is None else settings_from_json(checked(held.value, held.key))


def shard_count(settings: DatasyncSettings, copy_bytes: int) -> int:
    return max(1, min(settings.max_shards, math.ceil(copy_bytes / settings.shard_bytes)))


class Executors:
    """The executor for each sync the leader runs; owns the Ray connection when it made one."""

    def __init__(self, settings: DatasyncSettings, *, journal_dir: Path) -> None:
        self.settings = settings
        self._journal_dir = journal_dir
        self._ray_lock = asyncio.Lock()
        self._ray_ready = False
        self._started_ray = False

    async def for_sync(self, plan: SyncPlan, source: StoreRecord, target: StoreRecord) -> Executor | None:
        """The executor for `plan` (None: datasync's local one)."""
        if self.settings.executor is ExecutorKind.LOCAL or not plan.to_copy:
            # Nothing to copy (a resumed or no-op sync) never starts Ray.
            return None
        await self._ensure_ray()
        shards = shard_count(self.settings, plan.copy_bytes)
        log.info("sync_sharded", target=target.name, shards=shards, bytes_to_copy=plan.copy_bytes)
        return RayExecutor(
            source_name=source.name,
            source=source.config,
            target_name=target.name,
            target=target.config,
            shard_count=shards,
            # A shard's journal is on its worker: under our state dir only when the workers are ours.
            journal_dir=self._journal_dir / "ray" if self.settings.ray_address is None else None,
            num_cpus_per_shard=self.settings.cpus_per_shard,
        )

    async def _ensure_ray(self) -> None:
        async with self._ray_lock:
            if self._ray_ready:
                return
            await asyncio.to_thread(self._init_ray)
            self._ray_ready = True

    def _init_ray(self) -> None:
        import ray

        if ray.is_initialized():  # someone in this process (a test session) already joined one
            return
        address = self.settings.ray_address
        if address is None:
            # A Ray of our own must not listen beyond this machine nor ask its workers for a token.
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
        self._started_ray = True
        log.info("ray_joined", address=address or "local")

    async def close(self) -> None:
        if self._started_ray:
            import ray

            await asyncio.to_thread(ray.shutdown)
            self._started_ray = self._ray_ready = False
