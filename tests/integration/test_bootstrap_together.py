"""Servers that start at once on one etcd (the replicas of a Deployment) bootstrap the config once:
each user is created once, with one token, written by the one server that created it. Without the
bootstrap lock, two of them both found a user missing, and each created it and wrote its own token
file (seen in the HA crash test once its two servers started together)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from federation.runtime.bootstrap import bootstrap
from federation.runtime.config import parse_config
from federation.runtime.embedded import default_config_path
from federation.runtime.etcd_process import EtcdProcess
from federation.security.tokens import SecurityStore
from federation.store.job_store import KvStore
from federation.store.kv_etcd import EtcdKv
from tests.etcdctl import count_keys, keys

pytestmark = pytest.mark.integration

SERVERS = 3


def _token_files(root: Path) -> dict[str, str]:
    """Every token file the servers wrote, by file name (a name twice would be one user twice)."""
    found: dict[str, str] = {}
    for path in root.glob("server-*/*.token"):
        assert path.name not in found, f"two servers wrote {path.name}"
        found[path.name] = path.read_text().strip()
    return found


async def test_servers_bootstrapping_at_once_create_each_user_once_with_one_token(
    etcd_kv: EtcdKv, etcd_process: EtcdProcess, tmp_path: Path
) -> None:
    config = parse_config(default_config_path().read_text())
    kvs = [await EtcdKv.connect(etcd_process.endpoint) for _ in range(SERVERS)]
    try:
        await asyncio.gather(
            *(bootstrap(KvStore(kv), config, tmp_path / f"server-{i}") for i, kv in enumerate(kvs))
        )
    finally:
        for kv in kvs:
            await kv.close()
    files = _token_files(tmp_path)
    assert sorted(files) == sorted(f"{u.name}.token" for u in config.users), files
    store = KvStore(etcd_kv)
    for name, token in files.items():
        user = await store.resolve_token(token)
        assert user is not None
        assert f"{user.name}.token" == name
    trail = await SecurityStore(etcd_kv).list_audit()
    created = [e.target for e in trail if e.action == "user_created"]
    issued = [e.target for e in trail if e.action == "token_issued"]
    assert sorted(created) == sorted(u.name for u in config.users)
    assert sorted(issued) == sorted(created)
    # The lock is gone with its holder's lease, as etcdctl (an independent client) sees it, and
    # etcd holds one token hash per user.
    assert await asyncio.to_thread(keys, etcd_process.endpoint, "/gpufed/locks/") == []
    assert await asyncio.to_thread(count_keys, etcd_process.endpoint, "/gpufed/tokens/") == len(config.users)
