"""`gpufed admin backup` and `restore`, end to end, judged by etcdctl, sqlite3 and psql.

One federation serves the module: a job ended and archived to the history (SQLite), one running on a
member cluster, one waiting, ledger intervals, a token an admin issued, an approval, a registered
dataset with its manifest and a registration grant. It is stopped and backed up; the backup is
restored into a new etcd data dir and an empty PostgreSQL database; etcdctl and psql recount what
came back; a server on the restored state serves the same jobs, ledger, tokens, approvals and
datasets to their users (and only to them). That server's state is backed up in turn (PostgreSQL's
portable dump) and restored into an empty SQLite file, recounted by sqlite3 and psql. A damaged
backup, a non-empty target and a non-admin's token are refused, and nothing is written.

The member clusters are the in-process simulated ones; a real cluster outlives its control plane,
so the restored server is given the clusters' journals (their own state, not the federation's).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner

from federation.api.client import GpufedClient
from federation.api.datasets_client import DatasetsClient
from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.main import cli
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.postgres_process import PostgresProcess
from tests.e2e.harness import CONFIG, ServerProcess, manifest, wait_for
from tests.etcdctl import endpoint_status, etcdctl, keys

pytestmark = pytest.mark.e2e

DSN_ENV = "GPUFED_E2E_RESTORED_DSN"
RUNNING, SUCCEEDED, QUEUED = (
    pb.JobPhase.JOB_PHASE_RUNNING,
    pb.JobPhase.JOB_PHASE_SUCCEEDED,
    pb.JobPhase.JOB_PHASE_QUEUED,
)
# Each history table's row count and sums over its numbers and texts, the same SQL for sqlite3 and
# psql: equal answers mean the same rows came back.
SUMS = {
    "history_jobs": "count(*), sum(submitted_at_s), sum(ended_at_s), sum(length(record_json))",
    "history_attempts": "count(*), sum(attempt), sum(length(summary_json))",
    "history_waits": "count(*), sum(seq), sum(at_s), sum(length(reasons_json))",
    "history_intervals": "count(*), sum(gpu_count), sum(end_s - start_s), sum(usd_per_gpu_hour)",
    "history_usage_days": "count(*), sum(gpu_count), sum(end_s - start_s), sum(cost_micro_usd)",
    "history_usage_months": "count(*), sum(gpu_seconds), sum(cost_usd), sum(cost_micro_usd)",
    "history_usage_tenant_days": "count(*), sum(gpu_seconds), sum(intervals), sum(cost_micro_usd)",
    "history_audit": "count(*), sum(at_s)",
    "history_kept_logs": "count(*), sum(length(data))",
}


@dataclass
class World:
    root: Path
    config: Path
    etcd: EtcdProcess
    state: Path
    archived: str
    running: str
    waiting: str
    issued_token: str
    approval_id: str
    dataset_digest: str
    ledger: list[tuple[str, int, int, float]]

    def token(self, user: str) -> str:
        return (self.state / "tokens" / f"{user}.token").read_text().strip()

    @property
    def history(self) -> Path:
        return self.state / "history.sqlite3"


def _ledger(client: GpufedClient) -> list[tuple[str, int, int, float]]:
    rows = client.ledger(start_s=0).intervals
    return sorted((r.job_id, r.attempt, r.gpu_count, r.usd_per_gpu_hour) for r in rows)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("backup")
    (root / "lab" / "data" / "vision").mkdir(parents=True)
    (root / "lab" / "data" / "vision" / "part-0.bin").write_bytes(b"pixels" * 1000)
    config = root / "federation.yaml"
    # retainInEtcd 0 s: an ended job moves to the history at the archiver's next pass.
    config.write_text(
        CONFIG.read_text()
        + f"objectStores:\n  lab: {{kind: local, root: {root / 'lab'}, datasetPrefixes: {{'*': ['data/{{tenant}}/']}}}}\n"
        + "history:\n  retainInEtcd: 0s\n"
    )
    etcd = EtcdProcess(root / "etcd1")
    etcd.start()
    server = ServerProcess(etcd.endpoint, root / "state1", config=config)
    try:
        import time as _t

        _t0 = _t.monotonic()
        server.start()
        print("start", _t.monotonic() - _t0)
        with (
            server.client("alice") as alice,
            server.client("bob") as bob,
            server.client("admin") as admin,
            server.client("fin") as fin,
        ):
            archived = alice.submit(manifest("ended", duration="1s")).job_id
            running = alice.submit(manifest("long", duration="1h")).job_id
            waiting = bob.submit(manifest("waits", gpu="B200")).job_id
            issued = admin.issue_token("alice").token
            approval = admin.grant_approval(
                tenant="vision", priority_class="urgent", duration_s=86_400, reason="the paper"
            ).approval_id
            datasets = DatasetsClient(admin)
            version = datasets.register("imagenet", "v1", store="lab", prefix="data/vision/", tenant="vision")
            datasets.set_grant(store="lab", tenant="nlp", prefixes=["data/nlp/"])
            print("pop", _t.monotonic() - _t0)
            wait_for(lambda: alice.get(running).phase == RUNNING, timeout_s=20)
            print("running", _t.monotonic() - _t0)
            # Ended and archived: its key left etcd (etcdctl says), its job reads back from SQL.
            wait_for(lambda: not keys(etcd.endpoint, f"/gpufed/jobs/{archived}"), timeout_s=20)
            print("archived", _t.monotonic() - _t0)
            assert alice.get(archived).phase == SUCCEEDED
            wait_for(lambda: keys(etcd.endpoint, f"/gpufed/waits/{waiting}"), timeout_s=20)
            print("waits", _t.monotonic() - _t0)
            ledger = _ledger(fin)
        assert {row[0] for row in ledger} == {archived, running}
    finally:
        # Stopped before the backup, so that etcdctl and sqlite3 can compare it with what comes back.
        server.stop()
    yield World(
        root,
        config,
        etcd,
        server.state_dir,
        archived,
        running,
        waiting,
        issued,
        approval,
        version.manifest_digest,
        ledger,
    )
    etcd.stop()


def _gpufed(token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "federation", "--token", token, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _cli(token: str, *args: str) -> Any:
    """The same CLI in this process (click's runner): a second interpreter's start for each call would
    cost the module more than the rest of what it does."""
    return CliRunner().invoke(cli, ["--token", token, *args])


def _dump(endpoint: str) -> dict[str, dict[str, Any]]:
    """Every key under /gpufed/ with its value, revisions, version and lease, as etcdctl prints them."""
    out = json.loads(etcdctl(endpoint, "get", "/gpufed/", "--prefix", "-w", "json").stdout)
    return {kv["key"]: {k: v for k, v in kv.items() if k != "key"} for kv in out.get("kvs", [])}


def _decoded(dump: dict[str, dict[str, Any]]) -> dict[str, str]:
    import base64

    return {
        base64.b64decode(k).decode(): base64.b64decode(v.get("value", "")).decode() for k, v in dump.items()
    }


def _parse_sums(out: str) -> dict[str, list[float]]:
    lines = out.strip().splitlines()
    assert len(lines) == len(SUMS), out
    return {table: [float(x or 0) for x in line.split("|")] for table, line in zip(SUMS, lines, strict=True)}


def _sums_sqlite(path: Path) -> dict[str, list[float]]:
    """sqlite3's answer: one line per table."""
    statements = ";".join(f"SELECT {columns} FROM {table}" for table, columns in SUMS.items())
    done = subprocess.run(
        ["sqlite3", "-readonly", str(path), statements],
        capture_output=True,
        text=True,
        check=True,
        timeout=20,
    )
    return _parse_sums(done.stdout)


def _sums_psql(dsn: str) -> dict[str, list[float]]:
    """psql's answer: one line per table."""
    commands = [arg for table, columns in SUMS.items() for arg in ("-c", f"SELECT {columns} FROM {table}")]
    done = subprocess.run(
        ["psql", "-v", "ON_ERROR_STOP=1", "-At", dsn, *commands],
        capture_output=True,
        text=True,
        check=True,
        timeout=20,
    )
    return _parse_sums(done.stdout)


def _same_sums(a: dict[str, list[float]], b: dict[str, list[float]]) -> None:
    assert a.keys() == b.keys()
    for table in a:
        assert a[table] == pytest.approx(b[table], rel=1e-12, abs=1e-6), table


@pytest.fixture(scope="module")
def backup(world: World) -> Path:
    out = world.root / "backup1"
    done = _gpufed(
        world.token("admin"),
        "admin",
        "backup",
        "--out",
        str(out),
        "--etcd",
        world.etcd.endpoint,
        "--history-dsn",
        f"sqlite:///{world.history}",
    )
    assert done.returncode == 0, done.stderr
    assert "backup written to" in done.stdout
    return out


def test_a_non_admin_may_neither_back_up_nor_restore(world: World, backup: Path) -> None:
    for user in ("alice", "fin"):
        out = world.root / f"by-{user}"
        refused = _cli(world.token(user), "admin", "backup", "--out", str(out), "--etcd", world.etcd.endpoint)
        assert refused.exit_code != 0
        assert "only an admin may back up the federation" in refused.stderr
        assert not out.exists()
        target = world.root / f"etcd-by-{user}"
        refused = _cli(
            world.token(user), "admin", "restore", "--from", str(backup), "--etcd-data-dir", str(target)
        )
        assert refused.exit_code != 0
        assert "only an admin of the backed-up federation may restore it" in refused.stderr
        assert not target.exists()
    # An admin whose history database is not there: refused before anything is written, not even
    # the audit record of the attempt (etcdctl counts the audit trail before and after).
    audit = len(keys(world.etcd.endpoint, "/gpufed/audit/"))
    missing = world.root / "missing.sqlite3"
    refused = _cli(
        world.token("admin"), "admin", "backup", "--out", str(world.root / "y"), "--etcd", world.etcd.endpoint,
        "--history-dsn", f"sqlite:///{missing}",
    )  # fmt: skip
    assert f"no history database at {missing}" in refused.stderr
    assert not (world.root / "y").exists()
    assert len(keys(world.etcd.endpoint, "/gpufed/audit/")) == audit
    # A token nobody issued is refused the same way, and never reaches a snapshot.
    refused = _cli(
        "gpf_not-a-token", "admin", "backup", "--out", str(world.root / "x"), "--etcd", world.etcd.endpoint
    )
    assert "unknown, revoked or expired token" in refused.stderr
    assert not (world.root / "x").exists()


def test_a_damaged_backup_or_a_non_empty_target_is_refused_and_nothing_is_written(
    world: World, backup: Path
) -> None:
    damaged = world.root / "damaged"
    shutil.copytree(backup, damaged)
    with (damaged / "etcd.snapshot.db").open("r+b") as f:
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 0xFF]))
    target = world.root / "etcd-never"
    history = world.root / "never.sqlite3"
    token = world.token("admin")
    refused = _cli(
        token, "admin", "restore", "--from", str(damaged), "--etcd-data-dir", str(target),
        "--history-dsn", f"sqlite:///{history}",
    )  # fmt: skip
    assert refused.exit_code != 0
    assert (
        f"{damaged / 'etcd.snapshot.db'}: its SHA-256 differs from the manifest's; damaged" in refused.stderr
    )
    assert not target.exists()
    assert not history.exists()
    (damaged / "datasets.json").unlink()
    refused = _cli(token, "admin", "restore", "--from", str(damaged), "--etcd-data-dir", str(target))
    assert "datasets.json: missing from the backup" in refused.stderr
    # A target that holds data: the source's own history, and a data dir with a file in it.
    before = world.history.read_bytes()
    refused = _cli(
        token, "admin", "restore", "--from", str(backup), "--history-dsn", f"sqlite:///{world.history}"
    )
    assert refused.exit_code != 0
    assert "the history database already holds rows (history_attempts 1, history_audit" in refused.stderr
    assert world.history.read_bytes() == before
    occupied = world.root / "etcd-occupied"
    occupied.mkdir()
    (occupied / "keep.me").write_text("x")
    refused = _cli(token, "admin", "restore", "--from", str(backup), "--etcd-data-dir", str(occupied))
    assert f"{occupied} is not empty" in refused.stderr
    assert [p.name for p in occupied.iterdir()] == ["keep.me"]
    # Told to (--force), it replaces the data dir and keeps the old one aside, whole.
    forced = _cli(
        token, "admin", "restore", "--from", str(backup), "--etcd-data-dir", str(occupied), "--force"
    )
    assert forced.exit_code == 0, forced.stderr
    (aside,) = world.root.glob("etcd-occupied.replaced-*")
    assert [p.name for p in aside.iterdir()] == ["keep.me"]
    assert (occupied / "member" / "snap" / "db").is_file()


def test_a_restore_that_fails_half_way_leaves_nothing_behind(world: World, backup: Path) -> None:
    """The history's rows are counted against the manifest before they commit: a manifest that
    disagrees with its dump (edited, or a dump cut short) fails the restore after etcd's data dir was
    built and the rows were inserted, and neither is left."""
    lying = world.root / "lying"
    shutil.copytree(backup, lying)
    doc = json.loads((lying / "manifest.json").read_text())
    doc["history_rows"]["history_jobs"] += 1
    (lying / "manifest.json").write_text(json.dumps(doc))
    target = world.root / "etcd-half"
    history = world.root / "half.sqlite3"
    refused = _cli(
        world.token("admin"), "admin", "restore", "--from", str(lying), "--etcd-data-dir", str(target),
        "--history-dsn", f"sqlite:///{history}",
    )  # fmt: skip
    assert refused.exit_code != 0
    assert "differ from the backup's manifest" in refused.stderr
    assert not target.exists()
    assert not history.exists()
    assert sorted(p.name for p in world.root.iterdir() if "half" in p.name) == []


def test_a_restored_federation_holds_what_was_backed_up(
    world: World, backup: Path, postgres_process: PostgresProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _dump(world.etcd.endpoint)
    # The manifest's revision is etcd's own (nothing was written after the snapshot), and the datasets'
    # export beside the snapshot holds the dataset and its version's manifest.
    written = json.loads((backup / "manifest.json").read_text())
    assert written["etcd_revision"] == endpoint_status(world.etcd.endpoint).revision
    assert written["gpufed_keys"] == len(source)
    exported = json.loads((backup / "datasets.json").read_text())
    assert list(exported["datasets"]) == ["/gpufed/datasets/vision/imagenet"]
    assert list(exported["manifests"]) == ["/gpufed/manifests/vision/imagenet/v1"]
    source_sums = _sums_sqlite(world.history)
    dsn = postgres_process.create_database(f"restored_{uuid.uuid4().hex[:8]}")
    admin = world.token("admin")
    data_dir = world.root / "etcd2"
    done = _cli(
        admin,
        "admin",
        "restore",
        "--from",
        str(backup),
        "--etcd-data-dir",
        str(data_dir),
        "--history-dsn",
        dsn,
    )
    assert done.exit_code == 0, done.stderr

    # etcdctl: every key under /gpufed/ came back with its value, revisions, version and lease.
    restored_etcd = EtcdProcess(data_dir)
    restored_etcd.start()
    try:
        assert _dump(restored_etcd.endpoint) == source
        # Not even --force replaces the data dir of an etcd that runs on it.
        refused = _cli(
            admin, "admin", "restore", "--from", str(backup), "--etcd-data-dir", str(data_dir), "--force"
        )
        assert f"an etcd is running on {data_dir}" in refused.stderr
        assert not list(world.root.glob("etcd2.replaced-*"))
        # psql against sqlite3: the same rows in every history table.
        _same_sums(_sums_psql(dsn), source_sums)

        monkeypatch.setenv(DSN_ENV, dsn)
        config = world.root / "restored.yaml"
        config.write_text(world.config.read_text() + f"  dsnEnv: {DSN_ENV}\n")
        state = world.root / "state2"
        shutil.copytree(world.state / "clusters", state / "clusters")
        server = ServerProcess(restored_etcd.endpoint, state, config=config, identity="restored")
        server.start()
        try:
            _check_users_see_their_own(server, world)
            after = _decoded(_dump(restored_etcd.endpoint))
            before = _decoded(source)
            # What must differ once a server runs on the restored state: the leader key (the new
            # server's own, under its own lease; the source's leader had stepped down, so the
            # backup held none), and the audit trail, which the restored leader archives to SQL as the
            # source's would have (retainInEtcd 0 s). Every other key is as it was backed up.
            assert after.get("/gpufed/leader") == "restored-1"
            assert "/gpufed/leader" not in before
            assert _stable(after) == _stable(before)
        finally:
            server.stop()

        # The restored state backed up again, from PostgreSQL, and restored into an empty SQLite file.
        again = world.root / "backup2"
        done = _cli(
            world.issued_token, "admin", "backup", "--out", str(again), "--etcd", restored_etcd.endpoint,
            "--history-dsn", dsn,
        )  # fmt: skip
        assert done.exit_code != 0  # alice's issued token is a member's
        done = _cli(
            admin, "-o", "json", "admin", "backup", "--out", str(again), "--etcd", restored_etcd.endpoint,
            "--history-dsn", dsn,
        )  # fmt: skip
        assert done.exit_code == 0, done.stderr
        # -o json: the manifest as the script that runs backups reads it, the same as the file's.
        printed = json.loads(done.stdout)
        assert printed["directory"] == str(again)
        assert printed["manifest"]["history_backend"] == "postgresql"
        assert printed["manifest"]["files"] == json.loads((again / "manifest.json").read_text())["files"]
    finally:
        restored_etcd.stop()
    sqlite_again = world.root / "again.sqlite3"
    done = _cli(admin, "admin", "restore", "--from", str(again), "--history-dsn", f"sqlite:///{sqlite_again}")
    assert done.exit_code == 0, done.stderr
    _same_sums(_sums_sqlite(sqlite_again), _sums_psql(dsn))


def _stable(keys_values: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in keys_values.items() if not k.startswith(("/gpufed/leader", "/gpufed/audit/"))}


def _check_users_see_their_own(server: ServerProcess, world: World) -> None:
    """The old tokens work, and each user sees what they saw before, and no more."""
    target = server.target
    with (
        GpufedClient(target, world.token("alice")) as alice,
        GpufedClient(target, world.token("bob")) as bob,
        GpufedClient(target, world.token("admin")) as admin,
        GpufedClient(target, world.token("fin")) as fin,
        GpufedClient(target, world.issued_token) as issued,
    ):
        assert issued.whoami().user == "alice"
        # The backup itself is in the audit trail, by the admin who took it.
        assert [(e.user, e.target) for e in admin.list_audit().events if e.action == "backup"] == [
            ("admin", str(world.root / "backup1"))
        ]
        assert alice.get(world.archived).phase == SUCCEEDED  # from the restored history
        assert alice.get(world.running).phase == RUNNING
        assert bob.get(world.waiting).phase == QUEUED
        with pytest.raises(grpc.RpcError) as theirs:
            bob.get(world.archived)
        assert theirs.value.code() == grpc.StatusCode.NOT_FOUND
        assert _ledger(fin) == world.ledger
        assert {r[0] for r in _ledger(bob)} == set()
        approvals = admin.list_approvals(tenant="vision").approvals
        assert [a.approval_id for a in approvals] == [world.approval_id]
        datasets = DatasetsClient(alice)
        info = datasets.get("vision/imagenet")
        assert [v.manifest_digest for v in info.versions] == [world.dataset_digest]
        with pytest.raises(grpc.RpcError):
            DatasetsClient(bob).get("vision/imagenet")
        grants = DatasetsClient(admin).grants(store="lab").grants
        assert [(g.tenant, list(g.prefixes)) for g in grants if g.source == "admin"] == [
            ("nlp", ["data/nlp/"])
        ]
