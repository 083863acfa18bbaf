"""Shared parts of the end-to-end tests that run `gpufed serve` against simulated Kubernetes clusters.

The simulator runs as its own process (as `gpufed up` runs it); the server reaches it only through
kubeconfig contexts with the official client, and so do these helpers, to see what a cluster holds.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch

from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.contract.kube.kubectl import KUBECTL
from tests.e2e.harness import ServerProcess


def onprem_a100(nodes: int) -> dict[str, Any]:
    """The simulated private cluster most e2e modules run on: `onprem`, one pool of 8-GPU A100 nodes
    at the internal rate of $1.10 a GPU-hour."""
    return {
        "name": "onprem",
        "provider": "private",
        "region": "dc1",
        "pools": [a100_pool(nodes)],
    }


def a100_pool(
    nodes: int, *, name: str = "a100", kind: str = "private", price: float = 1.1, **extra: Any
) -> dict[str, Any]:
    """A pool of 8-GPU A100 nodes, by default private at the internal rate of $1.10 a GPU-hour;
    `extra`: further pool settings (`reclaimsPerNodeHour` of a spot pool)."""
    return {
        "name": name,
        "gpuType": "A100",
        "kind": kind,
        "usdPerGpuHour": price,
        "gpusPerNode": 8,
        "nodes": nodes,
        **extra,
    }


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


@contextmanager
def serve_clusters(
    etcd: EtcdProcess, tmp_path: Path, sims: SimProcess, clusters: list[dict[str, Any]], **config: Any
) -> Iterator[ServerProcess]:
    """`gpufed serve` on `etcd`, its config (`write_config`: the simulator's `clusters` and `config`'s
    other sections) and state under `tmp_path`; stopped on leaving."""
    path = write_config(tmp_path / "federation.yaml", sims, clusters, **config)
    process = ServerProcess(etcd.endpoint, tmp_path / "state", config=path)
    process.start()
    try:
        yield process
    finally:
        process.stop()


def sim_kubectl(
    sims: SimProcess, cluster: str, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """kubectl on one of the simulator's contexts, as a user would run it: the independent judge of
    what a member cluster holds. With `check`, a non-zero exit fails the test with kubectl's words."""
    assert KUBECTL is not None, "kubectl is needed (make setup installs it in .venv/bin)"
    done = subprocess.run(
        [KUBECTL, "--kubeconfig", str(sims.kubeconfig), "--context", cluster,
         "--cache-dir", str(sims.kubeconfig.parent / "kubectl-cache"), "--request-timeout=10s", *args],
        input=stdin, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if check:
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done


def sim_kubectl_json(sims: SimProcess, cluster: str, *args: str) -> Any:
    """`sim_kubectl ... -o json`, parsed."""
    return json.loads(sim_kubectl(sims, cluster, *args, "-o", "json").stdout)


def _api(sims: SimProcess, cluster: str) -> Any:
    return k8s_config.new_client_from_config(config_file=str(sims.kubeconfig), context=cluster)


def gang_pods(sims: SimProcess, cluster: str, job_id: str) -> list[Any]:
    """Every pod of a job on a cluster (every attempt)."""
    with _api(sims, cluster) as api:
        pods = k8s.CoreV1Api(api).list_pod_for_all_namespaces(label_selector=f"gpufed.io/job-id={job_id}")
    return list(pods.items)


def capacity_types(sims: SimProcess, cluster: str, job_id: str) -> set[str]:
    """The capacity-type labels of the nodes the job's pods are bound to, read with the official client."""
    pods = gang_pods(sims, cluster, job_id)
    assert pods, f"no pod of {job_id} on {cluster}"
    with _api(sims, cluster) as api:
        core = k8s.CoreV1Api(api)
        return {core.read_node(p.spec.node_name).metadata.labels["gpufed.io/capacity-type"] for p in pods}


def gpufed_pod_jobs(sims: SimProcess, cluster: str) -> list[str]:
    """The job id of every gpufed pod still on a cluster (one entry a pod), as the official client
    lists them: what the soak checks the collector left behind."""
    with _api(sims, cluster) as api:
        pods = k8s.CoreV1Api(api).list_pod_for_all_namespaces(label_selector="gpufed.io/job-id")
    return [p.metadata.labels["gpufed.io/job-id"] for p in pods.items]


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
    return fed.reader(user).get(job_id)


@dataclass
class PodLife:
    tenant: str
    gpus: int
    job_id: str = ""
    attempt: int = 0
    start_s: float | None = None
    end_s: float | None = None
    cluster: str = ""
    name: str = ""
    node: str = ""


@dataclass
class PodRecorder:
    """Every pod's GPU time as its cluster reports it: startTime to termination (or deletion)."""

    pods: dict[str, PodLife] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    watches: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stopped: bool = False

    def follow(self, sims: SimProcess, cluster: str) -> threading.Thread:
        """Record `cluster`'s pods from now on: a list, then a watch from the list's resourceVersion
        (what an informer does), so that no pod is missed however late the watch's thread runs.
        Without the list, the watch began at whatever moment its request reached the server, and the
        tests slept a little and hoped it was open: a pod that came and went before it was unseen."""
        api = k8s_config.new_client_from_config(config_file=str(sims.kubeconfig), context=cluster)
        core = k8s.CoreV1Api(api)
        listed = core.list_pod_for_all_namespaces()
        for pod in listed.items:
            self._seen(cluster, "ADDED", pod)
        w = k8s_watch.Watch()
        self.watches.append(w)

        def run() -> None:
            try:
                for event in w.stream(
                    core.list_pod_for_all_namespaces,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=300,
                ):
                    self._seen(cluster, event["type"], event["object"])
            except Exception as error:  # the simulator going away at teardown ends the stream
                if not self.stopped:
                    self.errors.append(f"{cluster}: {error!r}")

        thread = threading.Thread(target=run, daemon=True, name=f"pods-{cluster}")
        thread.start()
        return thread

    def _seen(self, cluster: str, kind: str, pod: Any) -> None:
        labels = pod.metadata.labels or {}
        gpus = sum(
            int((c.resources.limits or {}).get("nvidia.com/gpu", 0)) for c in pod.spec.containers or []
        )
        if "gpufed.io/tenant" not in labels or gpus == 0:
            return
        key = f"{cluster}/{pod.metadata.uid}"
        with self.lock:
            life = self.pods.setdefault(
                key,
                PodLife(
                    labels["gpufed.io/tenant"],
                    gpus,
                    labels.get("gpufed.io/job-id", ""),
                    int(labels.get("gpufed.io/attempt", "0")),
                    cluster=cluster,
                    name=pod.metadata.name,
                ),
            )
            if pod.spec.node_name:
                life.node = pod.spec.node_name
            if pod.status.start_time is not None and life.start_s is None:
                life.start_s = pod.status.start_time.timestamp()
            if life.end_s is None:
                for cs in pod.status.container_statuses or []:
                    done = cs.state.terminated if cs.state is not None else None
                    if done is not None and done.finished_at is not None:
                        life.end_s = done.finished_at.timestamp()
                if kind == "DELETED" and life.end_s is None and life.start_s is not None:
                    # Killed on deletion: it held its GPUs until the cluster removed it.
                    life.end_s = time.time()

    def lives_by_job(self) -> dict[tuple[str, int], list[PodLife]]:
        out: dict[tuple[str, int], list[PodLife]] = defaultdict(list)
        with self.lock:
            for life in self.pods.values():
                out[(life.job_id, life.attempt)].append(life)
        return dict(out)

    def gpu_hours_by_tenant(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        with self.lock:
            for life in self.pods.values():
                if life.start_s is not None and life.end_s is not None:
                    out[life.tenant] += life.gpus * (life.end_s - life.start_s) / 3600.0
        return dict(out)

    def stop(self) -> None:
        self.stopped = True
        for w in self.watches:
            w.stop()
