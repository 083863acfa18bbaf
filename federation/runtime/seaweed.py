"""The object stores `gpufed up` runs itself: one local SeaweedFS (`weed mini`) per `seaweed:` name in
the config's `objectStores:`, each on free loopback ports with an S3 identity of its own.

The embedded default names two servers, one standing in for the private data centre's store and one
for the public clouds' stores, so that staging a dataset for a cloud cluster really crosses between two
S3 endpoints. Each store's record is rewritten to the server's endpoint and to the two environment
variables that carry its keys; the variables are set in this process only (the server reads them when
it opens the store), and the secret itself stays in the server's data dir (mode 0600), as tokens do.
`<state-dir>/stores.json` says, without secrets, where each store is (for people and tests).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import structlog

from clusters.files import write_atomically
from datasync.seaweed_process import SeaweedProcess
from datasync.store_config import S3StoreConfig
from federation.datasets.stores import StoreRecord

log = structlog.get_logger("gpufed.embedded")

STORES_FILE = "stores.json"


def seaweed_dir(state_dir: Path, server: str) -> Path:
    return state_dir / "seaweed" / server


def key_env(server: str) -> tuple[str, str]:
    stem = "GPUFED_SEAWEED_" + server.upper().replace("-", "_")
    return f"{stem}_KEY_ID", f"{stem}_SECRET"


class EmbeddedStores:
    def __init__(
        self, state_dir: Path, records: Sequence[StoreRecord], *, s3_ports: Mapping[str, int] | None = None
    ) -> None:
        self._state_dir = state_dir
        self._records = tuple(records)
        # The S3 port chosen for a server (`gpufed up --store-port NAME=PORT`); others pick free ones.
        self._s3_ports = dict(s3_ports or {})
        self._servers: dict[str, SeaweedProcess] = {}

    @property
    def needed(self) -> bool:
        return any(r.seaweed for r in self._records)

    @property
    def servers(self) -> set[str]:
        """The `seaweed:` servers the records name."""
        return {r.seaweed for r in self._records if r.seaweed is not None}

    async def start(self) -> tuple[StoreRecord, ...]:
        """Start every server the records name; return the records pointing at them.

        Side by side: each server takes about 2 s to start, and none needs another. Each on asyncio's
        default executor, whose threads last as long as the loop (as `gpufed up` does): a child dies
        with the thread that spawned it (`datasync.child_guard`), so a short-lived pool's thread would
        take its weed with it. Every start runs to its end before a failure stops them all (stopping
        one that never started is a no-op)."""
        buckets: dict[str, list[str]] = {}
        for r in self._records:
            if r.seaweed is not None and isinstance(r.config, S3StoreConfig):
                buckets.setdefault(r.seaweed, []).append(r.config.bucket)
        for server, names in sorted(buckets.items()):
            self._servers[server] = SeaweedProcess(
                seaweed_dir(self._state_dir, server),
                buckets=sorted(set(names)),
                s3_port=self._s3_ports.get(server),
            )
        outcomes = await asyncio.gather(
            *(asyncio.to_thread(process.start) for process in self._servers.values()),
            return_exceptions=True,
        )
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if failures:
            await asyncio.to_thread(self.stop)
            raise failures[0]
        for server, process in self._servers.items():
            key_var, secret_var = key_env(server)
            os.environ[key_var] = process.access_key_id
            os.environ[secret_var] = process.secret_access_key
            log.info("object_store_started", server=server, endpoint=process.endpoint, pid=process.pid)
        out = []
        for r in self._records:
            serving = self._servers.get(r.seaweed or "")
            if serving is None or not isinstance(r.config, S3StoreConfig):
                out.append(r)
                continue
            key_var, secret_var = key_env(r.seaweed or "")
            config = S3StoreConfig(
                r.config.bucket,
                endpoint=serving.endpoint,
                region="us-east-1",
                access_key_id_env=key_var,
                secret_access_key_env=secret_var,
            )
            out.append(replace(r, config=config))
        self._write_index(out)
        return tuple(out)

    def _write_index(self, records: Sequence[StoreRecord]) -> None:
        index = {
            r.name: {
                "endpoint": r.config.endpoint,
                "bucket": r.config.bucket,
                "access_key_id_env": r.config.access_key_id_env,
                "secret_access_key_env": r.config.secret_access_key_env,
                "seaweed_dir": str(seaweed_dir(self._state_dir, r.seaweed or "")),
            }
            for r in records
            if r.seaweed is not None and isinstance(r.config, S3StoreConfig)
        }
        write_atomically(self._state_dir / STORES_FILE, json.dumps(index, indent=2, sort_keys=True))

    def stop(self) -> None:
        # Side by side: SeaweedFS takes about 2 s to shut down (its filer and volume server flush). Any
        # thread may stop a child, unlike start (see `start`).
        with ThreadPoolExecutor(max_workers=max(1, len(self._servers))) as pool:
            stops = {server: pool.submit(process.stop) for server, process in self._servers.items()}
        self._servers.clear()
        (self._state_dir / STORES_FILE).unlink(missing_ok=True)
        # Every server's outcome is logged before the first failure is raised.
        first_failure: BaseException | None = None
        for server, stop in stops.items():
            error = stop.exception()
            if error is None:
                log.info("object_store_stopped", server=server)
            else:
                log.error("object_store_stop_failed", server=server, error=str(error))
                first_failure = first_failure or error
        if first_failure is not None:
            raise first_failure
