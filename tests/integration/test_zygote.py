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

from federation.runtime.sim_process import SimProcess
from tests.contract.kube.kubectl import KUBECTL
from tests.e2e.harness import run_cli
from tests.e2e.kube import onprem_a100
from tests.e2e.zygote import Zygote, launch_sim

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


@pytest.mark.parametrize(
    "argv",
    [[sys.executable, "-c", "print(1)"], [sys.executable, "-m", "http.server"], [sys.executable, "-m"]],
    ids=["-c", "another-module", "no-module"],
)
def test_the_zygote_refuses_anything_but_gpufed_and_its_simulator(argv: list[str], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"python -m <clusters\.sim or federation>"):
        Zygote.shared().spawn(argv, dict(os.environ), tmp_path / "x.log")
    assert not (tmp_path / "x.log").exists()


def test_a_simulator_forked_serves_its_clusters_and_appends_to_its_log_across_restarts(
    tmp_path: Path,
) -> None:
    """The e2e tests' simulators (`zygote.launch_sim` as SimProcess's launcher): kubectl-reachable
    clusters as from `python -m clusters.sim`, SIGTERM stops them cleanly (exit 0), and a restart
    appends to the log, as a new interpreter under ChildProcess does, its state restored."""
    sims = SimProcess(tmp_path / "sim", [onprem_a100(nodes=2)], launcher=launch_sim)
    sims.start()
    try:
        assert sims.pid is not None
        assert _parent_of(sims.pid) == Zygote.shared().pid
        nodes = _nodes_via_kubectl(sims)
        assert len(nodes) == 2
    finally:
        sims.stop()
    first = (tmp_path / "sim" / "sim.log").read_text()
    assert "sim_cluster_started" in first
    sims.start()
    try:
        assert _nodes_via_kubectl(sims) == nodes
    finally:
        sims.stop()
    log = (tmp_path / "sim" / "sim.log").read_text()
    assert log.startswith(first)
    assert "sim_cluster_restored" in log[len(first) :]


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _nodes_via_kubectl(sims: SimProcess) -> list[str]:
    assert KUBECTL is not None, "kubectl is not installed (make setup puts it in .venv/bin)"
    done = subprocess.run(
        [KUBECTL, "--kubeconfig", str(sims.kubeconfig), "get", "nodes", "-o", "name"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return sorted(done.stdout.split())


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
