"""`gpufed admin backup` and `restore` against etcd as production runs it: three members that demand
client certificates, one of them down. The snapshot comes from the next member that answers; the
backup is restored into a new three-member cluster, member by member (each its own name, the same
`--initial-cluster`); etcdctl finds every key, value and revision as it was."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from federation.cli.main import cli
from federation.history.sql_store import SqlHistoryStore
from federation.runtime.etcd_process import etcdctl_binary
from federation.security.tokens import token_hash
from tests.etcd_cluster import Certs, EtcdCluster, make_certs

pytestmark = pytest.mark.integration

TOKEN = "gpf_backup-operator"


def _etcdctl(endpoints: str, certs: Certs, *args: str) -> str:
    client = certs.client
    assert client.cert is not None
    assert client.key is not None
    done = subprocess.run(
        [
            str(etcdctl_binary()),
            f"--endpoints={endpoints}",
            f"--cacert={client.ca}",
            f"--cert={client.cert}",
            f"--key={client.key}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout


def _kvs(endpoint: str, certs: Certs) -> list[dict[str, Any]]:
    out = json.loads(_etcdctl(endpoint, certs, "get", "/gpufed/", "--prefix", "-w", "json"))
    kvs: list[dict[str, Any]] = out["kvs"]
    return kvs


def _tls_args(certs: Certs) -> list[str]:
    client = certs.client
    return [
        f"--etcd-cacert={client.ca}",
        f"--etcd-cert={client.cert}",
        f"--etcd-key={client.key}",
    ]


def test_a_tls_cluster_with_a_member_down_is_backed_up_and_restored_member_by_member(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    history = f"sqlite:///{tmp_path / 'history.sqlite3'}"
    SqlHistoryStore.open(history).close()
    source = EtcdCluster(tmp_path / "source", tls=certs.server)
    source.start()
    try:
        endpoints = source.endpoint
        admin = {"name": "root", "tenant": "platform", "role": "admin"}
        _etcdctl(endpoints, certs, "put", "/gpufed/users/root", json.dumps(admin))
        _etcdctl(endpoints, certs, "put", f"/gpufed/tokens/{token_hash(TOKEN)}", json.dumps({"user": "root"}))
        for i in range(5):
            _etcdctl(endpoints, certs, "put", f"/gpufed/jobs/j{i}", json.dumps({"job_id": f"j{i}", "n": i}))
        source.kill(0)
        out = tmp_path / "backup"
        backup = ["admin", "backup", "--out", str(out), "--etcd", endpoints, "--history-dsn", history]
        done = CliRunner().invoke(cli, ["--token", TOKEN, *backup, *_tls_args(certs)])
        assert done.exit_code == 0, done.stderr
        manifest = json.loads((out / "manifest.json").read_text())
        # The first member is down: the snapshot came from the second.
        assert manifest["etcd_endpoint"] == source.members[1].client_url
        up = ",".join(m.client_url for m in source.members[1:])
        before = _kvs(up, certs)
    finally:
        source.stop()

    restored = EtcdCluster(tmp_path / "restored", tls=certs.server)
    initial = ",".join(f"{m.name}={m.peer_url}" for m in restored.members)
    for member in restored.members:
        done = CliRunner().invoke(
            cli,
            [
                "--token", TOKEN, "admin", "restore", "--from", str(out),
                "--etcd-data-dir", str(member.data_dir), "--etcd-name", member.name,
                "--initial-cluster", initial, "--initial-advertise-peer-urls", member.peer_url,
            ],
        )  # fmt: skip
        assert done.exit_code == 0, done.stderr
    restored.start()
    try:
        after = _kvs(restored.endpoint, certs)
        assert after == before
        assert len([kv for kv in after if base64.b64decode(kv["key"]).startswith(b"/gpufed/jobs/")]) == 5
        members = json.loads(_etcdctl(restored.endpoint, certs, "member", "list", "-w", "json"))["members"]
        assert sorted(m["name"] for m in members) == ["m0", "m1", "m2"]
    finally:
        restored.stop()
