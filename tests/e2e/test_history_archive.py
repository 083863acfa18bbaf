"""End to end through the gRPC client: a job that ended is archived by `gpufed serve`'s leader to
the history database its config names (a real PostgreSQL, through `history.dsnEnv`), leaves etcd,
and still reads back, to its own tenant only."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.history.sql_store import SqlHistoryStore
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.postgres_process import PostgresProcess
from placement.model import JobId
from tests.e2e.harness import CONFIG, ServerProcess, manifest, run_cli, wait_for

pytestmark = pytest.mark.e2e

DSN_ENV = "GPUFED_E2E_HISTORY_DSN"


@pytest.fixture
def dsn(postgres_process: PostgresProcess, monkeypatch: pytest.MonkeyPatch) -> str:
    value = postgres_process.create_database("history_e2e_archive")
    # The server process inherits the variable; the config names it, never the DSN.
    monkeypatch.setenv(DSN_ENV, value)
    return value


@pytest.fixture
def archiving_server(etcd: EtcdProcess, tmp_path: Path, dsn: str) -> Iterator[ServerProcess]:
    config = tmp_path / "federation.yaml"
    config.write_text(CONFIG.read_text() + f"history:\n  dsnEnv: {DSN_ENV}\n  retainInEtcd: 0s\n")
    process = ServerProcess(etcd.endpoint, tmp_path / "state", config=config)
    process.start()
    yield process
    process.stop()


def _etcd_job_keys(etcd: EtcdProcess, prefix: str = "/gpufed/jobs/") -> list[str]:
    etcdctl = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "etcdctl"
    out = subprocess.run(
        [
            str(etcdctl) if etcdctl.exists() else "etcdctl",
            f"--endpoints={etcd.endpoint}",
            "get",
            "--prefix",
            "--keys-only",
            prefix,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [line for line in out.splitlines() if line]


def _cli(server: ServerProcess, user: str, *args: str) -> str:
    """The CLI, as a user runs it against the server."""
    token = server.state_dir / "tokens" / f"{user}.token"
    done = run_cli("--server", server.target, "--token-file", str(token), *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_ended_job_moves_to_postgresql_and_still_reads_back(
    archiving_server: ServerProcess, etcd: EtcdProcess, dsn: str
) -> None:
    with archiving_server.client("alice") as alice, archiving_server.client("bob") as bob:
        job_id = alice.submit(manifest("archived", duration="1s"), idempotency_key="arch-1").job_id
        wait_for(lambda: alice.get(job_id).phase == pb.JobPhase.JOB_PHASE_SUCCEEDED, timeout_s=60)
        # Archived by the leader's next pass (retainInEtcd 0 s: a pass every second).
        wait_for(lambda: _etcd_job_keys(etcd) == [], timeout_s=30)
        history = SqlHistoryStore.open(dsn)
        try:
            kept = history.get_job(JobId(job_id))
            assert kept is not None
            assert kept.record.tenant == "vision"
            assert [iv.attempt for iv in kept.intervals] == [1]
        finally:
            history.close()
        # Reads that miss etcd look in SQL, with the live path's isolation.
        job = alice.get(job_id)
        assert job.phase == pb.JobPhase.JOB_PHASE_SUCCEEDED
        with pytest.raises(grpc.RpcError) as refused:
            bob.get(job_id)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        # Its kept logs moved with it: none of its keys under /gpufed/logs/ in etcd (by etcdctl), its
        # tails in PostgreSQL, and `gpufed logs` reads them there, to its own tenant only.
        assert _etcd_job_keys(etcd, f"/gpufed/logs/{job_id}/") == []
        history = SqlHistoryStore.open(dsn)
        try:
            tails = history.kept_logs(JobId(job_id), 1)
        finally:
            history.close()
        assert tails
        assert all(t.data for t in tails)
        chunks = list(alice.logs(pb.StreamLogsRequest(job_id=job_id), timeout_s=30))
        assert {c.source for c in chunks if c.lines} == {"kept"}
        served = [line for c in chunks for line in c.lines]
        assert served
        assert served[-1] in tails[-1].data.decode()
        with pytest.raises(grpc.RpcError) as theirs:
            list(bob.logs(pb.StreamLogsRequest(job_id=job_id), timeout_s=10))
        assert theirs.value.code() == grpc.StatusCode.NOT_FOUND
        assert theirs.value.details() == refused.value.details()
    printed = _cli(archiving_server, "alice", "logs", job_id, "--tail", "1").splitlines()
    assert printed
    assert printed[-1].endswith(served[-1])
    # Logged once the pass is over, which may be after its writes are visible: polled, not read once.
    wait_for(lambda: "archive_pass_done" in archiving_server.log_text(), timeout_s=30)
