"""Field selectors (Concepts, "Field Selectors").

"Supported field selectors vary by Kubernetes resource type"; "Using unsupported fields produces an
error", a 400 whose message says `field label not supported`. Every resource supports
`metadata.name` and `metadata.namespace`; nodes support `spec.unschedulable`, pods `status.phase`
and `spec.nodeName`.
"""

from __future__ import annotations

import json

import pytest

from tests.contract.kube import facts
from tests.contract.kube.kubectl import Kubectl
from tests.contract.kube.official_client import ClientError, OfficialClient


@pytest.mark.parametrize(
    ("resource", "selector"),
    [
        pytest.param("pods", "spec.foo=bar", id="unknown-pod-field"),
        pytest.param("pods", "status.phse=Running", id="misspelt-pod-field"),
        pytest.param("nodes", "spec.unschedulabel=true", id="misspelt-node-field"),
    ],
)
def test_unsupported_field_selector_is_a_400(kubectl: Kubectl, resource: str, selector: str) -> None:
    result = kubectl.run("get", resource, "-A", f"--field-selector={selector}", check=False)
    assert result.returncode != 0
    assert "field label not supported" in result.stderr


def test_unsupported_field_selector_through_the_client(official: OfficialClient) -> None:
    with pytest.raises(ClientError) as caught:
        official.call("CoreV1Api", "list_pod_for_all_namespaces", field_selector="spec.foo=bar")
    assert caught.value.status == 400


def test_unschedulable_false_selects_schedulable_nodes(kubectl: Kubectl) -> None:
    all_nodes = {n["metadata"]["name"] for n in facts.nodes(kubectl) if not n["spec"].get("unschedulable")}
    selected = json.loads(kubectl("get", "nodes", "--field-selector=spec.unschedulable=false", "-o", "json"))
    assert {n["metadata"]["name"] for n in selected["items"]} == all_nodes
    assert all_nodes, "a cluster has schedulable nodes"


def test_metadata_name_and_negation(kubectl: Kubectl, ns: str) -> None:
    kubectl("create", "configmap", "one", "-n", ns, "--from-literal=a=1")
    kubectl("create", "configmap", "two", "-n", ns, "--from-literal=a=2")
    one = json.loads(
        kubectl("get", "configmaps", "-n", ns, "--field-selector=metadata.name=one", "-o", "json")
    )
    assert [c["metadata"]["name"] for c in one["items"]] == ["one"]
    others = json.loads(
        kubectl("get", "configmaps", "-n", ns, "--field-selector=metadata.name!=one", "-o", "json")
    )
    assert "one" not in [c["metadata"]["name"] for c in others["items"]]
    assert "two" in [c["metadata"]["name"] for c in others["items"]]
