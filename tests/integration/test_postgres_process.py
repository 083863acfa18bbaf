"""The PostgreSQL process fixture itself: it serves, and a stop leaves no process and no data dir."""

from __future__ import annotations

import os

import psycopg
import pytest

from federation.runtime.postgres_process import PostgresProcess, PostgresUnavailable


def test_a_stopped_server_leaves_nothing_behind() -> None:
    try:
        process = PostgresProcess()
    except PostgresUnavailable as error:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI needs a real PostgreSQL: {error}")
        pytest.skip(str(error))
    with process:
        with psycopg.connect(process.dsn) as conn:
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()
        proc = process._proc
        assert proc is not None
        assert pid is not None
        postmaster, data_dir = proc.pid, process._dir
        # An open session must not hold the stop up: fast shutdown ends it.
        held = psycopg.connect(process.dsn)
    assert data_dir is not None
    assert not data_dir.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(postmaster, 0)
    held.close()
