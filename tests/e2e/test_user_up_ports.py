"""`gpufed up` on ports the user chose: etcd, the simulated clusters and the local object stores
listen where the flags say (as the files a user reads say too), and a port that is taken is refused
before anything starts, with a message naming the port and its flag (issue 30, item 10)."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from datasync.loopback_ports import free_port, port_free
from datasync.seaweed_process import free_port_pairs
from federation.cli.main import cli
from federation.runtime.embedded import ENDPOINT_FILE
from tests.e2e.harness import wait_for

pytestmark = pytest.mark.e2e


def _up(state_dir: Path, *flags: str) -> subprocess.Popen[str]:
    gpufed = [sys.executable, "-m", "federation", "--state-dir", str(state_dir)]
    return subprocess.Popen(
        [*gpufed, "up", "--port", "0", "--metrics-port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _three_free_in_a_row() -> int:
    while True:
        first = free_port()
        if all(port_free(first + i) for i in (1, 2)):
            return first


# How many times the test chooses its ports again when a neighbour took one of them between the
# choice and `gpufed up` (the suite runs other servers, etcds and object stores beside it).
PORT_CHOICES = 5


def _up_on_free_ports(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, int, int, int, int]:
    """`gpufed up` on ports that were free when chosen. If one was taken meanwhile (by a neighbour's
    server, or its own probe for a free port, which may be gone again by the time anyone looks),
    `gpufed up` refuses that port by name, as `test_a_taken_port_is_refused_naming_it_and_nothing_starts`
    checks; the test then chooses again: the premise, not the product, failed. Any other exit fails."""
    for attempt in range(PORT_CHOICES):
        etcd_port = free_port()
        sim_port = _three_free_in_a_row()
        onprem, cloud = free_port_pairs(2)
        state = tmp_path / f"state-{attempt}"
        proc = _up(
            state,
            "--etcd-port",
            str(etcd_port),
            "--sim-port",
            str(sim_port),
            "--store-port",
            f"onprem={onprem}",
            "--store-port",
            f"cloud={cloud}",
        )
        wait_for(lambda: (state / ENDPOINT_FILE).exists() or proc.poll() is not None, timeout_s=25)  # noqa: B023
        if proc.poll() is None:
            return proc, state, etcd_port, sim_port, onprem, cloud
        stderr = proc.stderr.read() if proc.stderr else ""
        if re.search(r"port \d+ for .*\(--(etcd|sim|store)-port.* is taken on 127\.0\.0\.1", stderr) is None:
            raise AssertionError(f"gpufed up exited: {stderr}")
    raise AssertionError(f"a neighbour took one of the chosen ports {PORT_CHOICES} times in a row")


def test_up_listens_on_the_chosen_ports(tmp_path: Path) -> None:
    proc, state, etcd_port, sim_port, onprem, cloud = _up_on_free_ports(tmp_path)
    try:
        endpoint = json.loads((state / ENDPOINT_FILE).read_text())
        assert endpoint["etcd"] == f"127.0.0.1:{etcd_port}"
        stores = json.loads((state / "stores.json").read_text())
        assert stores["onprem-s3"]["endpoint"] == f"http://127.0.0.1:{onprem}"
        assert stores["s3-us-east-1"]["endpoint"] == f"http://127.0.0.1:{cloud}"
        kubeconfig = yaml.safe_load((state / "sim" / "kubeconfig").read_text())
        servers = sorted(c["cluster"]["server"] for c in kubeconfig["clusters"])
        assert servers == [f"http://127.0.0.1:{sim_port + i}" for i in range(3)]
        # Something really listens on each: the ports are held, not only written down.
        for port in (etcd_port, onprem, cloud, sim_port, sim_port + 1, sim_port + 2):
            assert not port_free(port), port
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.fixture(autouse=True)
def _logging_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # `up` sets structlog up to print to its stderr, which under click's runner is a buffer closed
    # after the call: the worker's other tests must keep their own logging.
    monkeypatch.setattr("federation.cli.main.configure_logging", lambda **_: None)


def _refused(state_dir: Path, *flags: str) -> str:
    """`gpufed up` with `flags`, which must refuse to start: its message. In process (click's runner):
    the refusal comes before anything starts, so a fresh interpreter would only add its imports."""
    result = CliRunner().invoke(
        cli, ["--state-dir", str(state_dir), "up", "--port", "0", "--metrics-port", "0", *flags]
    )
    assert result.exit_code != 0, result.output
    return result.output


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--etcd-port", "{port}"), ("--sim-port", "{port}"), ("--store-port", "onprem={port}")],
)
def test_a_taken_port_is_refused_naming_it_and_nothing_starts(tmp_path: Path, flag: str, value: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        message = _refused(tmp_path / "state", flag, value.format(port=port))
    assert f"port {port}" in message
    assert flag in message
    assert "taken" in message
    assert not (tmp_path / "state" / ENDPOINT_FILE).exists()
    assert not (tmp_path / "state" / "etcd" / "etcd.pid").exists()


def test_a_store_port_for_a_server_the_config_does_not_run_is_refused(tmp_path: Path) -> None:
    message = _refused(tmp_path / "state", "--store-port", f"nowhere={free_port()}")
    assert "nowhere" in message
    assert "onprem" in message  # the servers it does run
