"""Bootstrap over the in-memory store (the same KvStore code as on etcd): a second start with the
same config writes nothing and audits nothing; a wiped store is seeded again from the token files."""

from __future__ import annotations

import asyncio
from pathlib import Path

from federation.runtime.bootstrap import BOOTSTRAP_LOCK_KEY, bootstrap
from federation.runtime.config import parse_config
from federation.runtime.embedded import default_config_path
from federation.security.tokens import SecurityStore
from federation.store.job_store import KvStore
from federation.store.kv_memory import MemoryKv


def _trail(store: KvStore) -> list[tuple[str, str, str]]:
    events = asyncio.run(SecurityStore(store.kv).list_audit())
    return [(e.user, e.action, e.target) for e in events]


def test_a_restart_with_the_shipped_config_writes_and_audits_nothing(tmp_path: Path) -> None:
    config = parse_config(default_config_path().read_text())
    store = KvStore(MemoryKv())
    first = asyncio.run(bootstrap(store, config, tmp_path / "tokens"))
    seeded = _trail(store)
    assert {a for _, a, _ in seeded} >= {"tenant_created", "user_created", "token_issued", "cluster_set"}
    assert {u for u, _, _ in seeded} == {"bootstrap"}
    revision = asyncio.run(store.kv.range_prefix(b"/")).revision
    again = asyncio.run(bootstrap(store, config, tmp_path / "tokens"))
    assert again == first
    assert _trail(store) == seeded
    # Only the bootstrap lock (taken, then released with its lease) and the record of what was
    # seeded (same value) are written again: nothing else changed.
    assert asyncio.run(store.kv.range_prefix(b"/")).revision <= revision + 3
    assert asyncio.run(store.kv.get(BOOTSTRAP_LOCK_KEY)) is None


def test_a_wiped_store_is_seeded_again_and_the_token_files_keep_working(tmp_path: Path) -> None:
    config = parse_config(default_config_path().read_text())
    old = KvStore(MemoryKv())
    files = asyncio.run(bootstrap(old, config, tmp_path / "tokens"))
    fresh = KvStore(MemoryKv())
    assert asyncio.run(bootstrap(fresh, config, tmp_path / "tokens")) == files
    for user, path in files.items():
        resolved = asyncio.run(fresh.resolve_token(path.read_text().strip()))
        assert resolved is not None
        assert resolved.name == user
