"""The chart's server container, run as the kubelet would run it: the rendered command and arguments
(with `$(POD_NAME)` expanded, and the etcd, the mounted ConfigMap and the state volume mapped to
local ones), against a real etcd. The probes' endpoints answer on an address other than the one a
loopback-only server would listen on (127.0.0.2, as a pod's IP is not its loopback), and the first
admin token is where docs/deploy.md ("First tokens") says, and works with the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from datasync.loopback_ports import free_port
from federation.runtime.etcd_process import EtcdProcess
from tests.deploy.chart import DEPLOY_DOC, ensure_tools, template
from tests.e2e.harness import wait_for

# Not the address a server bound to loopback only (gpufed's default, 127.0.0.1) would answer on.
POD_ADDRESS = "127.0.0.2"
CONFIG = {
    "tenants": [{"name": "platform"}, {"name": "vision"}],
    "users": [
        {"name": "admin", "tenant": "platform", "role": "admin"},
        {"name": "alice", "tenant": "vision", "role": "member"},
    ],
}


def _mapped(args: list[str], etcd: str, state_dir: Path, bootstrap: Path, ports: dict[str, int]) -> list[str]:
    """The container's arguments with what a pod mounts mapped onto local paths and ports."""
    local = {
        "--etcd": etcd,
        "--state-dir": str(state_dir),
        "--bootstrap": str(bootstrap),
        "--port": str(ports["grpc"]),
        "--metrics-port": str(ports["http"]),
    }
    out = []
    for arg in args:
        flag, _, value = arg.partition("=")
        # The kubelet expands $(VAR) from the container's env (POD_NAME: the pod's name).
        out.append(
            f"{flag}={local.get(flag, value).replace('$(POD_NAME)', 'gpufed-7d9c-x2x4p')}" if value else arg
        )
    return out


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    ensure_tools("deploy-tools")
    work = tmp_path_factory.mktemp("helm-pod")
    values = work / "values.yaml"
    values.write_text(yaml.safe_dump({"config": CONFIG}))
    render = template(values)
    container = render.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    config_map = render.one("ConfigMap")
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    bootstrap_arg = next(a for a in container["args"] if a.startswith("--bootstrap="))
    bootstrap_in_pod = Path(bootstrap_arg.split("=", 1)[1])
    # The file the server reads is a key of the ConfigMap mounted where the argument says.
    assert str(bootstrap_in_pod.parent) == mount["mountPath"]
    bootstrap = work / "config" / bootstrap_in_pod.name
    bootstrap.parent.mkdir()
    bootstrap.write_text(config_map["data"][bootstrap_in_pod.name])

    etcd = EtcdProcess(work / "etcd")
    etcd.start()
    ports = {"grpc": free_port(), "http": free_port()}
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert set(named) == set(ports)
    state_dir = work / "state"
    argv = _mapped(container["args"], etcd.endpoint, state_dir, bootstrap, ports)
    # The image's entrypoint, `gpufed`, is the console script beside this interpreter here.
    command = [str(Path(sys.executable).with_name(container["command"][0]))]
    log = (work / "server.log").open("wb")
    server = subprocess.Popen([*command, *argv], stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        yield {
            "ports": ports,
            "state_dir": state_dir,
            "container": container,
            "server": server,
            "log": work / "server.log",
        }
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
        etcd.stop()


def _readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://{POD_ADDRESS}:{port}/readyz", timeout=2) as reply:
            return int(reply.status)
    except OSError:
        return 0


def test_the_readiness_probe_answers_on_the_pods_address(pod: dict[str, object]) -> None:
    ports = pod["ports"]
    assert isinstance(ports, dict)
    server = pod["server"]
    assert isinstance(server, subprocess.Popen)
    log = pod["log"]
    assert isinstance(log, Path)

    def ready() -> bool:
        assert server.poll() is None, log.read_text()[-3000:]
        return _readyz(ports["http"]) == 200

    wait_for(ready, timeout_s=25)
    container = pod["container"]
    assert isinstance(container, dict)
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_the_liveness_probe_gets_serving_from_grpc_health(pod: dict[str, object]) -> None:
    ports = pod["ports"]
    assert isinstance(ports, dict)
    container = pod["container"]
    assert isinstance(container, dict)
    assert container["livenessProbe"]["grpc"]["port"] == 50051  # the container's gRPC port
    with grpc.insecure_channel(f"{POD_ADDRESS}:{ports['grpc']}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = wait_for(lambda: _check(stub), timeout_s=20)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def _check(stub: health_pb2_grpc.HealthStub) -> health_pb2.HealthCheckResponse | None:
    try:
        return stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
    except grpc.RpcError:
        return None


def test_the_first_admin_token_is_where_the_docs_say_and_works(pod: dict[str, object]) -> None:
    ports, state_dir = pod["ports"], pod["state_dir"]
    assert isinstance(ports, dict)
    assert isinstance(state_dir, Path)
    token = state_dir / "tokens" / "admin.token"
    wait_for(lambda: _readyz(ports["http"]) == 200, timeout_s=25)
    assert token.exists()
    assert "/var/lib/gpufed/tokens/admin.token" in DEPLOY_DOC.read_text()
    server = f"{POD_ADDRESS}:{ports['grpc']}"
    gpufed = str(Path(sys.executable).with_name("gpufed"))
    whoami = subprocess.run(
        [gpufed, "--server", server, "--token-file", str(token), "-o", "json", "whoami"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert whoami.returncode == 0, whoami.stderr
    assert '"admin"' in whoami.stdout
    # A member's token (alice, tenant vision) is no admin's: the tokens list is refused.
    alice = state_dir / "tokens" / "alice.token"
    refused = subprocess.run(
        [gpufed, "--server", server, "--token-file", str(alice), "token", "list"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode != 0
    assert "PERMISSION_DENIED" in refused.stderr or "admin" in refused.stderr, refused.stderr
    assert "UNAVAILABLE" not in refused.stderr
