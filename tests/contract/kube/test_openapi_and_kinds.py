"""OpenAPI, validation and the everyday `kubectl create` verbs.

- "Kubernetes API" / OpenAPI: the server publishes `/openapi/v2` and `/openapi/v3`; kubectl uses them
  for `kubectl explain` and client-side validation, and asks for server-side field validation
  (`fieldValidation=Strict` by default since 1.27): an unknown field is an error, not silently dropped.
- `kubectl create namespace|job|configmap|priorityclass` and Leases (coordination.k8s.io/v1) are
  core kinds every conformant cluster serves.
- "creationTimestamp ... Populated by the system. Read-only. Null for lists": a client's null is
  replaced by the server's time.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.contract.kube.kubectl import Kubectl
from tests.contract.kube.official_client import ClientError, OfficialClient, Request
from tests.contract.kube.target import KubeTarget


def test_openapi_documents_are_served(kubectl: Kubectl) -> None:
    v3 = json.loads(kubectl("get", "--raw", "/openapi/v3"))
    assert "api/v1" in v3["paths"]
    core = json.loads(kubectl("get", "--raw", v3["paths"]["api/v1"]["serverRelativeURL"]))
    assert "io.k8s.api.core.v1.Pod" in core["components"]["schemas"]
    v2 = json.loads(kubectl("get", "--raw", "/openapi/v2"))
    assert v2["swagger"] == "2.0"
    assert "io.k8s.api.core.v1.Pod" in v2["definitions"]


def test_explain(kubectl: Kubectl) -> None:
    out = kubectl("explain", "pods.spec.containers.resources")
    assert "limits" in out
    assert "requests" in out
    assert "KIND:" in out
    assert "Pod" in out
    assert "DESCRIPTION" in kubectl("explain", "jobs.spec.suspend")


def test_apply_validates_and_refuses_unknown_fields(kubectl: Kubectl, ns: str) -> None:
    good = '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"good"},"data":{"a":"b"}}'
    kubectl("apply", "-n", ns, "-f", "-", stdin=good)
    bad = '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bad"},"datta":{"a":"b"}}'
    result = kubectl.run("apply", "-n", ns, "-f", "-", stdin=bad, check=False)
    assert result.returncode != 0
    assert 'unknown field "datta"' in result.stderr
    assert kubectl.run("get", "configmap", "bad", "-n", ns, check=False).returncode != 0


def test_create_verbs(kubectl: Kubectl, ns: str) -> None:
    kubectl("create", "configmap", "settings", "-n", ns, "--from-literal=lr=0.001", "--from-literal=epochs=3")
    cm = json.loads(kubectl("get", "configmap", "settings", "-n", ns, "-o", "json"))
    assert cm["data"] == {"lr": "0.001", "epochs": "3"}
    kubectl("create", "job", "once", "-n", ns, "--image=busybox:1.36", "--", "echo", "hi")
    made = json.loads(kubectl("get", "job", "once", "-n", ns, "-o", "json"))
    assert made["spec"]["template"]["spec"]["containers"][0]["command"] == ["echo", "hi"]
    name = f"{ns}-prio"
    kubectl("create", "priorityclass", name, "--value=1000", "--description=conformance")
    try:
        prio = json.loads(kubectl("get", "priorityclass", name, "-o", "json"))
        assert prio["value"] == 1000
    finally:
        kubectl.run("delete", "priorityclass", name, check=False)


def test_leases(official: OfficialClient, ns: str) -> None:
    body = {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}
    made = official.call("CoordinationV1Api", "create_namespaced_lease", ns, body)
    assert made["spec"]["holderIdentity"] == "a"
    made["spec"]["holderIdentity"] = "b"
    # The same replace twice, in one process of the client (each spends seconds importing it on a
    # busy machine): the second carries a resourceVersion the first made stale.
    replace = Request.call("CoordinationV1Api", "replace_namespaced_lease", "leader", ns, made)
    replaced, stale = official.outcomes(replace, replace)
    assert not isinstance(replaced, ClientError), replaced
    assert replaced["spec"]["holderIdentity"] == "b"
    # A replace with a stale resourceVersion is a conflict (optimistic concurrency).
    assert isinstance(stale, ClientError), stale
    assert stale.status == 409


def test_server_sets_creation_timestamp(kubectl: Kubectl, ns: str) -> None:
    doc = '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"ts","creationTimestamp":null}}'
    kubectl("create", "-n", ns, "-f", "-", stdin=doc)
    got = json.loads(kubectl("get", "configmap", "ts", "-n", ns, "-o", "json"))
    assert got["metadata"]["creationTimestamp"], "the server fills in creationTimestamp"


def test_protobuf_bodies_are_read_as_protobuf(kubectl: Kubectl, target: KubeTarget) -> None:
    # kubectl sends built-in kinds as protobuf. A body that decodes to a Namespace with no name is
    # refused as a real server refuses it (422, metadata.name required), not misread as broken JSON
    # (400) or a crash (500).
    if not target.simulated:
        pytest.skip("sends an unauthenticated request by hand; a real cluster needs credentials")
    server = json.loads(kubectl("config", "view", "--minify", "--raw", "-o", "json"))["clusters"][0][
        "cluster"
    ]["server"]
    request = urllib.request.Request(
        f"{server}/api/v1/namespaces",
        data=b"k8s\x00\x0a\x0f\x0a\x02v1\x12\x09Namespace",
        headers={"Content-Type": "application/vnd.kubernetes.protobuf", "Accept": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 422
    assert "name" in json.loads(caught.value.read())["message"]
