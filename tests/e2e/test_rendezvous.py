"""End to end: a real rendezvous. A 2-pod x 2-process job completes an all-reduce with jax.distributed
(gloo, on CPU) using nothing but the environment and hostfile gpufed gives its pods, on a Volcano
cluster and on one without Volcano (an Indexed Job).

The simulated clusters run in process mode (`localExec`): each pod's command is a local process with
the pod's environment, its downward API files and its host name, and an /etc/hosts that resolves its
gang's pod names to loopback (clusters/sim/local_exec.py). The judges are kubectl (the pods' logs:
every rank's sum; the launcher's hostfile; the namespaces) and jax's own check of the sum.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusters.sim import local_exec
from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, wait_for
from tests.e2e.kube import gang_pods, job_of, serve_clusters, sim_kubectl
from tests.side_venv import REPO, ensure_side_venv

KUBECTL = shutil.which(
    "kubectl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
)
pytestmark = [
    pytest.mark.e2e,
    # One worker runs them all: every gang's coordinator listens on the clusters' MASTER_PORT.
    pytest.mark.xdist_group("rendezvous"),
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed"),
    pytest.mark.skipif(local_exec.available() is not None, reason=str(local_exec.available())),
]
# jax with jaxlib's gloo collectives, in a venv of its own (about 0.5 GB: not the project's).
JAX = "jax==0.10.2"
SCRIPT = REPO / "examples" / "rendezvous" / "jax_allreduce.py"
# What each worker of SCRIPT prints once its all-reduce is done.
ALLREDUCE_LINE = re.compile(
    r"allreduce rank=(?P<rank>\d+) world=(?P<world>\d+) node_rank=(?P<node_rank>\d+) "
    r"host=\S+ sum=(?P<sum>\d+) expected=(?P<expected>\d+)"
)


def _pool(gpu_type: str) -> dict[str, Any]:
    return {"name": gpu_type.lower(), "gpuType": gpu_type, "kind": "private", "usdPerGpuHour": 1.0,
            "gpusPerNode": 4, "nodes": 2}  # fmt: skip


# A GPU type per cluster, so that a job's gpuTypes says where it runs.
CLUSTERS: list[dict[str, Any]] = [
    {"name": "vc", "provider": "private", "region": "dc1", "localExec": True, "pools": [_pool("A100")]},
    {"name": "plain", "provider": "private", "region": "dc1", "localExec": True, "volcano": False,
     "pools": [_pool("H100")]},
]  # fmt: skip


def allreduce_job(name: str, gpu_type: str, python: Path, *, tasks: tuple[str, ...] = ("trainer",)) -> str:
    """Two pods of two GPUs (two processes) each: one task of two replicas, or two tasks of one."""
    replicas = 2 // len(tasks)
    listed = "".join(
        f"""\
    - name: {task}
      replicas: {replicas}
      gpus: 2
      image: ghcr.io/example/jax:cpu
      command: [{python}, {SCRIPT}]
"""
        for task in tasks
    )
    return f"""\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {{name: {name}}}
spec:
  gpuTypes: [{gpu_type}]
  tasks:
{listed}"""


@pytest.fixture(scope="module")
def jax_python() -> Path:
    return ensure_side_venv(".venv-jax", JAX)


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with serve_clusters(
        etcd,
        tmp_path,
        sims,
        CLUSTERS,
        grace_s=8,
        tenants=[{"name": "platform"}, {"name": "nlp"}, {"name": "vision"}],
        users=[
            {"name": "admin", "tenant": "platform", "role": "admin"},
            {"name": "bob", "tenant": "nlp"},
            {"name": "alice", "tenant": "vision"},
        ],
    ) as process:
        yield process


def kubectl(sims: SimProcess, cluster: str, *args: str) -> str:
    return sim_kubectl(sims, cluster, *args).stdout


def follow_log(sims: SimProcess, cluster: str, namespace: str, pod: str) -> subprocess.Popen[str]:
    """`kubectl logs -f` of a pod, started as soon as it exists (retrying until it has a container
    to follow): its output is the pod's whole log even if the pod is deleted before the end."""
    assert KUBECTL is not None
    command = [KUBECTL, "--kubeconfig", str(sims.kubeconfig), "--context", cluster, "logs", "-f",
               "-n", namespace, pod, "--pod-running-timeout=60s"]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def finished(fed: ServerProcess, user: str, job_id: str) -> str | None:
    name = str(pb.JobPhase.Name(job_of(fed, user, job_id).phase)).removeprefix("JOB_PHASE_")
    return name if name in ("SUCCEEDED", "FAILED", "CANCELLED") else None


@pytest.mark.parametrize(
    ("cluster", "gpu_type", "tasks"),
    [
        pytest.param("vc", "A100", ("trainer",), id="volcano"),
        # A master and a worker task: the gang that only Volcano runs, each pod its own template.
        pytest.param("vc", "A100", ("master", "worker"), id="volcano-master-worker"),
        pytest.param("plain", "H100", ("trainer",), id="indexed-job"),
    ],
)
def test_two_pods_of_two_processes_complete_an_allreduce(
    fed: ServerProcess,
    sims: SimProcess,
    jax_python: Path,
    cluster: str,
    gpu_type: str,
    tasks: tuple[str, ...],
) -> None:
    job = allreduce_job("allreduce", gpu_type, jax_python, tasks=tasks)
    job_id = fed.client("bob").submit(job).job_id
    wait_for(lambda: len(gang_pods(sims, cluster, job_id)) == 2, timeout_s=60)
    pods = sorted(gang_pods(sims, cluster, job_id), key=lambda p: p.metadata.name)
    assert {p.metadata.namespace for p in pods} == {"gpufed-nlp"}
    # Followed from the start with `kubectl logs -f`: when the master task ends, Volcano ends the
    # job and its other pods go, and a log asked for afterwards is NotFound (a busy machine's run
    # once finished the master before the worker's log was read).
    followers = {p.metadata.name: follow_log(sims, cluster, "gpufed-nlp", p.metadata.name) for p in pods}
    wait_for(lambda: finished(fed, "bob", job_id) is not None, timeout_s=240)
    logs = {name: follower.communicate(timeout=60)[0] for name, follower in followers.items()}
    assert finished(fed, "bob", job_id) == "SUCCEEDED", logs
    ranks: dict[int, str] = {}
    for text in logs.values():
        # Anywhere in a line: a pod's two processes share its stdout (stderr merged, as a container
        # runtime does), and a worker's line can land after another's unfinished warning (gloo's
        # C++ logging), as a busy machine's run once showed.
        for found in ALLREDUCE_LINE.finditer(text):
            fields = found.groupdict()
            assert fields["world"] == "4"
            assert fields["sum"] == fields["expected"] == "10", found.group(0)
            ranks[int(fields["rank"])] = fields["node_rank"]
    # Every process of both pods took part; ranks 0-1 on node 0 and 2-3 on node 1, as torchrun would.
    assert ranks == {0: "0", 1: "0", 2: "1", 3: "1"}, logs
    # The launcher read the hostfile gpufed mounted: both pods' stable names, with two slots each.
    hostfile = [line.removeprefix("hostfile: ") for t in logs.values() for line in t.splitlines()
                if line.startswith("hostfile: ")]  # fmt: skip
    assert len(hostfile) == 2, logs
    assert all(line.endswith(" slots=2") for line in hostfile)
    gang = pods[0].spec.subdomain
    assert [line.split()[0] for line in hostfile] == [f"{p.spec.hostname}.{gang}" for p in pods]


def test_another_tenants_pods_cannot_find_the_rendezvous(
    fed: ServerProcess, sims: SimProcess, jax_python: Path
) -> None:
    """A pod of another tenant on the same cluster, told this job's MASTER_ADDR, cannot resolve it:
    the names are per job and answer only within the job's namespace. Its own job gets its own
    Service and hostfile in its own namespace."""
    mine = fed.client("bob").submit(allreduce_job("allreduce", "H100", jax_python)).job_id
    wait_for(lambda: len(gang_pods(sims, "plain", mine)) == 2, timeout_s=60)
    (master,) = [p for p in gang_pods(sims, "plain", mine) if p.metadata.name.split("-")[-2] == "0"]
    target = f"{master.spec.hostname}.{master.spec.subdomain}"
    probe = f"""\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {{name: probe}}
spec:
  gpuTypes: [H100]
  tasks:
    - name: probe
      replicas: 1
      gpus: 1
      image: busybox
      command: [getent, hosts, {target}]
"""
    theirs = fed.client("alice").submit(probe).job_id
    wait_for(lambda: finished(fed, "alice", theirs) is not None, timeout_s=120)
    assert finished(fed, "alice", theirs) == "FAILED"  # getent exits 2: no such host
    (pod,) = gang_pods(sims, "plain", theirs)
    assert pod.metadata.namespace == "gpufed-vision"
    printed = kubectl(sims, "plain", "logs", "-n", "gpufed-vision", pod.metadata.name).splitlines()
    assert [line for line in printed if not line.startswith("[sim]")] == []  # getent found nothing
    services = kubectl(sims, "plain", "get", "services", "-n", "gpufed-vision", "-o", "name")
    assert master.spec.subdomain not in services
    wait_for(lambda: finished(fed, "bob", mine) is not None, timeout_s=240)
