"""OpenAPI against the simulated API server: validation, explain and the v2 fallback, by kubectl.

`kubectl apply` asks `/openapi/v3` whether the server validates fields (then sends
`fieldValidation=Strict`), `explain` reads schemas from there, and a `List` falls back to the
protobuf `/openapi/v2` for client-side validation. Each test drives the real kubectl.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from clusters.sim import SimPoolConfig, ThreadedSim, cluster

KUBECTL = shutil.which(
    "kubectl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[ThreadedSim]:
    config = cluster("aw", [SimPoolConfig.of("a100", "A100", node_count=1)], default_duration_s=60)
    with ThreadedSim(config) as running:
        running.kubeconfig(tmp_path / "kubeconfig")
        yield running


@pytest.fixture
def api(sim: ThreadedSim) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = sim.url
    configuration.retries = False
    return client.ApiClient(configuration)


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


def raw(url: str, method: str, path: str, body: object, content_type: str) -> tuple[int, Any]:
    """One request the typed client would not make, and its status code and JSON answer."""
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def kubectl(
    tmp_path: Path, *args: str, stdin: str | None = None, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    result = subprocess.run(
        [
            KUBECTL,
            "--kubeconfig",
            str(tmp_path / "kubeconfig"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--request-timeout=10s",
            *args,
        ],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if ok:
        assert result.returncode == 0, result.stderr
    return result


POD = """
apiVersion: v1
kind: Pod
metadata:
  name: v
spec:
  restartPolicy: Never
  {field}: 5
  containers:
  - name: main
    image: busybox
"""


def test_kubectl_apply_validates_on_the_server(core: client.CoreV1Api, tmp_path: Path) -> None:
    # Without --validate=false: kubectl finds fieldValidation in /openapi/v3 and sends Strict.
    kubectl(tmp_path, "apply", "-f", "-", stdin=POD.format(field="activeDeadlineSeconds"))
    assert core.read_namespaced_pod("v", "default").spec.active_deadline_seconds == 5
    bad = kubectl(
        tmp_path,
        "apply",
        "-f",
        "-",
        stdin=POD.format(field="activeDeadlineSecond").replace("name: v", "name: w"),
        ok=False,
    )
    assert bad.returncode != 0
    assert 'unknown field "spec.activeDeadlineSecond"' in bad.stderr
    with pytest.raises(ApiException) as info:
        core.read_namespaced_pod("w", "default")
    assert info.value.status == 404
    # --validate=warn: stored, with the server's warning relayed by kubectl.
    warned = kubectl(
        tmp_path,
        "apply",
        "--validate=warn",
        "-f",
        "-",
        stdin=POD.format(field="activeDeadlineSecond").replace("name: v", "name: x"),
    )
    assert 'Warning: unknown field "spec.activeDeadlineSecond"' in warned.stderr
    assert core.read_namespaced_pod("x", "default").spec.active_deadline_seconds is None


def test_kubectl_explain_reads_openapi_v3(sim: ThreadedSim, tmp_path: Path) -> None:
    out = kubectl(tmp_path, "explain", "pods.spec.containers.resources").stdout
    assert "limits" in out
    assert "requests" in out
    assert "holderIdentity" in kubectl(tmp_path, "explain", "leases.spec").stdout
    assert "completions" in kubectl(tmp_path, "explain", "jobs.spec", "--api-version=batch/v1").stdout


def test_openapi_v2_as_json_and_as_protobuf(sim: ThreadedSim) -> None:
    with urllib.request.urlopen(sim.url + "/openapi/v2", timeout=10) as response:
        doc = json.loads(response.read())
    assert doc["swagger"] == "2.0"
    pod = doc["definitions"]["io.k8s.api.core.v1.Pod"]
    assert pod["x-kubernetes-group-version-kind"] == [{"group": "", "version": "v1", "kind": "Pod"}]
    protobuf = urllib.request.Request(
        sim.url + "/openapi/v2",
        headers={"Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"},
    )
    with urllib.request.urlopen(protobuf, timeout=10) as response:
        body = response.read()
    assert body.startswith(b"\n\x032.0")  # field 1 (swagger), "2.0"
    assert b"io.k8s.api.core.v1.Pod" in body
    xml_only = urllib.request.Request(sim.url + "/openapi/v2", headers={"Accept": "application/xml"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(xml_only, timeout=10)
    assert info.value.code == 406


def test_kubectl_apply_of_a_list_validates_items_with_openapi_v2(
    core: client.CoreV1Api, tmp_path: Path
) -> None:
    # No List paths exist in /openapi/v3: kubectl falls back to /openapi/v2 (protobuf) and checks
    # the items itself, as against a real server.
    items = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"l{i}"}, "data": {"a": "b"}}
        for i in range(3)
    ]
    good = {"apiVersion": "v1", "kind": "List", "items": items}
    kubectl(tmp_path, "apply", "-f", "-", stdin=json.dumps(good))
    assert [c.metadata.name for c in core.list_namespaced_config_map("default").items] == ["l0", "l1", "l2"]
    bad = {"apiVersion": "v1", "kind": "List", "items": [{**items[0], "metadata": {"name": "m"}, "dta": {}}]}
    refused = kubectl(tmp_path, "apply", "-f", "-", stdin=json.dumps(bad), ok=False)
    assert 'unknown field "dta"' in refused.stderr


def test_a_client_that_takes_only_protobuf_answers_gets_406(sim: ThreadedSim) -> None:
    # The simulator reads protobuf but answers only JSON; a real server would answer in protobuf.
    only = urllib.request.Request(
        sim.url + "/api/v1/pods", headers={"Accept": "application/vnd.kubernetes.protobuf"}
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(only, timeout=10)
    assert info.value.code == 406
    assert json.loads(info.value.read())["reason"] == "NotAcceptable"
    either = urllib.request.Request(
        sim.url + "/api/v1/pods", headers={"Accept": "application/vnd.kubernetes.protobuf,application/json"}
    )
    with urllib.request.urlopen(either, timeout=10) as response:
        assert json.loads(response.read())["kind"] == "PodList"
