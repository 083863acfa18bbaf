"""The PostgreSQL process fixture itself: it serves, and a stop leaves no process and no data dir."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def test_a_server_does_not_outlive_a_killed_test_run(tmp_path: Path) -> None:
    """A SIGKILLed test run runs no atexit hook: the kernel must take its server down instead."""
    try:
        PostgresProcess()
    except PostgresUnavailable as error:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI needs a real PostgreSQL: {error}")
        pytest.skip(str(error))
    script = (
        "import sys, time\n"
        "from federation.runtime.postgres_process import PostgresProcess\n"
        "p = PostgresProcess()\n"
        "p.start()\n"
        "assert p._proc is not None and p._dir is not None\n"
        "print(p._proc.pid, p._dir, flush=True)\n"
        "time.sleep(300)\n"
    )
    run = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert run.stdout is not None
    postmaster_text, data_dir_text = run.stdout.readline().split()
    postmaster, data_dir = int(postmaster_text), Path(data_dir_text)
    try:
        assert Path(f"/proc/{postmaster}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/postgres")
        run.kill()
        run.wait()
        deadline = time.monotonic() + 30
        while _running(postmaster):
            assert time.monotonic() < deadline, "the PostgreSQL server outlived the run that started it"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(postmaster, signal.SIGKILL)
        shutil.rmtree(data_dir, ignore_errors=True)


def _running(pid: int) -> bool:
    # A zombie (reaped by nobody until init does) reads an empty command line: it holds nothing.
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


def test_the_server_is_spawned_without_fork_and_runs_as_its_own_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """Popen's `user`, `group`, `extra_groups` and `preexec_fn` make subprocess fork() rather than
    vfork(); a fork() runs gRPC's fork handlers in the child, which crashed it (exit -11) in a test
    worker with gRPC's threads running. The user switch is setpriv's, in the child's own command."""
    try:
        process = PostgresProcess()
    except PostgresUnavailable as error:
        pytest.skip(str(error))
    spawned: list[dict[str, object]] = []
    real_popen = subprocess.Popen

    class Spy(real_popen):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            spawned.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Spy)
    process.start()
    try:
        assert len(spawned) == 2, "initdb and the server"
        for kwargs in spawned:
            forcing = {
                k for k in ("user", "group", "extra_groups", "preexec_fn") if kwargs.get(k) is not None
            }
            assert not forcing, f"{forcing} would make subprocess fork()"
        if os.geteuid() == 0:
            postmaster = process._proc
            assert postmaster is not None
            uid_line = next(
                line
                for line in Path(f"/proc/{postmaster.pid}/status").read_text().splitlines()
                if line.startswith("Uid:")
            )
            assert uid_line.split()[1] == str(pwd.getpwnam("postgres").pw_uid), (
                "PostgreSQL refuses to run as root"
            )
    finally:
        process.stop()
