"""resourceVersion semantics (API concepts, "Resource versions" and "Efficient detection of changes").

- `resourceVersionMatch=Exact` returns data at exactly that version; it is only valid with a
  resourceVersion (400 otherwise).
- A watch from a resourceVersion that is too old to serve answers `410 Gone` ("the client must handle
  the case by recognizing the status code 410 Gone, clearing their local cache, performing a new get
  or list operation, and starting the watch from the resourceVersion that was returned").
- A watch from a recent resourceVersion delivers only what changed after it.
"""

from __future__ import annotations

import json

import pytest

from tests.contract.kube.kubectl import Kubectl
from tests.contract.kube.manifests import configmap
from tests.contract.kube.official_client import ClientError, OfficialClient, Request
from tests.contract.kube.waits import until
from tests.waits import collect_lines


def test_exact_match_lists_at_that_version(official: OfficialClient, ns: str) -> None:
    # Two processes of the client instead of five (each spends seconds importing it on a busy
    # machine): the second needs the version the first lists.
    _, listed = official.batch(
        Request.call("CoreV1Api", "create_namespaced_config_map", ns, configmap("a", {"k": "1"})),
        Request.call("CoreV1Api", "list_namespaced_config_map", ns),
    )
    version = listed["metadata"]["resourceVersion"]
    at_version = Request.call(
        "CoreV1Api",
        "list_namespaced_config_map",
        ns,
        resource_version=version,
        resource_version_match="Exact",
    )
    # A change after `version` does not show in a list at exactly `version`.
    exact, changed, again = official.outcomes(
        at_version,
        Request.call("CoreV1Api", "create_namespaced_config_map", ns, configmap("b", {"k": "2"})),
        at_version,
    )
    # Only the last list may be refused; the others are as if each had been its own call.
    assert not isinstance(exact, ClientError), exact
    assert not isinstance(changed, ClientError), changed
    assert exact["metadata"]["resourceVersion"] == version
    assert [c["metadata"]["name"] for c in exact["items"]] == ["a"]
    if isinstance(again, ClientError):
        # A server may have compacted that version away: then 410 Gone, never the current state.
        assert again.status == 410
    else:
        assert [c["metadata"]["name"] for c in again["items"]] == ["a"]
        assert again["metadata"]["resourceVersion"] == version


def test_exact_match_without_a_version_is_a_400(official: OfficialClient, ns: str) -> None:
    with pytest.raises(ClientError) as caught:
        official.call("CoreV1Api", "list_namespaced_config_map", ns, resource_version_match="Exact")
    assert caught.value.status in (400, 422)


def test_watch_from_a_too_old_version_is_gone(official: OfficialClient, kubectl: Kubectl, ns: str) -> None:
    # Churn past a watch cache's window (the API server keeps 100 events per resource by default,
    # --default-watch-cache-size), then watch from version 1, which no server can still serve.
    churn = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [configmap(f"churn-{i}", {"i": "x"}) for i in range(150)],
    }
    kubectl("create", "-n", ns, "-f", "-", stdin=json.dumps(churn), timeout_s=120)
    # --wait=false: a ConfigMap goes at its DELETE, and kubectl's wait would then GET each of the
    # 150 through a client throttled to 5 requests a second (28 s of the test's 31).
    kubectl("delete", "configmaps", "--all", "-n", ns, "--wait=false", timeout_s=120)
    with pytest.raises(ClientError) as caught:
        official.watch(
            "CoreV1Api", "list_namespaced_config_map", namespace=ns, resource_version="1", timeout_s=3
        )
    assert caught.value.status == 410


def test_watch_from_a_recent_version_sees_only_later_changes(official: OfficialClient, ns: str) -> None:
    _, listed = official.batch(
        Request.call("CoreV1Api", "create_namespaced_config_map", ns, configmap("before", {"k": "1"})),
        Request.call("CoreV1Api", "list_namespaced_config_map", ns),
    )
    version = listed["metadata"]["resourceVersion"]
    # Two changes after `version`; the watch ends at the second, the last change there is. Whatever
    # a server wrongly sends from before `version` comes ahead of it, in resourceVersion order, so
    # no quiet time has to pass to be sure nothing else arrives.
    *_, events = official.batch(
        Request.call("CoreV1Api", "create_namespaced_config_map", ns, configmap("after", {"k": "2"})),
        Request.call("CoreV1Api", "create_namespaced_config_map", ns, configmap("last", {"k": "3"})),
        Request.watch(
            "CoreV1Api",
            "list_namespaced_config_map",
            namespace=ns,
            resource_version=version,
            max_events=2,
            timeout_s=30,
        ),
    )
    assert [(e["type"], e["name"]) for e in events] == [("ADDED", "after"), ("ADDED", "last")]


def test_kubectl_get_watch_streams_changes(kubectl: Kubectl, ns: str) -> None:
    # -v=6 logs each request once its response headers arrive, the watch's among them.
    watcher = kubectl.popen(
        "get", "configmaps", "-n", ns, "--watch-only", "-o", "name", "--request-timeout=15s", "-v=6"
    )
    try:
        # kubectl lists, then watches from the list's resourceVersion: once the watch request is
        # answered, every change from here on reaches it.
        assert watcher.stderr is not None
        requests = collect_lines(watcher.stderr)
        until(
            lambda: any("watch=true" in line for line in requests),
            timeout_s=30,
            what="kubectl to open its watch",
        )
        kubectl("create", "configmap", "seen", "-n", ns, "--from-literal=a=b")
        assert watcher.stdout is not None
        line = watcher.stdout.readline().strip()
        assert line == "configmap/seen", json.dumps(line)
    finally:
        watcher.kill()
        watcher.wait(timeout=10)
