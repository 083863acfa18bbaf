"""The one typed wrapper around the official `kubernetes` client: raw JSON in, raw JSON out.

The client is synchronous and untyped, and its model classes are slow to build and to deserialise.
Every call here asks for the undecoded response (`_preload_content=False`) and parses the JSON itself,
so the rest of the backend handles plain dicts; callers run these methods on worker threads. One
`ApiClient` (one connection pool) serves every call and watch of a cluster.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client as _client
from kubernetes import config as _config
from kubernetes.watch import watch as _watch

from clusters.kubernetes.manifests import VOLCANO_GROUP, VOLCANO_SCHEDULING_GROUP, VOLCANO_VERSION

# The client is typed only in part (its generated APIs want model classes where it happily takes
# dicts); it is used through these untyped names, and what it returns is typed below.
k8s: Any = _client
k8s_config: Any = _config
iter_resp_lines: Any = _watch.iter_resp_lines

Json = dict[str, Any]
JSON = "application/json"
# A list-or-watch function of the generated client, with its resource fixed (group, plural, ...).
ListCall = Callable[..., Any]

FOREGROUND = "Foreground"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float
    read_s: float

    def pair(self, read_s: float | None = None) -> tuple[float, float]:
        return (self.connect_s, self.read_s if read_s is None else read_s)


def api_client(kubeconfig: Path | None, context: str | None, *, pool_size: int) -> Any:
    """An `ApiClient` for one kubeconfig context, with a pool big enough for its watches and calls."""
    configuration = k8s.Configuration()
    # Watches hold connections for minutes; the default pool (5 per core) would starve the calls.
    configuration.connection_pool_maxsize = pool_size
    # One quick retry of a refused connection; longer outages are the backend's to ride out.
    configuration.retries = 1
    k8s_config.load_kube_config(
        config_file=str(kubeconfig) if kubeconfig is not None else None,
        context=context,
        client_configuration=configuration,
        persist_config=False,
    )
    return k8s.ApiClient(configuration=configuration)


def _json(response: Any) -> Json:
    try:
        data: Any = json.loads(response.data)
    finally:
        response.release_conn()
    if not isinstance(data, dict):
        raise ValueError(f"the API answered {type(data).__name__}, not an object")
    return data


class KubeApi:
    """Blocking calls against one cluster. Each raises `ApiException` or a urllib3/socket error."""

    def __init__(self, client: Any, timeouts: Timeouts) -> None:
        self._client = client
        self._core = k8s.CoreV1Api(client)
        self._batch = k8s.BatchV1Api(client)
        self._custom = k8s.CustomObjectsApi(client)
        self._apis = k8s.ApisApi(client)
        self._timeouts = timeouts

    def close(self) -> None:
        self._client.close()

    # ---- list and watch --------------------------------------------------------------------------

    @property
    def list_nodes(self) -> ListCall:
        call: ListCall = self._core.list_node
        return call

    @property
    def list_pods(self) -> ListCall:
        call: ListCall = self._core.list_pod_for_all_namespaces
        return call

    @property
    def list_jobs(self) -> ListCall:
        call: ListCall = self._batch.list_job_for_all_namespaces
        return call

    @property
    def list_volcano_jobs(self) -> ListCall:
        return functools.partial(
            self._custom.list_cluster_custom_object, VOLCANO_GROUP, VOLCANO_VERSION, "jobs"
        )

    def list_page(self, call: ListCall, *, label_selector: str | None, limit: int, token: str | None) -> Json:
        kwargs: dict[str, Any] = {"limit": limit, "_preload_content": False}
        if label_selector:
            kwargs["label_selector"] = label_selector
        if token:
            kwargs["_continue"] = token
        return _json(call(**kwargs, _request_timeout=self._timeouts.pair()))

    def watch(
        self, call: ListCall, *, resource_version: str, label_selector: str | None, timeout_s: int
    ) -> urllib3.BaseHTTPResponse:
        """The open stream of a watch; the caller reads it with `lines` and must release it."""
        kwargs: dict[str, Any] = {
            "watch": True,
            "resource_version": resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": timeout_s,
            "_preload_content": False,
            # Beyond the server's own timeout: a silent connection is then a dead one.
            "_request_timeout": self._timeouts.pair(timeout_s + self._timeouts.read_s),
        }
        if label_selector:
            kwargs["label_selector"] = label_selector
        response: urllib3.BaseHTTPResponse = call(**kwargs)
        return response

    @staticmethod
    def lines(response: urllib3.BaseHTTPResponse) -> Iterator[str]:
        for line in iter_resp_lines(response):
            if line:
                yield line

    # ---- discovery -------------------------------------------------------------------------------

    def api_groups(self) -> set[str]:
        """The API groups the server serves (GET /apis)."""
        data = _json(
            self._apis.get_api_versions(_preload_content=False, _request_timeout=self._timeouts.pair())
        )
        return {str(g.get("name")) for g in data.get("groups") or ()}

    # ---- writes ----------------------------------------------------------------------------------

    def create_namespace(self, body: Json) -> Json:
        return _json(
            self._core.create_namespace(
                body, _content_type=JSON, _preload_content=False, _request_timeout=self._timeouts.pair()
            )
        )

    def create_queue(self, body: Json) -> Json:
        return _json(
            self._custom.create_cluster_custom_object(
                VOLCANO_SCHEDULING_GROUP,
                "v1beta1",
                "queues",
                body,
                _content_type=JSON,
                _preload_content=False,
                _request_timeout=self._timeouts.pair(),
            )
        )

    def create_job(self, namespace: str, body: Json) -> Json:
        return _json(
            self._batch.create_namespaced_job(
                namespace,
                body,
                _content_type=JSON,
                _preload_content=False,
                _request_timeout=self._timeouts.pair(),
            )
        )

    def create_volcano_job(self, namespace: str, body: Json) -> Json:
        return _json(
            self._custom.create_namespaced_custom_object(
                VOLCANO_GROUP,
                VOLCANO_VERSION,
                namespace,
                "jobs",
                body,
                _content_type=JSON,
                _preload_content=False,
                _request_timeout=self._timeouts.pair(),
            )
        )

    def create_service(self, namespace: str, body: Json) -> Json:
        return _json(
            self._core.create_namespaced_service(
                namespace,
                body,
                _content_type=JSON,
                _preload_content=False,
                _request_timeout=self._timeouts.pair(),
            )
        )

    def create_event(self, namespace: str, body: Json) -> Json:
        return _json(
            self._core.create_namespaced_event(
                namespace,
                body,
                _content_type=JSON,
                _preload_content=False,
                _request_timeout=self._timeouts.pair(),
            )
        )

    def annotate_job(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        body = {"metadata": {"annotations": annotations}}
        _json(
            self._batch.patch_namespaced_job(
                name,
                namespace,
                body,
                _content_type=MERGE_PATCH,
                _preload_content=False,
                _request_timeout=self._timeouts.pair(),
            )
        )

    def annotate_volcano_job(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        body = {"metadata": {"annotations": annotations}}
        _json(
            self._custom.patch_namespaced_custom_object(
                VOLCANO_GROUP,
                VOLCANO_VERSION,
                namespace,
                "jobs",
                name,
                body,
                _content_type=MERGE_PATCH,
                _preload_content=False,
                _request_timeout=self._timeouts.pair(),
            )
        )

    def _delete_options(self, grace_period_s: float) -> Json:
        return {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": FOREGROUND,
            "gracePeriodSeconds": max(0, round(grace_period_s)),
        }

    def delete_job(self, namespace: str, name: str, grace_period_s: float) -> None:
        _json(
            self._batch.delete_namespaced_job(
                name,
                namespace,
                body=self._delete_options(grace_period_s),
                _content_type=JSON,
                _preload_content=False,
                _request_timeout=self._timeouts.pair(),
            )
        )

    def delete_volcano_job(self, namespace: str, name: str, grace_period_s: float) -> None:
        _json(
            self._custom.delete_namespaced_custom_object(
                VOLCANO_GROUP,
                VOLCANO_VERSION,
                namespace,
                "jobs",
                name,
                body=self._delete_options(grace_period_s),
                _content_type=JSON,
                _preload_content=False,
                _request_timeout=self._timeouts.pair(),
            )
        )

    def delete_service(self, namespace: str, name: str) -> None:
        _json(
            self._core.delete_namespaced_service(
                name, namespace, _preload_content=False, _request_timeout=self._timeouts.pair()
            )
        )

    def delete_pod(self, namespace: str, name: str, grace_period_s: float) -> None:
        _json(
            self._core.delete_namespaced_pod(
                name,
                namespace,
                body={
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "gracePeriodSeconds": max(0, round(grace_period_s)),
                },
                _content_type=JSON,
                _preload_content=False,
                _request_timeout=self._timeouts.pair(),
            )
        )

    def delete_pod_group(self, namespace: str, name: str) -> None:
        _json(
            self._custom.delete_namespaced_custom_object(
                VOLCANO_SCHEDULING_GROUP,
                "v1beta1",
                namespace,
                "podgroups",
                name,
                _preload_content=False,
                _request_timeout=self._timeouts.pair(),
            )
        )

    def list_services(self, label_selector: str) -> list[Json]:
        data = _json(
            self._core.list_service_for_all_namespaces(
                label_selector=label_selector, _preload_content=False, _request_timeout=self._timeouts.pair()
            )
        )
        return list(data.get("items") or ())
