"""Writes against the simulated API server as kubectl and the official client make them.

kubectl's typed clients send protobuf, its `apply` asks `/openapi/v3` whether the server validates
fields, `explain` reads schemas from there, and `apply --server-side` needs field ownership; the
client patches Services by strategic merge. Each test drives the real tool.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
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


def test_kubectl_create_namespace_job_configmap_priorityclass(
    sim: ThreadedSim, api: client.ApiClient, tmp_path: Path
) -> None:
    # kubectl's typed clients send these as protobuf.
    kubectl(tmp_path, "create", "namespace", "team-a")
    kubectl(tmp_path, "create", "job", "j", "--image=busybox", "-n", "team-a")
    kubectl(tmp_path, "create", "configmap", "c", "--from-literal=a=b", "-n", "team-a")
    kubectl(tmp_path, "create", "priorityclass", "high", "--value=1000", "--description=urgent")
    core = client.CoreV1Api(api)
    assert core.read_namespace("team-a").status.phase == "Active"
    assert core.read_namespaced_config_map("c", "team-a").data == {"a": "b"}
    job = client.BatchV1Api(api).read_namespaced_job("j", "team-a")
    assert job.spec.template.spec.containers[0].image == "busybox"
    assert job.spec.template.spec.restart_policy == "Never"
    pc = client.SchedulingV1Api(api).read_priority_class("high")
    assert (pc.value, pc.description) == (1000, "urgent")
    listed = kubectl(tmp_path, "get", "configmaps,priorityclasses", "-A", "-o", "name").stdout.split()
    assert {"configmap/c", "priorityclass.scheduling.k8s.io/high"} <= set(listed)


def test_leases_and_configmaps_through_the_client(api: client.ApiClient) -> None:
    coordination = client.CoordinationV1Api(api)
    lease = {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}
    created = coordination.create_namespaced_lease("default", lease)
    created.spec.holder_identity = "b"
    coordination.replace_namespaced_lease("leader", "default", created)
    assert coordination.read_namespaced_lease("leader", "default").spec.holder_identity == "b"
    # A second writer with the stale object loses, which is what leader election relies on.
    created.spec.holder_identity = "c"
    with pytest.raises(ApiException) as info:
        coordination.replace_namespaced_lease("leader", "default", created)
    assert info.value.status == 409
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map("default", {"metadata": {"name": "cfg"}, "data": {"k": "v"}})
    assert [c.metadata.name for c in core.list_namespaced_config_map("default").items] == ["cfg"]


SERVICE = {
    "metadata": {"name": "svc"},
    "spec": {
        "selector": {"app": "x"},
        "ports": [{"name": "http", "port": 80}, {"name": "grpc", "port": 9000}],
    },
}


def test_strategic_merge_patch_merges_lists_by_key(core: client.CoreV1Api) -> None:
    core.create_namespaced_service("default", SERVICE)
    core.patch_namespaced_service("svc", "default", {"spec": {"ports": [{"port": 443, "name": "https"}]}})
    ports = {(p.port, p.name) for p in core.read_namespaced_service("svc", "default").spec.ports}
    assert ports == {(80, "http"), (9000, "grpc"), (443, "https")}
    core.patch_namespaced_service("svc", "default", {"spec": {"ports": [{"port": 9000, "$patch": "delete"}]}})
    assert [p.port for p in core.read_namespaced_service("svc", "default").spec.ports] == [80, 443]
    pod = {
        "metadata": {"name": "p"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
                {"name": "b", "image": "b:1"},
            ],
        },
    }
    core.create_namespaced_pod("default", pod)
    core.patch_namespaced_pod("p", "default", {"spec": {"containers": [{"name": "b", "image": "b:2"}]}})
    containers = core.read_namespaced_pod("p", "default").spec.containers
    assert [(c.name, c.image) for c in containers] == [("a", "a:1"), ("b", "b:2")]
    assert containers[0].env[0].value == "1"


def test_server_side_apply_owns_fields_conflicts_and_forces(
    sim: ThreadedSim, core: client.CoreV1Api, tmp_path: Path
) -> None:
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\ndata:\n  a: '1'\n  b: '2'\n"
    assert (
        "serverside-applied" in kubectl(tmp_path, "apply", "--server-side", "-f", "-", stdin=manifest).stdout
    )
    live = core.read_namespaced_config_map("ssa", "default")
    assert [(m.manager, m.operation) for m in live.metadata.managed_fields] == [("kubectl", "Apply")]
    # Another manager changes a field the applier owns; the next apply conflicts.
    kubectl(tmp_path, "patch", "configmap", "ssa", "-p", '{"data":{"a":"9"}}')
    changed = manifest.replace("'1'", "'3'")
    refused = kubectl(tmp_path, "apply", "--server-side", "-f", "-", stdin=changed, ok=False)
    assert refused.returncode != 0
    assert 'conflict with "kubectl-patch" using v1: .data.a' in refused.stderr
    assert core.read_namespaced_config_map("ssa", "default").data == {"a": "9", "b": "2"}
    kubectl(tmp_path, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=changed)
    assert core.read_namespaced_config_map("ssa", "default").data == {"a": "3", "b": "2"}
    # Dropping a field from the applied configuration removes it: the applier alone owned it.
    kubectl(tmp_path, "apply", "--server-side", "-f", "-", stdin=changed.replace("  b: '2'\n", ""))
    assert core.read_namespaced_config_map("ssa", "default").data == {"a": "3"}
    # An apply needs a field manager.
    status, body = raw(
        sim.url,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/ssa",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}},
        "application/apply-patch+yaml",
    )
    assert (status, body["reason"]) == (422, "Invalid")


def test_strategic_merge_patch_on_a_custom_resource_is_415(sim: ThreadedSim, api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    queue = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "q"}}
    custom.create_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues", queue)
    status, body = raw(
        sim.url,
        "PATCH",
        "/apis/scheduling.volcano.sh/v1beta1/queues/q",
        {"spec": {"weight": 2}},
        "application/strategic-merge-patch+json",
    )
    assert (status, body["kind"], body["reason"]) == (415, "Status", "UnsupportedMediaType")
    status, _ = raw(
        sim.url,
        "PATCH",
        "/apis/scheduling.volcano.sh/v1beta1/queues/q",
        {"spec": {"weight": 2}},
        "application/merge-patch+json",
    )
    assert status == 200


def test_kubectl_drain_server_dry_run_evicts_and_cordons_nothing(
    sim: ThreadedSim, core: client.CoreV1Api, tmp_path: Path
) -> None:
    kubectl(tmp_path, "run", "r", "--image=busybox", "--restart=Never")
    node = core.list_node().items[0].metadata.name
    deadline = time.monotonic() + 10
    while core.read_namespaced_pod("r", "default").status.phase != "Running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # kubectl sends the eviction as protobuf, with dryRun inside its DeleteOptions.
    out = kubectl(tmp_path, "drain", node, "--dry-run=server", "--force", "--ignore-daemonsets")
    assert "evicting pod default/r (server dry run)" in out.stderr + out.stdout
    pod = core.read_namespaced_pod("r", "default")
    assert (pod.status.phase, pod.metadata.deletion_timestamp) == ("Running", None)
    assert not core.read_node(node).spec.unschedulable


VCJOB = """
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: vc
spec:
  minAvailable: 1
  schedulerName: volcano
  queue: default
  tasks:
  - name: w
    replicas: 1
    template:
      spec:
        restartPolicy: Never
        containers:
        - name: m
          image: x
          resources:
            limits:
              nvidia.com/gpu: 1
"""


def test_custom_resources_keep_their_quantities_as_sent(
    sim: ThreadedSim, api: client.ApiClient, tmp_path: Path
) -> None:
    # A real server cannot know which fields of a custom resource are quantities; its pods are built-in.
    assert "created" in kubectl(tmp_path, "apply", "-f", "-", stdin=VCJOB).stdout
    job = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "batch.volcano.sh", "v1alpha1", "default", "jobs", "vc"
    )
    assert job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": 1
    }
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + 10
    while not core.list_namespaced_pod("default").items:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pod = core.list_namespaced_pod("default").items[0]
    assert pod.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}


def test_server_side_apply_after_client_side_apply_takes_over_without_conflict(
    core: client.CoreV1Api, tmp_path: Path
) -> None:
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: up\ndata:\n  a: '1'\n  b: '2'\n"
    kubectl(tmp_path, "apply", "-f", "-", stdin=manifest)
    kubectl(tmp_path, "apply", "--server-side", "-f", "-", stdin=manifest.replace("'1'", "'5'"))
    live = core.read_namespaced_config_map("up", "default")
    assert live.data == {"a": "5", "b": "2"}
    assert "kubectl" in {m.manager for m in live.metadata.managed_fields}
    # A field someone else changed since the client-side apply is a real conflict.
    kubectl(tmp_path, "patch", "configmap", "up", "-p", '{"data":{"b":"7"}}')
    refused = kubectl(
        tmp_path, "apply", "--server-side", "-f", "-", stdin=manifest.replace("'2'", "'8'"), ok=False
    )
    assert 'conflict with "kubectl-patch" using v1: .data.b' in refused.stderr


def test_generation_only_where_the_server_keeps_it(core: client.CoreV1Api, tmp_path: Path) -> None:
    core.create_namespaced_config_map("default", {"metadata": {"name": "g"}, "data": {"a": "1"}})
    core.patch_namespaced_config_map("g", "default", {"data": {"a": "2"}})
    assert core.read_namespaced_config_map("g", "default").metadata.generation is None
    kubectl(tmp_path, "run", "gen", "--image=busybox", "--restart=Never")
    deadline = time.monotonic() + 10
    while not core.read_namespaced_pod("gen", "default").spec.node_name:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert core.read_namespaced_pod("gen", "default").metadata.generation == 1  # binding is not a change
    kubectl(tmp_path, "set", "image", "pod/gen", "gen=busybox:2")
    assert core.read_namespaced_pod("gen", "default").metadata.generation == 2


def test_updates_may_not_change_immutable_fields(api: client.ApiClient, tmp_path: Path) -> None:
    core = client.CoreV1Api(api)
    pod = {
        "metadata": {"name": "im"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "m", "image": "a:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }
    core.create_namespaced_pod("default", pod)
    # A running pod's GPU request cannot be raised by an update: a real server refuses it.
    more = {"spec": {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}
    with pytest.raises(ApiException) as info:
        core.patch_namespaced_pod("im", "default", more)
    assert info.value.status == 422
    assert "pod updates may not change fields" in str(info.value.body)
    limits = core.read_namespaced_pod("im", "default").spec.containers[0].resources.limits
    assert limits == {"nvidia.com/gpu": "1"}
    # The image, and a shorter deadline, may change.
    core.patch_namespaced_pod(
        "im",
        "default",
        {"spec": {"activeDeadlineSeconds": 60, "containers": [{"name": "m", "image": "a:2"}]}},
    )
    assert core.read_namespaced_pod("im", "default").spec.containers[0].image == "a:2"
    batch = client.BatchV1Api(api)
    kubectl(tmp_path, "create", "job", "ij", "--image=busybox")
    with pytest.raises(ApiException) as info:
        batch.patch_namespaced_job(
            "ij", "default", {"spec": {"template": {"metadata": {"labels": {"x": "y"}}}}}
        )
    assert info.value.status == 422
