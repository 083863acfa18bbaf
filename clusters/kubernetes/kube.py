"""The one typed wrapper around the official `kubernetes` client: raw JSON in, raw JSON out.

The client loads the kubeconfig (credentials, TLS, exec plugins) and owns the connection pool; calls
go through its `ApiClient` directly (`param_serialize` and `call_api`, what its generated methods
call), by the API's own paths. The generated `CoreV1Api`, `BatchV1Api` and the rest are not used: they
import and build a pydantic model for every kind their methods name (V1Pod and everything under it),
1.4 s of CPU at every server start, only to check arguments this module passes as plain dicts. The
answers are parsed here as JSON, so the rest of the backend handles plain dicts; callers run these
methods on worker threads. One `ApiClient` (one connection pool) serves every call and watch of a
cluster.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NewType

import msgspec
import urllib3
from kubernetes import client as _client
from kubernetes import config as _config
from kubernetes.client.exceptions import ApiException

from clusters.kubernetes import incluster
from clusters.kubernetes.manifests import VOLCANO_GROUP, VOLCANO_SCHEDULING_GROUP, VOLCANO_VERSION

# The client is untyped; it is used through these names, and what it returns is typed below.
k8s: Any = _client
k8s_config: Any = _config

Json = dict[str, Any]
JSON = "application/json"
# A collection the informers list and watch, by its API path ("/api/v1/pods").
ListPath = NewType("ListPath", str)
Query = Sequence[tuple[str, str | int | bool | None]]

# The API's answers and watch events, parsed by msgspec: the same objects as json.loads gives, in a
# third to a half of its time (a pod's watch event, a gang's create answer); the pod watch's events
# were the larger part of the informers' tenth of the server's CPU in bench/scale.py. A malformed
# document raises a ValueError either way (msgspec.DecodeError is one).
decode_json = msgspec.json.decode

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
    if (kubeconfig is not None and str(kubeconfig) == incluster.IN_CLUSTER) or (
        kubeconfig is None and incluster.available()
    ):
        # `kubeconfig: in-cluster`, or a pod given none: the cluster it runs in, as its own account.
        incluster.load(configuration)
        return k8s.ApiClient(configuration=configuration)
    k8s_config.load_kube_config(
        config_file=str(kubeconfig) if kubeconfig is not None else None,
        context=context,
        client_configuration=configuration,
        persist_config=False,
    )
    return k8s.ApiClient(configuration=configuration)


def sibling_client(client: Any, *, pool_size: int) -> Any:
    """A second `ApiClient` (a connection pool of its own) with `client`'s configuration: the same
    credentials, TLS and refresh hook, copied as the client's own `get_default_copy` does, rather
    than the kubeconfig read and parsed again (a tenth of a second of CPU, once per cluster)."""
    configuration = copy.deepcopy(client.configuration)
    configuration.connection_pool_maxsize = pool_size
    return k8s.ApiClient(configuration=configuration)


def call(
    client: Any,
    method: str,
    path: str,
    *,
    timeout: tuple[float, float],
    path_params: dict[str, str] | None = None,
    query: Query = (),
    body: Json | None = None,
    content_type: str = JSON,
) -> urllib3.BaseHTTPResponse:
    """One request, as the generated methods make it (bearer token or client certificate from the
    kubeconfig, JSON accepted; path parameters quoted), answering the open response, unread: the
    caller reads it (`json_of`, or line by line for a watch or a log) and releases it. An answer other
    than 2xx raises `ApiException`, with the API's `Status` as its body, as the generated methods do.
    """
    headers = {"Accept": JSON}
    if body is not None:
        headers["Content-Type"] = content_type
    # The body is not handed to `param_serialize`: it is plain JSON already (dicts, lists, strings,
    # numbers), and the client's walk of it (`sanitize_for_serialization`, a copy of every node)
    # gives the same bytes for 0.063 ms of CPU a one-pod Volcano Job, against json.dumps' 0.024;
    # py-spy counted it the largest frame of a gang's create at 100 clusters. The client's REST
    # layer still serialises and sends it.
    method, url, header_params, _, post_params = client.param_serialize(
        method=method,
        resource_path=path,
        path_params=path_params or {},
        query_params=[(k, v) for k, v in query if v is not None],
        header_params=headers,
        body=None,
        auth_settings=["BearerToken"],
    )
    response = client.call_api(method, url, header_params, body, post_params, _request_timeout=timeout)
    if not 200 <= response.status <= 299:
        response.read()
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    opened: urllib3.BaseHTTPResponse = response.response
    return opened


def json_of(response: urllib3.BaseHTTPResponse) -> Json:
    """The whole answer as a JSON object; the connection goes back to the pool."""
    try:
        data: Any = decode_json(response.data)
    finally:
        response.release_conn()
    if not isinstance(data, dict):
        raise ValueError(f"the API answered {type(data).__name__}, not an object")
    return data


def drain(response: urllib3.BaseHTTPResponse) -> None:
    """Read the answer off the connection without parsing it; the connection goes back to the pool."""
    try:
        response.drain_conn()
    finally:
        response.release_conn()


class KubeApi:
    """Blocking calls against one cluster. Each raises `ApiException` or a urllib3/socket error."""

    list_nodes = ListPath("/api/v1/nodes")
    list_pods = ListPath("/api/v1/pods")
    list_jobs = ListPath("/apis/batch/v1/jobs")
    list_volcano_jobs = ListPath(f"/apis/{VOLCANO_GROUP}/{VOLCANO_VERSION}/jobs")

    def __init__(self, client: Any, timeouts: Timeouts) -> None:
        self._client = client
        self._timeouts = timeouts

    def close(self) -> None:
        self._client.close()

    def _json(
        self,
        method: str,
        path: str,
        *,
        path_params: dict[str, str] | None = None,
        query: Query = (),
        body: Json | None = None,
        content_type: str = JSON,
    ) -> Json:
        return json_of(
            call(
                self._client,
                method,
                path,
                timeout=self._timeouts.pair(),
                path_params=path_params,
                query=query,
                body=body,
                content_type=content_type,
            )
        )

    # ---- list and watch --------------------------------------------------------------------------

    def list_page(self, path: ListPath, *, label_selector: str | None, limit: int, token: str | None) -> Json:
        query = [("labelSelector", label_selector or None), ("limit", limit), ("continue", token or None)]
        return self._json("GET", path, query=query)

    def watch(
        self, path: ListPath, *, resource_version: str, label_selector: str | None, timeout_s: int
    ) -> urllib3.BaseHTTPResponse:
        """The open stream of a watch; the caller reads it with `lines` and must release it."""
        query = [
            ("labelSelector", label_selector or None),
            ("watch", True),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", True),
            ("timeoutSeconds", timeout_s),
        ]
        # Beyond the server's own timeout: a silent connection is then a dead one.
        return call(
            self._client,
            "GET",
            path,
            timeout=self._timeouts.pair(timeout_s + self._timeouts.read_s),
            query=query,
        )

    @staticmethod
    def lines(response: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
        """A watch's events, one JSON document a line, as bytes (what `decode_json` reads). The
        client's `iter_resp_lines` decoded each line to text and copied the rest of its chunk after
        every line: a burst of events written in one chunk was copied once per event."""
        partial: list[bytes] = []  # the start of a line that the next chunk ends
        for chunk in response.stream(amt=None, decode_content=False):
            start = 0
            while (end := chunk.find(b"\n", start)) != -1:
                if partial:
                    partial.append(chunk[start:end])
                    line = b"".join(partial)
                    partial.clear()
                else:
                    line = chunk[start:end]
                if line:
                    yield line
                start = end + 1
            if start < len(chunk):
                partial.append(chunk[start:])

    # ---- discovery -------------------------------------------------------------------------------

    def api_groups(self) -> set[str]:
        """The API groups the server serves (GET /apis)."""
        data = self._json("GET", "/apis")
        return {str(g.get("name")) for g in data.get("groups") or ()}

    # ---- writes ----------------------------------------------------------------------------------

    def create_namespace(self, body: Json) -> Json:
        return self._json("POST", "/api/v1/namespaces", body=body)

    def label_namespace(self, name: str, labels: dict[str, str]) -> None:
        self._json(
            "PATCH",
            "/api/v1/namespaces/{name}",
            path_params={"name": name},
            body={"metadata": {"labels": labels}},
            content_type=MERGE_PATCH,
        )

    def create_queue(self, body: Json) -> Json:
        return self._json("POST", f"/apis/{VOLCANO_SCHEDULING_GROUP}/v1beta1/queues", body=body)

    def create_job(self, namespace: str, body: Json) -> Json:
        return self._json(
            "POST",
            "/apis/batch/v1/namespaces/{namespace}/jobs",
            path_params={"namespace": namespace},
            body=body,
        )

    def create_volcano_job(self, namespace: str, body: Json) -> Json:
        return self._json(
            "POST",
            f"/apis/{VOLCANO_GROUP}/{VOLCANO_VERSION}/namespaces/{{namespace}}/jobs",
            path_params={"namespace": namespace},
            body=body,
        )

    def create_service(self, namespace: str, body: Json) -> Json:
        return self._json(
            "POST", "/api/v1/namespaces/{namespace}/services", path_params={"namespace": namespace}, body=body
        )

    def create_secret(self, namespace: str, body: Json) -> Json:
        return self._json(
            "POST", "/api/v1/namespaces/{namespace}/secrets", path_params={"namespace": namespace}, body=body
        )

    def delete_secret(self, namespace: str, name: str) -> None:
        self._json(
            "DELETE",
            "/api/v1/namespaces/{namespace}/secrets/{name}",
            path_params={"namespace": namespace, "name": name},
        )

    def create_event(self, namespace: str, body: Json) -> Json:
        return self._json(
            "POST", "/api/v1/namespaces/{namespace}/events", path_params={"namespace": namespace}, body=body
        )

    def annotate_job(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._json(
            "PATCH",
            "/apis/batch/v1/namespaces/{namespace}/jobs/{name}",
            path_params={"namespace": namespace, "name": name},
            body={"metadata": {"annotations": annotations}},
            content_type=MERGE_PATCH,
        )

    def annotate_volcano_job(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._json(
            "PATCH",
            f"/apis/{VOLCANO_GROUP}/{VOLCANO_VERSION}/namespaces/{{namespace}}/jobs/{{name}}",
            path_params={"namespace": namespace, "name": name},
            body={"metadata": {"annotations": annotations}},
            content_type=MERGE_PATCH,
        )

    def _delete_options(self, grace_period_s: float) -> Json:
        return {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": FOREGROUND,
            "gracePeriodSeconds": max(0, round(grace_period_s)),
        }

    def delete_job(self, namespace: str, name: str, grace_period_s: float) -> None:
        self._json(
            "DELETE",
            "/apis/batch/v1/namespaces/{namespace}/jobs/{name}",
            path_params={"namespace": namespace, "name": name},
            body=self._delete_options(grace_period_s),
        )

    def delete_volcano_job(self, namespace: str, name: str, grace_period_s: float) -> None:
        self._json(
            "DELETE",
            f"/apis/{VOLCANO_GROUP}/{VOLCANO_VERSION}/namespaces/{{namespace}}/jobs/{{name}}",
            path_params={"namespace": namespace, "name": name},
            body=self._delete_options(grace_period_s),
        )

    def delete_volcano_jobs(self, namespace: str, label_selector: str, grace_period_s: float) -> None:
        """Every Volcano Job of the namespace that the selector picks, in one request
        (`deletecollection`: DELETE on the collection). The answer lists what was deleted; it is
        read off the connection unparsed, as nothing here needs it."""
        drain(
            call(
                self._client,
                "DELETE",
                f"/apis/{VOLCANO_GROUP}/{VOLCANO_VERSION}/namespaces/{{namespace}}/jobs",
                timeout=self._timeouts.pair(),
                path_params={"namespace": namespace},
                query=[("labelSelector", label_selector)],
                body=self._delete_options(grace_period_s),
            )
        )

    def delete_jobs(self, namespace: str, label_selector: str, grace_period_s: float) -> None:
        """Every Indexed Job of the namespace that the selector picks, in one request."""
        drain(
            call(
                self._client,
                "DELETE",
                "/apis/batch/v1/namespaces/{namespace}/jobs",
                timeout=self._timeouts.pair(),
                path_params={"namespace": namespace},
                query=[("labelSelector", label_selector)],
                body=self._delete_options(grace_period_s),
            )
        )

    def delete_services(self, namespace: str, label_selector: str) -> None:
        """Every Service of the namespace that the selector picks, in one request."""
        drain(
            call(
                self._client,
                "DELETE",
                "/api/v1/namespaces/{namespace}/services",
                timeout=self._timeouts.pair(),
                path_params={"namespace": namespace},
                query=[("labelSelector", label_selector)],
            )
        )

    def delete_service(self, namespace: str, name: str) -> None:
        self._json(
            "DELETE",
            "/api/v1/namespaces/{namespace}/services/{name}",
            path_params={"namespace": namespace, "name": name},
        )

    def delete_pod(self, namespace: str, name: str, grace_period_s: float) -> None:
        self._json(
            "DELETE",
            "/api/v1/namespaces/{namespace}/pods/{name}",
            path_params={"namespace": namespace, "name": name},
            body={
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "gracePeriodSeconds": max(0, round(grace_period_s)),
            },
        )

    def delete_pod_group(self, namespace: str, name: str) -> None:
        self._json(
            "DELETE",
            f"/apis/{VOLCANO_SCHEDULING_GROUP}/v1beta1/namespaces/{{namespace}}/podgroups/{{name}}",
            path_params={"namespace": namespace, "name": name},
        )

    def list_services(self, label_selector: str) -> list[Json]:
        data = self._json("GET", "/api/v1/services", query=[("labelSelector", label_selector)])
        return list(data.get("items") or ())
