"""The chart's server container, run as the kubelet would run it: the rendered command and arguments
(with `$(POD_NAME)` expanded, and the etcd, the mounted ConfigMap and the state volume mapped to
local ones), against a real etcd. The probes' endpoints answer on an address other than the one a
loopback-only server would listen on (127.0.0.2, as a pod's IP is not its loopback), and the first
admin token is where docs/deploy.md ("First tokens") says, and works with the CLI."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from federation.runtime.etcd_process import EtcdProcess
from tests.deploy.chart import DEPLOY_DOC, Pod, ensure_tools, readyz, start_pod, template
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


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    ensure_tools("deploy-tools")
    work = tmp_path_factory.mktemp("helm-pod")
    values = work / "values.yaml"
    values.write_text(yaml.safe_dump({"config": CONFIG}))
    etcd = EtcdProcess(work / "etcd")
    etcd.start()
    server = start_pod(template(values), name="gpufed-7d9c-x2x4p", etcd=etcd.endpoint, work=work)
    try:
        yield server
    finally:
        server.stop()
        etcd.stop()


def _container() -> dict[str, Any]:
    containers: list[dict[str, Any]] = template().one("Deployment")["spec"]["template"]["spec"]["containers"]
    return containers[0]


def _ready(pod: Pod) -> bool:
    assert pod.process.poll() is None, pod.log.read_text()[-3000:]
    return readyz(POD_ADDRESS, pod.http_port) == 200


def test_the_readiness_probe_answers_on_the_pods_address(pod: Pod) -> None:
    wait_for(lambda: _ready(pod), timeout_s=25)
    assert _container()["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_the_liveness_probe_gets_serving_from_grpc_health(pod: Pod) -> None:
    assert _container()["livenessProbe"]["grpc"]["port"] == 50051  # the container's gRPC port
    with grpc.insecure_channel(f"{POD_ADDRESS}:{pod.grpc_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = wait_for(lambda: _check(stub), timeout_s=20)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def _check(stub: health_pb2_grpc.HealthStub) -> health_pb2.HealthCheckResponse | None:
    try:
        # types-grpcio-health-checking declares HealthStub without its generated methods.
        reply: health_pb2.HealthCheckResponse = stub.Check(  # type: ignore[attr-defined]
            health_pb2.HealthCheckRequest(), timeout=2
        )
    except grpc.RpcError:
        return None
    return reply


def test_the_first_admin_token_is_where_the_docs_say_and_works(pod: Pod) -> None:
    token = pod.state_dir / "tokens" / "admin.token"
    wait_for(lambda: _ready(pod), timeout_s=25)
    assert token.exists()
    assert "/var/lib/gpufed/tokens/admin.token" in DEPLOY_DOC.read_text()
    server = f"{POD_ADDRESS}:{pod.grpc_port}"
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
    alice = pod.state_dir / "tokens" / "alice.token"
    refused = subprocess.run(
        [gpufed, "--server", server, "--token-file", str(alice), "token", "list"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode != 0
    assert "PERMISSION_DENIED" in refused.stderr or "admin" in refused.stderr, refused.stderr
    assert "UNAVAILABLE" not in refused.stderr
