"""Helpers for the datasync integration tests: two SeaweedFS stores, store clients, and a sync child.

`python -m tests.integration.seaweed sync <args.json>` runs one sync in a child process, so a test can
SIGKILL it mid-transfer and resume it in the parent, as a crashed staging worker would be.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from datasync.journal import LocalJournal
from datasync.manifest import build_manifest
from datasync.plan import plan_sync
from datasync.seaweed_process import SeaweedProcess
from datasync.store import ObjectStore
from datasync.store_config import S3StoreConfig, open_store
from datasync.sync import run_sync
from datasync.transfer import SyncOptions


@dataclass(frozen=True)
class SeaweedStore:
    """How to reach one running SeaweedFS: the config (no secret) and the env holding its keys."""

    name: str
    config: S3StoreConfig
    env: dict[str, str]

    def open(self) -> ObjectStore:
        return open_store(self.name, self.config, env=self.env)


def own_prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix of the test's own on the worker's shared stores: its module's name and its own."""
    module = request.module.__name__.rsplit(".", 1)[-1]
    name = request.node.name.replace("[", "-").rstrip("]")
    return f"{module}/{name}/"


def bucket_bytes(process: SeaweedProcess, bucket: str) -> int:
    """What the bucket's volumes hold on disk: a bucket is a SeaweedFS collection, whose volume files
    are named after it. Deleted objects stay in them until a vacuum, so this counts those too."""
    data = process.data_dir / "data"
    return sum(f.stat().st_size for f in data.glob(f"{bucket}_*.dat"))


def empty_big_buckets(process: SeaweedProcess, above_bytes: int) -> list[str]:
    """Delete and create again each of the store's buckets whose volumes hold more than `above_bytes`,
    and return their names. Deleting a bucket drops its collection's volume files at once, where
    deleting its objects would leave them on disk until a vacuum: the worker's shared stores filled
    half a GiB per run of the datasync size tests otherwise (issue 29 asks for 2 GiB at the peak)."""
    emptied = []
    for bucket in process.buckets:
        if bucket_bytes(process, bucket) <= above_bytes:
            continue
        deleted = process.bucket_request("DELETE", bucket)
        created = process.bucket_request("PUT", bucket)
        assert deleted == 204, f"DELETE bucket {bucket}: HTTP {deleted}"
        assert created == 200, f"PUT bucket {bucket}: HTTP {created}"
        emptied.append(bucket)
    return emptied


def store_of(process: SeaweedProcess, name: str, bucket: str) -> SeaweedStore:
    key_var, secret_var = f"{name.upper()}_KEY_ID", f"{name.upper()}_SECRET"
    config = S3StoreConfig(
        bucket,
        endpoint=process.endpoint,
        access_key_id_env=key_var,
        secret_access_key_env=secret_var,
        ca_bundle=str(process.tls.ca) if process.tls is not None else None,  # HTTPS: trust the run's CA
    )
    return SeaweedStore(name, config, {key_var: process.access_key_id, secret_var: process.secret_access_key})


def _child_sync(args: dict[str, object]) -> None:
    async def run() -> None:
        source_keys: dict[str, Any] = args["source"]  # type: ignore[assignment]
        target_keys: dict[str, Any] = args["target"]  # type: ignore[assignment]
        source = SeaweedStore(str(args["source_name"]), S3StoreConfig(**source_keys), dict(os.environ)).open()
        target = SeaweedStore(str(args["target_name"]), S3StoreConfig(**target_keys), dict(os.environ)).open()
        manifest = await build_manifest(source, str(args["source_prefix"]))
        journal = LocalJournal(args["journal"])  # type: ignore[arg-type]
        plan = await plan_sync(
            source, str(args["source_prefix"]), target, str(args["target_prefix"]), manifest, journal=journal
        )
        options = SyncOptions(**args["options"])  # type: ignore[arg-type]
        await run_sync(plan, source, target, options=options, journal=journal)
        await source.close()
        await target.close()

    asyncio.run(run())


if __name__ == "__main__":
    if sys.argv[1] == "sync":
        with open(sys.argv[2]) as f:
            _child_sync(json.load(f))
