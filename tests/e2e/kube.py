"""Shared parts of the end-to-end tests that run `gpufed serve` against simulated Kubernetes clusters.

The simulator runs as its own process (as `gpufed up` runs it); the server reaches it only through
kubeconfig contexts with the official client, and so do these helpers, to see what a cluster holds.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from federation.api.v1 import gpufed_pb2 as pb
from federation.sim_process import SimProcess
from tests.e2e.harness import ServerProcess


def write_config(
    path: Path, sims: SimProcess, clusters: list[dict[str, Any]], *, grace_s: float, **rest: Any
) -> Path:
    """A federation config whose clusters are the simulator's, reached by kubeconfig context."""
    config = {
        **rest,
        "clusters": [
            {
                **c,
                "backend": "kubernetes",
                "kubeconfig": str(sims.kubeconfig),
                "context": c["name"],
                "unreachableGraceSeconds": grace_s,
            }
            for c in clusters
        ],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _api(sims: SimProcess, cluster: str) -> Any:
    return k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(sims.kubeconfig), context=cluster
    )


def gang_pods(sims: SimProcess, cluster: str, job_id: str) -> list[Any]:
    """Every pod of a job on a cluster (every attempt)."""
    with _api(sims, cluster) as api:
        pods = k8s.CoreV1Api(api).list_pod_for_all_namespaces(label_selector=f"gpufed.io/job-id={job_id}")
    return list(pods.items)


def gangs(sims: SimProcess, cluster: str, job_id: str) -> list[dict[str, Any]]:
    """The Volcano Jobs of a job on a cluster (every attempt)."""
    with _api(sims, cluster) as api:
        found: Any = k8s.CustomObjectsApi(api).list_cluster_custom_object(
            "batch.volcano.sh", "v1alpha1", "jobs", label_selector=f"gpufed.io/job-id={job_id}"
        )
    return list(found["items"])


def sim_admin(
    sims: SimProcess, cluster: str, method: str, path: str, body: dict[str, Any] | None = None
) -> Any:
    """A fault or query through the simulator's admin endpoint, as an operator's chaos tool would."""
    request = urllib.request.Request(
        sims.endpoints[cluster].admin_url + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only
    with opener.open(request, timeout=10) as response:
        return json.loads(response.read())


def job_of(fed: ServerProcess, user: str, job_id: str) -> pb.Job:
    with fed.client(user) as client:
        return client.get(job_id)
