"""Gaps the simulated clusters had against a real one, judged by the real kubectl and the client.

A namespace is deleted gradually (Terminating, creates refused with 403, content deleted, then it
goes), a container that ignores SIGTERM holds its pod for the whole grace period, discovery lists
`pods/log` and `pods/eviction`, a dry-run Service create uses no cluster IP, and a name with a
trailing newline is invalid. They skip only without kubectl.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from clusters.sim import SimPoolConfig, ThreadedSim, cluster
from tests.integration.test_sim_kubelet_conformance import KUBECTL, a_pod, kubectl, settle, wait_for

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
IGNORE_SIGTERM = {"sim.gpufed.io/ignore-sigterm": "true"}


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[tuple[ThreadedSim, Path]]:
    config = cluster("nsd", [SimPoolConfig.of("a100", "A100", node_count=1)], default_duration_s=600)
    with ThreadedSim(config) as running:
        yield running, running.kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def core(sim: tuple[ThreadedSim, Path]) -> client.CoreV1Api:
    configuration = client.Configuration()
    configuration.host = sim[0].url
    configuration.retries = False
    return client.CoreV1Api(client.ApiClient(configuration))


def running(core: client.CoreV1Api, ns: str, name: str) -> bool:
    return bool(core.read_namespaced_pod(name, ns).status.phase == "Running")


def refusal(error: ApiException) -> dict[str, object]:
    body: dict[str, object] = json.loads(error.body)
    return body


def conditions(core: client.CoreV1Api, namespace: str) -> dict[str, client.V1NamespaceCondition]:
    return {c.type: c for c in core.read_namespace(namespace).status.conditions or []}


# -- namespaces -----------------------------------------------------------------------------------


def test_a_deleted_namespace_terminates_refuses_creates_and_goes_once_empty(
    sim: tuple[ThreadedSim, Path], core: client.CoreV1Api
) -> None:
    _, kubeconfig = sim
    kubectl(kubeconfig, "create", "namespace", "team")
    core.create_namespaced_pod(
        "team", a_pod("slow", annotations=IGNORE_SIGTERM, terminationGracePeriodSeconds=3)
    )
    core.create_namespaced_pod("team", a_pod("quick"))
    core.create_namespaced_service("team", {"metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}})
    wait_for(lambda: running(core, "team", "slow") and running(core, "team", "quick"))

    assert KUBECTL is not None
    started = time.monotonic()
    deleting = subprocess.Popen(
        [KUBECTL, "--kubeconfig", str(kubeconfig), "delete", "namespace", "team", "--timeout=60s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ns = wait_for(lambda: (n := core.read_namespace("team")).metadata.deletion_timestamp and n)
        assert ns.status.phase == "Terminating"
        assert ns.spec.finalizers == ["kubernetes"]
        # The content is deleted: the Service at once, the pods gracefully.
        wait_for(lambda: not core.list_namespaced_service("team").items)
        wait_for(lambda: not any(p.metadata.name == "quick" for p in core.list_namespaced_pod("team").items))
        slow = core.read_namespaced_pod("slow", "team")
        remaining = conditions(core, "team")["NamespaceContentRemaining"]
        assert (remaining.status, remaining.reason) == ("True", "SomeResourcesRemain")
        assert remaining.message == "Some resources are remaining: pods. has 1 resource instances"
        assert slow.metadata.deletion_timestamp is not None
        assert slow.status.phase == "Running"

        with pytest.raises(ApiException) as refused:
            core.create_namespaced_config_map("team", {"metadata": {"name": "late"}})
        assert refused.value.status == 403
        body = refusal(refused.value)
        assert body["reason"] == "Forbidden"
        assert body["message"] == (
            'configmaps "late" is forbidden: unable to create new content in namespace team '
            "because it is being terminated"
        )
        details = body["details"]
        assert isinstance(details, dict)
        assert details["causes"][0]["reason"] == "NamespaceTerminating"
        listed = kubectl(kubeconfig, "get", "namespace", "team", "--no-headers").stdout
        assert "Terminating" in listed
        again = kubectl(kubeconfig, "delete", "namespace", "team", "--wait=false", ok=False)
        assert again.returncode != 0
        assert "Conflict" in again.stderr, again.stderr

        out, err = deleting.communicate(timeout=60)
    finally:
        if deleting.poll() is None:
            deleting.kill()
            deleting.communicate()
    took_s = time.monotonic() - started
    assert deleting.returncode == 0, err
    assert 'namespace "team" deleted' in out
    # kubectl waited for the pod that ignores SIGTERM to be killed at the end of its grace period.
    assert took_s >= 2.5
    with pytest.raises(ApiException) as gone:
        core.read_namespace("team")
    assert gone.value.status == 404
    # The name is free again, and a new namespace of that name starts empty and Active.
    kubectl(kubeconfig, "create", "namespace", "team")
    assert core.read_namespace("team").status.phase == "Active"
    assert not core.list_namespaced_pod("team").items


def test_a_namespace_held_by_a_pod_finalizer_waits_for_it(
    sim: tuple[ThreadedSim, Path], core: client.CoreV1Api
) -> None:
    core.create_namespace({"metadata": {"name": "held"}})
    pod = a_pod("p")
    pod["metadata"]["finalizers"] = ["x.io/keep"]
    core.create_namespaced_pod("held", pod)
    wait_for(lambda: running(core, "held", "p"))
    core.delete_namespace("held")
    wait_for(lambda: core.read_namespaced_pod("p", "held").status.phase == "Failed")
    # The namespace controller has seen the pod stop and written its conditions; the finalizer holds.
    settle(sim[0])
    assert core.read_namespace("held").status.phase == "Terminating"
    held = conditions(core, "held")["NamespaceFinalizersRemaining"]
    assert (held.status, held.reason) == ("True", "SomeFinalizersRemain")
    assert (
        held.message
        == "Some content in the namespace has finalizers remaining: x.io/keep in 1 resource instances"
    )
    core.patch_namespaced_pod("p", "held", {"metadata": {"finalizers": None}})
    wait_for(lambda: not [n for n in core.list_namespace().items if n.metadata.name == "held"])


# -- pods that ignore SIGTERM ---------------------------------------------------------------------

# The stubborn pod's grace period: the polite pod's deletion (kubectl's start included), a settle and
# two reads must fit in it while the stubborn pod still runs. 2 s left a busy machine too little:
# `kubectl delete` alone could take that long under load.
STUBBORN_GRACE_S = 6


def test_a_pod_that_ignores_sigterm_is_killed_at_the_end_of_its_grace_period(
    sim: tuple[ThreadedSim, Path], core: client.CoreV1Api
) -> None:
    _, kubeconfig = sim
    core.create_namespaced_pod(
        "default",
        a_pod("stubborn", annotations=IGNORE_SIGTERM, terminationGracePeriodSeconds=STUBBORN_GRACE_S),
    )
    core.create_namespaced_pod("default", a_pod("polite", terminationGracePeriodSeconds=30))
    wait_for(lambda: running(core, "default", "stubborn") and running(core, "default", "polite"))

    started = time.monotonic()
    kubectl(kubeconfig, "delete", "pod", "stubborn", "--wait=false")

    # The default: containers exit promptly on SIGTERM, whatever the grace period (30 s here).
    polite_started = time.monotonic()
    kubectl(kubeconfig, "delete", "pod", "polite")
    assert time.monotonic() - polite_started < STUBBORN_GRACE_S

    # The polite pod, told to stop after the stubborn one by the same kubelet, has stopped and gone:
    # had the stubborn pod's container obeyed SIGTERM, it would have stopped by now too.
    settle(sim[0])
    pod = core.read_namespaced_pod("stubborn", "default")
    assert pod.metadata.deletion_timestamp is not None
    assert pod.metadata.deletion_grace_period_seconds == STUBBORN_GRACE_S
    assert pod.status.phase == "Running"
    shown = kubectl(kubeconfig, "get", "pod", "stubborn", "--no-headers").stdout
    assert "Terminating" in shown

    # The kubelet reports the killed container (exit 137) before the object goes.
    last = _watch_until_deleted(core, "stubborn", pod.metadata.resource_version)
    assert time.monotonic() - started >= STUBBORN_GRACE_S - 0.2
    assert last.status.phase == "Failed"
    assert last.status.container_statuses[0].state.terminated.exit_code == 137


def _watch_until_deleted(core: client.CoreV1Api, name: str, since_rv: str) -> client.V1Pod:
    stream = watch.Watch().stream(
        core.list_namespaced_pod,
        "default",
        field_selector=f"metadata.name={name}",
        resource_version=since_rv,
        timeout_seconds=30,
    )
    for event in stream:
        if event["type"] == "DELETED":
            pod: client.V1Pod = event["object"]
            return pod
    raise AssertionError(f"pod {name} was not deleted")


# -- discovery, dry runs, names -------------------------------------------------------------------


def test_discovery_lists_the_log_and_eviction_subresources(sim: tuple[ThreadedSim, Path]) -> None:
    _, kubeconfig = sim
    listed = json.loads(kubectl(kubeconfig, "get", "--raw", "/api/v1").stdout)
    by_name = {r["name"]: r for r in listed["resources"]}
    assert by_name["pods/log"]["verbs"] == ["get"]
    assert by_name["pods/log"]["kind"] == "Pod"
    eviction = by_name["pods/eviction"]
    assert (eviction["group"], eviction["version"], eviction["kind"]) == ("policy", "v1", "Eviction")
    assert eviction["verbs"] == ["create"]
    # kubectl lists resources, never subresources.
    names = kubectl(kubeconfig, "api-resources", "--api-group=", "-o", "name").stdout.split()
    assert "pods" in names
    assert not any("/" in n for n in names)
    # Listed for GET only: any other verb on it is 405.
    put = urllib.request.Request(
        f"{sim[0].url}/api/v1/namespaces/default/pods/x/log", data=b"{}", method="PUT"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(put, timeout=10)
    assert refused.value.code == 405


def test_a_dry_run_service_create_uses_no_cluster_ip(
    sim: tuple[ThreadedSim, Path], core: client.CoreV1Api
) -> None:
    _, kubeconfig = sim
    body = {"metadata": {"name": "a"}, "spec": {"ports": [{"port": 80}]}}
    previews = [
        core.create_namespaced_service("default", body, dry_run="All").spec.cluster_ip for _ in range(3)
    ]
    shown = kubectl(
        kubeconfig, "create", "service", "clusterip", "b", "--tcp=80:80", "--dry-run=server", "-o", "json"
    ).stdout
    previews.append(json.loads(shown)["spec"]["clusterIP"])
    assert not core.list_namespaced_service("default").items
    # The simulator hands out the lowest free address: a dry run held none of them.
    real = core.create_namespaced_service("default", body).spec.cluster_ip
    assert set(previews) == {real}
    # An address in use cannot be asked for again (422, as a real allocator answers).
    with pytest.raises(ApiException) as taken:
        core.create_namespaced_service(
            "default", {"metadata": {"name": "c"}, "spec": {"clusterIP": real, "ports": [{"port": 80}]}}
        )
    assert taken.value.status == 422
    assert "provided IP is already allocated" in refusal(taken.value)["message"]  # type: ignore[operator]
    # Deleting the Service frees its address.
    core.delete_namespaced_service("a", "default")
    again = {"metadata": {"name": "c"}, "spec": {"clusterIP": real, "ports": [{"port": 80}]}}
    assert core.create_namespaced_service("default", again).spec.cluster_ip == real


@pytest.mark.parametrize("name", ["x\n", "x\n\n", "\nx"])
def test_a_name_with_a_newline_is_invalid(core: client.CoreV1Api, name: str) -> None:
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("default", a_pod(name))
    assert refused.value.status == 422
    body = refusal(refused.value)
    assert body["reason"] == "Invalid"
    assert body["details"]["causes"][0]["field"] == "metadata.name"  # type: ignore[index]
    with pytest.raises(ApiException) as refused_ns:
        core.create_namespace({"metadata": {"name": name}})
    assert refused_ns.value.status == 422
    assert not [p for p in core.list_namespaced_pod("default").items if p.metadata.name.startswith("x")]
