"""Quantities come back as strings in canonical form (API reference, "Quantity").

"Before serializing, Quantity will be put in 'canonical form'": a client may send `4` or `1000m`,
and every reader gets a string back (`"4"`, `"1"`). The official client's models expect strings; a
number in a pod would break every list and watch of that cluster's pods.
"""

from __future__ import annotations

import json

import pytest

from tests.contract.kube import facts
from tests.contract.kube.kubectl import Kubectl
from tests.contract.kube.manifests import dump, pod
from tests.contract.kube.official_client import OfficialClient, Request


@pytest.mark.parametrize(
    ("sent", "canonical"),
    [
        pytest.param(4, "4", id="integer"),
        pytest.param("1000m", "1", id="milli-to-whole"),
        pytest.param("0.5", "500m", id="decimal-to-milli"),
        pytest.param("1024Mi", "1Gi", id="binary-suffix-promoted"),
        # The format (decimal SI, binary SI, exponent) is kept: "1e3" stays an exponent.
        pytest.param("1e3", "1e3", id="exponent-kept"),
    ],
)
def test_quantities_are_canonical_strings(kubectl: Kubectl, ns: str, sent: object, canonical: str) -> None:
    doc = pod("q", seconds=5)
    doc["spec"]["containers"][0]["resources"] = {"requests": {"example.com/thing": sent}}
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(doc))
    got = json.loads(kubectl("get", "pod", "q", "-n", ns, "-o", "json"))
    assert got["spec"]["containers"][0]["resources"]["requests"]["example.com/thing"] == canonical


def test_official_client_lists_and_watches_with_numeric_gpu_pods_present(
    kubectl: Kubectl, official: OfficialClient, ns: str
) -> None:
    facts.gpu_nodes(kubectl, 2)
    # A foreign team's pods, written with a bare number for their GPUs, as many users write them.
    for i in range(2):
        kubectl("apply", "-n", ns, "-f", "-", stdin=dump(pod(f"foreign-{i}", gpus=2, seconds=600)))
    node_count = len(facts.nodes(kubectl))
    # One process of the client for all four requests (each process spends seconds importing it on
    # a busy machine). A watch without a resourceVersion starts with an ADDED event for every object
    # there is, so each watch ends once those have come: the two pods, every node.
    pods, nodes, events, node_events = official.batch(
        Request.call("CoreV1Api", "list_pod_for_all_namespaces"),
        Request.call("CoreV1Api", "list_node"),
        Request.watch("CoreV1Api", "list_namespaced_pod", namespace=ns, max_events=2, timeout_s=30),
        Request.watch("CoreV1Api", "list_node", max_events=node_count, timeout_s=30),
    )
    ours = [p for p in pods["items"] if p["metadata"]["namespace"] == ns]
    assert len(ours) == 2
    for p in ours:
        assert p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert nodes["items"], "the cluster has nodes"
    for node in nodes["items"]:
        for value in node["status"]["allocatable"].values():
            assert isinstance(value, str)
    assert {e["name"] for e in events if e["type"] == "ADDED"} == {"foreign-0", "foreign-1"}
    assert node_events
    assert all(e["type"] == "ADDED" for e in node_events)
