"""The e2e tests' servers are forked from a helper that has imported gpufed (tests/e2e/zygote.py):
each child must still get its own arguments, environment, log and exit status, die by the signals
sent to it, and exit as an interpreter would, as `python -m federation` started afresh does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.harness import run_cli
from tests.e2e.zygote import Zygote

GPUFED = [sys.executable, "-m", "federation"]


def test_a_child_gets_its_arguments_and_gives_its_exit_status_and_output(tmp_path: Path) -> None:
    log = tmp_path / "bogus.log"
    child = Zygote.shared().spawn([*GPUFED, "serve", "--bogus"], dict(os.environ), log)
    assert child.wait(timeout=60) == 2
    assert child.poll() == 2
    assert "No such option '--bogus'" in log.read_text()

    log = tmp_path / "help.log"
    child = Zygote.shared().spawn([*GPUFED, "--help"], dict(os.environ), log)
    assert child.wait(timeout=60) == 0
    assert "Usage:" in log.read_text()


def test_a_child_reads_its_own_environment_not_the_helpers(tmp_path: Path) -> None:
    log = tmp_path / "whoami.log"
    env = {**os.environ, "GPUFED_SERVER": "127.0.0.1:9", "GPUFED_TOKEN": "not-a-token"}
    child = Zygote.shared().spawn([*GPUFED, "whoami"], env, log)
    assert child.wait(timeout=60) == 1
    assert "127.0.0.1:9" in log.read_text()


def test_a_child_dies_by_the_signal_sent_to_it_and_its_pid_stays_its_own_until_reaped(
    tmp_path: Path,
) -> None:
    # A server that accepts the connection and never answers: the call waits (10 s) until killed.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        env = {**os.environ, "GPUFED_SERVER": f"127.0.0.1:{silent.getsockname()[1]}", "GPUFED_TOKEN": "x"}
        child = Zygote.shared().spawn([*GPUFED, "whoami"], env, tmp_path / "whoami.log")
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.2)
        assert child.poll() is None
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    child.kill()  # after the reap: a no-op, never a signal to a PID reused by someone else


def test_the_zygote_refuses_anything_but_gpufed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="python -m federation"):
        Zygote.shared().spawn([sys.executable, "-c", "print(1)"], dict(os.environ), tmp_path / "x.log")


@pytest.mark.parametrize(
    "args", [("--help",), ("serve", "--bogus"), ("--server", "127.0.0.1:9", "whoami")], ids=str
)
def test_a_cli_call_forked_gives_what_a_fresh_interpreter_gives(args: tuple[str, ...]) -> None:
    """The e2e tests' CLI calls (harness.run_cli) fork from the zygote: the same exit status, and
    stdout and stderr apart and the same, as `python -m federation` started afresh."""
    fresh = subprocess.run([*GPUFED, *args], capture_output=True, text=True, timeout=60, check=False)
    forked = run_cli(*args)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert fresh.stdout or fresh.stderr
