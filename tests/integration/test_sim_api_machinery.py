"""The simulated API server's API machinery, judged by the real kubectl and the official client.

Each test is a behaviour the Kubernetes API documentation defines (dry run, canonical quantities,
field selectors, resourceVersionMatch, server-side field validation, server-side apply, strategic
merge by key, protobuf request bodies) and that a client can see.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from clusters.sim import ManualClock, SimPoolConfig, ThreadedSim, cluster, reads

KUBECTL = shutil.which(
    "kubectl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
)
GPU = "nvidia.com/gpu"
# kube-apiserver asks etcd to compact every five minutes (`--etcd-compaction-interval`'s default).
ETCD_COMPACTION_INTERVAL_S = 300.0


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[ThreadedSim]:
    config = cluster(
        "am", [SimPoolConfig.of("a100", "A100", node_count=2)], default_duration_s=60, history_limit=50
    )
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


def run(
    tmp_path: Path, *args: str, stdin: str | None = None, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    kubeconfig = tmp_path / "kubeconfig"
    result = subprocess.run(
        [
            KUBECTL,
            "--kubeconfig",
            str(kubeconfig),
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


def post_json(url: str, path: str, body: object, content_type: str = "application/json") -> object:
    """A raw request, for bodies the python client's models would refuse to send."""
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": content_type}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


POD_YAML = """
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: {image}
    resources:
      limits:
        nvidia.com/gpu: 4
        cpu: 1000m
        memory: 1024Mi
"""


def a_pod(name: str, gpus: object = "1") -> dict[str, object]:
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "train:1", "resources": {"limits": {GPU: gpus}}}],
        },
    }


# -- dry run ----------------------------------------------------------------------------------


def test_kubectl_server_dry_run_creates_and_cordons_nothing(
    sim: ThreadedSim, core: client.CoreV1Api, tmp_path: Path
) -> None:
    rv = core.list_namespaced_pod("default").metadata.resource_version
    out = run(
        tmp_path,
        "apply",
        "--dry-run=server",
        "--validate=false",
        "-o",
        "json",
        "-f",
        "-",
        stdin=POD_YAML.format(name="dry", image="busybox"),
    )
    shown = json.loads(out.stdout)
    assert shown["metadata"]["uid"]
    assert shown["metadata"].get("resourceVersion", "") == ""
    assert shown["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"  # defaulted, as admitted
    assert core.list_namespaced_pod("default").items == []
    node = core.list_node().items[0].metadata.name
    assert "(server dry run)" in run(tmp_path, "cordon", node, "--dry-run=server").stdout
    assert not core.read_node(node).spec.unschedulable
    # Nothing was written: no resourceVersion was used, so no watcher or controller heard of it.
    assert core.list_namespaced_pod("default").metadata.resource_version == rv
    assert sim.call(lambda: sim.cluster.engine.store.resource_version) == int(rv)


def test_kubectl_diff_changes_nothing(core: client.CoreV1Api, tmp_path: Path) -> None:
    run(tmp_path, "apply", "--validate=false", "-f", "-", stdin=POD_YAML.format(name="d", image="busybox"))
    before = core.read_namespaced_pod("d", "default")
    out = run(tmp_path, "diff", "-f", "-", stdin=POD_YAML.format(name="d", image="busybox:2"), ok=False)
    assert out.returncode == 1, out.stderr  # 1: differences found
    assert "+  - image: busybox:2" in out.stdout
    after = core.read_namespaced_pod("d", "default")
    assert after.spec.containers[0].image == "busybox"
    assert after.metadata.resource_version == before.metadata.resource_version


def test_client_dry_run_on_every_verb_stores_nothing(sim: ThreadedSim, core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", a_pod("dr", "8"), dry_run="All")
    assert created.metadata.uid
    assert not created.metadata.resource_version
    with pytest.raises(ApiException) as info:
        core.read_namespaced_pod("dr", "default")
    assert info.value.status == 404
    core.create_namespaced_pod("default", a_pod("real"))
    live = core.read_namespaced_pod("real", "default")
    patched = core.patch_namespaced_pod(
        "real", "default", {"metadata": {"labels": {"x": "y"}}}, dry_run="All"
    )
    assert patched.metadata.labels == {"x": "y"}
    assert patched.metadata.resource_version == live.metadata.resource_version
    live.metadata.labels = {"z": "1"}
    replaced = core.replace_namespaced_pod("real", "default", live, dry_run="All")
    assert replaced.metadata.labels == {"z": "1"}
    deadline = time.monotonic() + 10
    while not core.read_namespaced_pod("real", "default").spec.node_name:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    preview = core.delete_namespaced_pod("real", "default", dry_run="All")
    # The answer shows the pod as a graceful delete would mark it; the stored pod is untouched.
    assert preview.metadata.deletion_grace_period_seconds == 30
    assert preview.metadata.deletion_timestamp is not None
    now = core.read_namespaced_pod("real", "default")
    assert now.metadata.labels is None
    assert now.metadata.deletion_timestamp is None
    # 8 GPUs were asked for in dry run: no node lost any.
    assert all(p.metadata.name == "real" for p in core.list_pod_for_all_namespaces().items)
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod("default", a_pod("bad"), dry_run="Some")
    assert info.value.status == 400


# -- quantities -------------------------------------------------------------------------------


def test_quantities_come_back_as_canonical_strings(sim: ThreadedSim, core: client.CoreV1Api) -> None:
    body = a_pod("q", 4)
    body["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1000m", "memory": 1073741824, GPU: 4}  # type: ignore[index]
    body["spec"]["containers"][0]["resources"]["limits"] = {GPU: 4, "memory": "1024Mi", "cpu": 0.5}  # type: ignore[index]
    post_json(sim.url, "/api/v1/namespaces/default/pods", body)
    # The python client's models refuse a number where a quantity belongs: listing works only if
    # the server canonicalised.
    pods = core.list_namespaced_pod("default").items
    resources = pods[0].spec.containers[0].resources
    assert resources.requests == {"cpu": "1", "memory": "1073741824", GPU: "4"}  # a number stays decimal
    assert resources.limits == {GPU: "4", "memory": "1Gi", "cpu": "500m"}
    events = list(watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=1))
    assert events
    assert events[0]["object"].spec.containers[0].resources.limits[GPU] == "4"
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod("default", a_pod("nonsense", "four"))
    assert info.value.status == 400


# -- field selectors, resourceVersionMatch, watch ------------------------------------------------


def test_field_selectors_are_checked_and_defaults_match(core: client.CoreV1Api) -> None:
    names = {n.metadata.name for n in core.list_node(field_selector="spec.unschedulable=false").items}
    assert len(names) == 2
    core.patch_node(sorted(names)[0], {"spec": {"unschedulable": True}})
    assert [n.metadata.name for n in core.list_node(field_selector="spec.unschedulable=true").items] == [
        sorted(names)[0]
    ]
    for selector in ("spec.unschedulabel=false", "metadata.labels.x=y", "status.phase=Ready"):
        with pytest.raises(ApiException) as info:
            core.list_node(field_selector=selector)
        assert info.value.status == 400, selector
    with pytest.raises(ApiException) as info:
        core.list_namespaced_pod("default", field_selector="spec.nodename=x")
    assert info.value.status == 400


def test_resource_version_match_exact_lists_the_past(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", a_pod("first"))
    rv = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", a_pod("second"))
    core.delete_namespaced_pod("first", "default", grace_period_seconds=0)
    then = core.list_namespaced_pod("default", resource_version=rv, resource_version_match="Exact")
    assert then.metadata.resource_version == rv
    assert [p.metadata.name for p in then.items] == ["first"]
    assert {p.metadata.name for p in core.list_namespaced_pod("default").items} == {"second"}
    for i in range(40):  # history_limit is 50
        core.create_namespaced_pod("default", a_pod(f"churn-{i}"))
    with pytest.raises(ApiException) as info:
        core.list_namespaced_pod("default", resource_version=rv, resource_version_match="Exact")
    assert info.value.status == 410
    with pytest.raises(ApiException) as info:
        core.list_namespaced_pod("default", resource_version_match="Exact")
    assert info.value.status == 422


def test_a_resource_version_from_the_future_is_waited_for_then_504(
    monkeypatch: pytest.MonkeyPatch, core: client.CoreV1Api
) -> None:
    monkeypatch.setattr(reads, "FRESHNESS_WAIT_S", 0.5)
    now = int(core.list_namespaced_pod("default").metadata.resource_version)
    future = str(now + 1000)
    started = time.monotonic()
    with pytest.raises(ApiException) as info:
        core.list_namespaced_pod("default", resource_version=future, resource_version_match="NotOlderThan")
    assert time.monotonic() - started >= 0.5  # the server waited for it first
    assert info.value.status == 504
    assert "ResourceVersionTooLarge" in str(info.value.body)
    # A watch answers with an ERROR event in the stream, on which an informer relists.
    response = core.list_namespaced_pod(
        "default", watch=True, resource_version=future, timeout_seconds=1, _preload_content=False
    )
    events = [json.loads(line) for line in response.read().decode().splitlines() if line]
    assert [(e["type"], e["object"]["code"]) for e in events] == [("ERROR", 504)]
    # A revision reached while waiting is served. The wait is made generous so that a slow create on a
    # loaded machine still lands inside it; the list answers as soon as the revision exists.
    monkeypatch.setattr(reads, "FRESHNESS_WAIT_S", 30.0)
    threading.Timer(0.1, lambda: core.create_namespaced_pod("default", a_pod("soon"))).start()
    listed = core.list_namespaced_pod(
        "default", resource_version=str(now + 1), resource_version_match="NotOlderThan"
    )
    assert [p.metadata.name for p in listed.items] == ["soon"]


def test_watch_list_ends_initial_events_with_a_bookmark(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", a_pod("wl"))
    response = core.list_namespaced_pod(
        "default",
        watch=True,
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        allow_watch_bookmarks=True,
        timeout_seconds=1,
        _preload_content=False,
    )
    events = [json.loads(line) for line in response.read().decode().splitlines() if line]
    assert (events[0]["type"], events[0]["object"]["metadata"]["name"]) == ("ADDED", "wl")
    assert events[1]["type"] == "BOOKMARK"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_creation_timestamp_null_is_stamped_by_the_server(sim: ThreadedSim, core: client.CoreV1Api) -> None:
    body = a_pod("ts")
    body["metadata"]["creationTimestamp"] = None  # type: ignore[index]
    post_json(sim.url, "/api/v1/namespaces/default/pods", body)
    assert core.read_namespaced_pod("ts", "default").metadata.creation_timestamp is not None


def test_watch_from_before_the_last_compaction_is_410_gone() -> None:
    # etcd is compacted every five minutes of cluster time; a manual clock moves the cluster past
    # each compaction at once instead of waiting for it.
    clock = ManualClock()
    config = cluster("compact", [SimPoolConfig.of("a100", "A100")])
    with ThreadedSim(config, clock=clock) as sim:
        configuration = client.Configuration()
        configuration.host = sim.url
        core = client.CoreV1Api(client.ApiClient(configuration))
        old = core.list_namespaced_pod("default").metadata.resource_version
        for i in range(3):
            # On the simulator's thread, so that no request sees the clock half moved.
            sim.call(clock.advance, ETCD_COMPACTION_INTERVAL_S + 1)
            core.create_namespaced_config_map("default", {"metadata": {"name": f"tick-{i}"}})
        with pytest.raises(ApiException) as info:
            for _ in watch.Watch().stream(
                core.list_namespaced_pod, "default", resource_version=old, timeout_seconds=2
            ):
                pass
        assert info.value.status == 410
        with pytest.raises(ApiException) as info:
            core.list_namespaced_pod("default", resource_version=old, resource_version_match="Exact")
        assert info.value.status == 410
        # A client that relists gets a fresh resourceVersion it can watch from.
        fresh = core.list_namespaced_pod("default").metadata.resource_version
        assert (
            list(
                watch.Watch().stream(
                    core.list_namespaced_pod, "default", resource_version=fresh, timeout_seconds=1
                )
            )
            == []
        )


def test_watch_from_before_the_watch_cache_window_is_410_gone(core: client.CoreV1Api) -> None:
    # No watch can start from before the server's caches did (a list at start-up).
    with pytest.raises(ApiException) as info:
        for _ in watch.Watch().stream(
            core.list_namespaced_pod, "default", resource_version="1", timeout_seconds=2
        ):
            pass
    assert info.value.status == 410


def test_the_watch_cache_keeps_only_the_last_100_stale_events_of_a_kind() -> None:
    # One second of cluster time passes after each create, on a manual clock: when the 101st event
    # overflows the window of 100 the first is 100 s old, past the cache's 75 s of freshness, so the
    # window does not grow; etcd's compaction (every 300 s) has not yet reached any of them.
    clock = ManualClock()
    config = cluster("window", [SimPoolConfig.of("a100", "A100")])
    with ThreadedSim(config, clock=clock) as sim:
        configuration = client.Configuration()
        configuration.host = sim.url
        core = client.CoreV1Api(client.ApiClient(configuration))
        old = core.list_namespaced_config_map("default").metadata.resource_version
        for i in range(110):
            core.create_namespaced_config_map("default", {"metadata": {"name": f"c-{i}"}})
            sim.call(clock.advance, 1.0)
        with pytest.raises(ApiException) as info:
            for _ in watch.Watch().stream(
                core.list_namespaced_config_map, "default", resource_version=old, timeout_seconds=2
            ):
                pass
        assert info.value.status == 410
        # (That the window is per kind is tested on its own in tests/unit/test_sim_parts.py.)
