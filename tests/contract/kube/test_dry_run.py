"""dryRun=All changes nothing (API concepts, "Dry-run").

"The request is still processed as typical request: the fields are defaulted, the object is
validated, it goes through the validation admission chain ... but it is never persisted to storage."
So a dry-run create returns the object it would make and stores none, a dry-run cordon leaves the
node schedulable, a dry-run delete deletes nothing, and `kubectl diff` (which is a server-side dry
run) changes nothing and exits 1 when there are differences.
"""

from __future__ import annotations

import json

import pytest

from tests.contract.kube.facts import gpu_nodes
from tests.contract.kube.kubectl import Kubectl
from tests.contract.kube.manifests import dump, pod
from tests.contract.kube.official_client import ClientError, OfficialClient, Request
from tests.contract.kube.waits import until


def _pod_names(kubectl: Kubectl, ns: str) -> list[str]:
    items = json.loads(kubectl("get", "pods", "-n", ns, "-o", "json"))["items"]
    return [p["metadata"]["name"] for p in items]


def test_apply_dry_run_server_creates_nothing(kubectl: Kubectl, ns: str) -> None:
    out = kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-", stdin=dump(pod("dry", gpus=8)))
    assert "dry" in out
    assert "server dry run" in out
    assert _pod_names(kubectl, ns) == []


def test_client_dry_run_create_returns_the_object_and_stores_none(
    official: OfficialClient, kubectl: Kubectl, ns: str
) -> None:
    # Ask for every GPU of a node, twice, as dry runs: neither may hold GPUs. Both requests go in
    # one process of the client: each process spends seconds importing it on a busy machine.
    gpu_nodes(kubectl, 8)
    dry_create = Request.call(
        "CoreV1Api", "create_namespaced_pod", ns, pod("dry-gpu", gpus="8"), dry_run="All"
    )
    for made in official.batch(dry_create, dry_create):
        assert made["metadata"]["name"] == "dry-gpu"
        assert made["metadata"].get("uid"), "a dry run returns the object as it would be stored"
    assert _pod_names(kubectl, ns) == []
    # The GPUs are still free: a real pod of 8 GPUs schedules.
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(pod("real", gpus=8)))
    until(
        lambda: json.loads(kubectl("get", "pod", "real", "-n", ns, "-o", "json"))["spec"].get("nodeName"),
        what="the real pod to be scheduled",
        timeout_s=30,
    )


def test_dry_run_delete_deletes_nothing(kubectl: Kubectl, ns: str) -> None:
    kubectl("create", "configmap", "keep", "-n", ns, "--from-literal=a=b")
    kubectl("delete", "configmap", "keep", "-n", ns, "--dry-run=server")
    assert json.loads(kubectl("get", "configmap", "keep", "-n", ns, "-o", "json"))["data"] == {"a": "b"}


def test_dry_run_update_changes_nothing(kubectl: Kubectl, official: OfficialClient, ns: str) -> None:
    kubectl("create", "configmap", "cm", "-n", ns, "--from-literal=a=b")
    before = json.loads(kubectl("get", "configmap", "cm", "-n", ns, "-o", "json"))
    answer = official.call(
        "CoreV1Api", "patch_namespaced_config_map", "cm", ns, {"data": {"a": "changed"}}, dry_run="All"
    )
    assert answer["data"] == {"a": "changed"}
    after = json.loads(kubectl("get", "configmap", "cm", "-n", ns, "-o", "json"))
    assert after["data"] == {"a": "b"}
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_dry_run_with_an_unknown_value_is_refused(official: OfficialClient, ns: str) -> None:
    # "dryRun ... Valid values are: All"; anything else is a 400.
    with pytest.raises(ClientError) as caught:
        official.call(
            "CoreV1Api", "create_namespaced_config_map", ns, {"metadata": {"name": "x"}}, dry_run="Yes"
        )
    assert caught.value.status == 400


def test_diff_changes_nothing_and_reports_differences(kubectl: Kubectl, ns: str) -> None:
    kubectl("create", "configmap", "cm", "-n", ns, "--from-literal=a=b")
    changed = '{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "c"}}'
    result = kubectl.run("diff", "-n", ns, "-f", "-", stdin=changed, check=False)
    # kubectl diff: exit 0 no differences, 1 differences found, >1 an error.
    assert result.returncode == 1, result.stderr
    assert "-  a: b" in result.stdout
    assert "+  a: c" in result.stdout
    assert json.loads(kubectl("get", "configmap", "cm", "-n", ns, "-o", "json"))["data"] == {"a": "b"}
    new = '{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fresh"}, "data": {"x": "y"}}'
    assert kubectl.run("diff", "-n", ns, "-f", "-", stdin=new, check=False).returncode == 1
    assert kubectl.run("get", "configmap", "fresh", "-n", ns, check=False).returncode != 0


def test_cordon_dry_run_leaves_the_node_schedulable(fresh_kubectl: Kubectl) -> None:
    node = json.loads(fresh_kubectl("get", "nodes", "-o", "json"))["items"][0]["metadata"]["name"]
    fresh_kubectl("cordon", node, "--dry-run=server")
    spec = json.loads(fresh_kubectl("get", "node", node, "-o", "json"))["spec"]
    assert not spec.get("unschedulable")
