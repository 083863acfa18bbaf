"""docs/finance.md's PostgreSQL guide, run as written: its psql commands create the role and the
database on a real PostgreSQL, and a `gpufed serve` whose config names that database through
`history.dsnEnv` opens it as that role, creates its tables there, and says in its startup log which
history store it uses, without the password (issue 30, item 10)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.postgres_process import SUPERUSER, PostgresProcess
from tests.e2e.docs_blocks import ROOT, runnable_blocks
from tests.e2e.harness import CONFIG, ServerProcess

pytestmark = pytest.mark.e2e

GUIDE = ROOT / "docs" / "finance.md"
PASSWORD = "change-me"  # the guide's own placeholder password


def _psql(postgres: PostgresProcess, *args: str, user: str = SUPERUSER, database: str = "postgres") -> str:
    env = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(postgres.port), "PGUSER": user}
    done = subprocess.run(
        ["psql", "-v", "ON_ERROR_STOP=1", "-At", "-d", database, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=20,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_guide_creates_a_database_a_server_opens_and_names_without_its_password(
    postgres_process: PostgresProcess, etcd: EtcdProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = [b for b in runnable_blocks(GUIDE) if b.kind == "postgres"]
    assert len(blocks) == 2, "the guide's create and DSN blocks"
    create, dsn_block = blocks
    # psql's own variables say which server and superuser, as the guide tells the reader to set.
    env = {
        **os.environ,
        "PGHOST": "127.0.0.1",
        "PGPORT": str(postgres_process.port),
        "PGUSER": SUPERUSER,
        "PGDATABASE": "postgres",
    }
    done = subprocess.run(
        ["bash", "-e", "-c", create.text], capture_output=True, text=True, env=env, timeout=20
    )
    assert done.returncode == 0, f"{create.where}: {done.stderr}"
    # The DSN block, with the guide's placeholder HOST:5432 for this server's address.
    script = dsn_block.text.replace("HOST:5432", f"127.0.0.1:{postgres_process.port}")
    done = subprocess.run(
        ["bash", "-e", "-c", script + 'printf %s "$GPUFED_HISTORY_DSN"'],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 0, f"{dsn_block.where}: {done.stderr}"
    dsn = done.stdout
    assert PASSWORD in dsn
    monkeypatch.setenv("GPUFED_HISTORY_DSN", dsn)

    config = tmp_path / "federation.yaml"
    config.write_text(CONFIG.read_text() + "history:\n  dsnEnv: GPUFED_HISTORY_DSN\n")
    server = ServerProcess(etcd.endpoint, tmp_path / "state", config=config, identity="pg-guide")
    server.start()
    try:
        log = server.log_text()
    finally:
        server.stop()
    started = [json.loads(line) for line in log.splitlines() if '"server_started"' in line]
    assert started, log[-3000:]
    expected = f"postgresql://gpufed_history@127.0.0.1:{postgres_process.port}/gpufed_history"
    assert started[0]["history"] == expected
    assert PASSWORD not in log
    # psql judges: the server made its tables in the new database, as the guide's role.
    owner = _psql(
        postgres_process,
        "-c",
        "SELECT tableowner FROM pg_tables WHERE tablename = 'history_jobs'",
        database="gpufed_history",
    )
    assert owner == "gpufed_history"
