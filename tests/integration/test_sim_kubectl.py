"""kubectl's read verbs against a simulated cluster, with the real kubectl binary.

kubectl asks for server-side Tables, resolves short names through discovery and streams `-w`
watches; these tests prove all three work as on a real cluster. They skip only without kubectl.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from clusters.sim import SimPoolConfig, ThreadedSim, cluster
from tests.waits import collect_lines

KUBECTL = shutil.which(
    "kubectl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
)
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[tuple[ThreadedSim, Path]]:
    # No token: client-go (kubectl) does not send bearer tokens over plain http.
    config = cluster("kc", [SimPoolConfig.of("a100", "A100", node_count=2)], default_duration_s=60)
    with ThreadedSim(config) as running:
        yield running, running.kubeconfig(tmp_path / "kubeconfig")


def kubectl(kubeconfig: Path, *args: str) -> str:
    assert KUBECTL is not None
    result = subprocess.run(
        [
            KUBECTL,
            "--kubeconfig",
            str(kubeconfig),
            "--cache-dir",
            str(kubeconfig.parent / "cache"),
            "--request-timeout=10s",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def wait_for_line(lines: list[str], needle: str, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        found = next((line for line in lines if needle in line), None)
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"no line with {needle!r} after {timeout_s} s: {lines}")
        time.sleep(0.02)


def rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.strip().splitlines()]


def api_for(sim: ThreadedSim) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = sim.url
    return client.ApiClient(configuration)


def a_volcano_job(name: str, replicas: int) -> dict[str, object]:
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "minAvailable": replicas,
            "schedulerName": "volcano",
            "queue": "vision",
            "plugins": {"svc": [], "env": []},
            "tasks": [
                {
                    "name": "worker",
                    "replicas": replicas,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "train:1",
                                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                                }
                            ],
                        }
                    },
                }
            ],
        },
    }


def test_get_nodes(sim: tuple[ThreadedSim, Path]) -> None:
    _, kubeconfig = sim
    table = rows(kubectl(kubeconfig, "get", "nodes"))
    assert table[0] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert [r[:3] for r in table[1:]] == [["kc-a100-0", "Ready", "<none>"], ["kc-a100-1", "Ready", "<none>"]]
    assert (
        kubectl(kubeconfig, "get", "no", "kc-a100-0", "-o", "jsonpath={.status.allocatable.nvidia\\.com/gpu}")
        == "8"
    )


def test_get_pods_all_namespaces_and_short_names(sim: tuple[ThreadedSim, Path]) -> None:
    running, kubeconfig = sim
    custom = client.CustomObjectsApi(api_for(running))
    custom.create_namespaced_custom_object(
        "batch.volcano.sh", "v1alpha1", "default", "jobs", a_volcano_job("vj1", 2)
    )
    deadline = time.monotonic() + 10
    while "Running" not in kubectl(kubeconfig, "get", "vcjob", "-A") and time.monotonic() < deadline:
        time.sleep(0.05)
    pods = rows(kubectl(kubeconfig, "get", "pods", "-A"))
    assert pods[0] == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert sorted(r[:4] for r in pods[1:]) == [
        ["default", "vj1-worker-0", "1/1", "Running"],
        ["default", "vj1-worker-1", "1/1", "Running"],
    ]
    vcjobs = rows(kubectl(kubeconfig, "get", "vcjob", "-A"))
    assert vcjobs[0] == ["NAMESPACE", "NAME", "STATUS", "MINAVAILABLE", "RUNNINGS", "AGE"]
    assert vcjobs[1][:5] == ["default", "vj1", "Running", "2", "2"]
    assert rows(kubectl(kubeconfig, "get", "vj"))[1][:2] == ["vj1", "Running"]
    assert rows(kubectl(kubeconfig, "get", "pg"))[1][:4] == ["vj1", "Running", "2", "2"]
    assert rows(kubectl(kubeconfig, "get", "svc", "vj1"))[1][:3] == ["vj1", "ClusterIP", "None"]
    events = kubectl(kubeconfig, "get", "events")
    assert "Scheduled" in events
    assert "Started" in events
    wide = rows(kubectl(kubeconfig, "get", "pods", "-o", "wide"))
    assert wide[0][:7] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"]


def test_get_jobs_shows_completions(sim: tuple[ThreadedSim, Path]) -> None:
    running, kubeconfig = sim
    job = {
        "metadata": {"name": "train"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "template": {
                "metadata": {"annotations": {"sim.gpufed.io/duration": "0.1"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "train:1"}]},
            },
        },
    }
    client.BatchV1Api(api_for(running)).create_namespaced_job("default", job)
    deadline = time.monotonic() + 10
    while "Complete" not in kubectl(kubeconfig, "get", "jobs") and time.monotonic() < deadline:
        time.sleep(0.05)
    table = rows(kubectl(kubeconfig, "get", "jobs"))
    assert table[0] == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]
    assert table[1][:3] == ["train", "Complete", "2/2"]


def test_get_pods_watch_streams_changes(sim: tuple[ThreadedSim, Path]) -> None:
    running, kubeconfig = sim
    assert KUBECTL is not None
    watcher = subprocess.Popen(
        [
            KUBECTL,
            "--kubeconfig",
            str(kubeconfig),
            "--cache-dir",
            str(kubeconfig.parent / "cache"),
            "get",
            "pods",
            "-A",
            "-w",
            "--request-timeout=20s",
            # -v=6 logs each request once its response headers arrive, the watch's among them.
            "-v=6",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # kubectl lists, then watches from the list's resourceVersion: once the watch request is
        # answered, every change from here on reaches it.
        assert watcher.stderr is not None
        wait_for_line(collect_lines(watcher.stderr), "watch=true")
        core = client.CoreV1Api(api_for(running))
        core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": "watched", "annotations": {"sim.gpufed.io/duration": "0.2"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "train:1"}]},
            },
        )
        assert watcher.stdout is not None
        statuses: list[str] = []
        deadline = time.monotonic() + 15
        while "Completed" not in statuses and time.monotonic() < deadline:
            line = watcher.stdout.readline()
            if not line:
                break
            fields = line.split()
            if len(fields) >= 4 and fields[1] == "watched":
                statuses.append(fields[3])
    finally:
        watcher.kill()
        watcher.wait()
    assert statuses[0] == "Pending"
    assert "Running" in statuses
    assert statuses[-1] == "Completed"


def test_token_protected_cluster_refuses_kubectl_with_401(tmp_path: Path) -> None:
    config = cluster("secure", [SimPoolConfig.of("a100", "A100")], token="t0ken")
    with ThreadedSim(config) as running:
        kubeconfig = running.kubeconfig(tmp_path / "kubeconfig")
        assert KUBECTL is not None
        result = subprocess.run(
            [KUBECTL, "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "c2"), "get", "nodes"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert result.returncode != 0
    assert "provide credentials" in result.stderr
