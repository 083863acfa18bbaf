"""End to end: a job with pod templates runs on a member cluster as its templates say, and a tenant's
pod security level holds at submission and on the cluster.

The judges are the real kubectl (the pods' resources, volumes, tolerations and /dev/shm; the
namespace's Pod Security Admission labels) and the gRPC replies another tenant gets, never gpufed's
own view of the job.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, wait_for
from tests.e2e.kube import gang_pods, onprem_a100, serve_clusters, sim_kubectl, sim_kubectl_json

KUBECTL = shutil.which(
    "kubectl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
)
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed"),
]

CLUSTERS: list[dict[str, Any]] = [onprem_a100(nodes=2)]
# In the template only: a reply to another tenant that holds it has leaked the template.
MARKER = "marker-7f3a9c"

TEMPLATED = f"""\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata:
  name: llm
  annotations: {{sim.gpufed.io/duration: "300s"}}
spec:
  gpuTypes: [A100]
  tasks:
    - name: master
      replicas: 1
      gpus: 4
      shmSize: 16Gi
      template:
        metadata:
          labels: {{team: {MARKER}}}
        spec:
          containers:
            - name: trainer
              image: ghcr.io/example/train:1
              command: [torchrun]
              args: [--nproc-per-node=4, train.py, --run={MARKER}]
              workingDir: /workspace
              ports: [{{containerPort: 29500, name: c10d}}]
              resources:
                requests: {{cpu: 4, memory: 16Gi}}
                limits: {{memory: 32Gi}}
              volumeMounts: [{{name: scratch, mountPath: /scratch}}]
          volumes:
            - name: scratch
              emptyDir: {{sizeLimit: 50Gi}}
          tolerations:
            - {{key: dedicated, operator: Equal, value: training, effect: NoSchedule}}
          securityContext: {{runAsUser: 1000, fsGroup: 1000}}
    - name: worker
      replicas: 1
      image: ghcr.io/example/train:1
      command: [torchrun, train.py]
      gpus: 4
"""


def _with_volume(volume: str, container_extra: str = "") -> str:
    return f"""\
apiVersion: gpufed.io/v1
kind: TrainingJob
metadata: {{name: risky}}
spec:
  gpuTypes: [A100]
  tasks:
    - name: main
      replicas: 1
      gpus: 1
      template:
        spec:
          containers:
            - name: main
              image: busybox{container_extra}
          volumes: [{volume}]
"""


HOST_PATH = _with_volume("{name: host, hostPath: {path: /var/run}}")
PRIVILEGED = _with_volume(
    "{name: scratch, emptyDir: {}}", "\n              securityContext: {privileged: true}"
)


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with serve_clusters(
        etcd,
        tmp_path,
        sims,
        CLUSTERS,
        grace_s=8,
        tenants=[
            {"name": "platform"},
            {"name": "vision"},
            {"name": "nlp"},
            {"name": "ops", "podSecurity": "privileged"},
        ],
        users=[
            {"name": "admin", "tenant": "platform", "role": "admin"},
            {"name": "alice", "tenant": "vision"},
            {"name": "bob", "tenant": "nlp"},
            {"name": "olga", "tenant": "ops"},
        ],
    ) as process:
        yield process


def kubectl(sims: SimProcess, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return sim_kubectl(sims, "onprem", *args, stdin=stdin, check=False)


def kubectl_json(sims: SimProcess, *args: str) -> Any:
    return sim_kubectl_json(sims, "onprem", *args)


def privileged_pod(namespace: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "escape", "namespace": namespace},
            "spec": {
                "containers": [{"name": "main", "image": "busybox", "securityContext": {"privileged": True}}]
            },
        }
    )


def test_templated_job_runs_as_its_template_says(fed: ServerProcess, sims: SimProcess) -> None:
    job_id = fed.client("alice").submit(TEMPLATED).job_id
    wait_for(lambda: len(gang_pods(sims, "onprem", job_id)) == 2, timeout_s=60)

    pods = kubectl_json(sims, "get", "pods", "-n", "gpufed-vision", "-l", f"gpufed.io/job-id={job_id}")[
        "items"
    ]
    by_task = {p["metadata"]["labels"]["gpufed.io/task"]: p for p in pods}
    master = by_task["master"]["spec"]
    trainer = master["containers"][0]
    assert trainer["name"] == "trainer"
    assert trainer["image"] == "ghcr.io/example/train:1"
    assert trainer["command"] == ["torchrun"]
    assert trainer["args"] == ["--nproc-per-node=4", "train.py", f"--run={MARKER}"]
    assert trainer["workingDir"] == "/workspace"
    assert trainer["resources"]["requests"]["cpu"] == "4"
    assert trainer["resources"]["requests"]["memory"] == "16Gi"
    assert trainer["resources"]["limits"]["memory"] == "32Gi"
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert {"name": "gpufed-shm", "mountPath": "/dev/shm"} in [
        {k: m[k] for k in ("name", "mountPath")} for m in trainer["volumeMounts"]
    ]
    volumes = {v["name"]: v for v in master["volumes"]}
    assert volumes["gpufed-shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert volumes["scratch"]["emptyDir"] == {"sizeLimit": "50Gi"}
    assert {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"} in master[
        "tolerations"
    ]
    assert master["securityContext"] == {"runAsUser": 1000, "fsGroup": 1000}
    assert master["schedulerName"] == "volcano"
    assert by_task["master"]["metadata"]["labels"]["team"] == MARKER
    # The short-form task is the pod it always was: no template, no /dev/shm volume.
    worker = by_task["worker"]["spec"]
    assert [c["name"] for c in worker["containers"]] == ["worker"]
    assert "gpufed-shm" not in {v["name"] for v in worker.get("volumes") or []}

    namespace = kubectl_json(sims, "get", "namespace", "gpufed-vision")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    # The cluster enforces the label too: a privileged pod made there by hand, past gpufed, is refused.
    created = kubectl(sims, "apply", "-f", "-", stdin=privileged_pod("gpufed-vision"))
    assert created.returncode != 0
    assert 'violates PodSecurity "baseline:latest": privileged' in created.stderr

    # Another tenant learns nothing of the template: not by listing, getting, describing or summing.
    bob = fed.client("bob")
    seen = [str(bob.list_all()), str(bob.summarize())]
    for call in (bob.get, bob.describe, bob.explain):
        with pytest.raises(grpc.RpcError) as refused:
            call(job_id)
        assert refused.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED)
        seen.append(str(refused.value.details()))
    assert not [text for text in seen if MARKER in text]  # (the refusals echo only the id asked for)
    # Its owner sees the template back in the job's manifest.
    assert MARKER in fed.client("alice").get(job_id).manifest


@pytest.mark.parametrize(
    ("manifest", "field", "words"),
    [
        (HOST_PATH, "spec.tasks[0].template.spec.volumes[0].hostPath", "hostPath volumes"),
        (PRIVILEGED, "spec.tasks[0].template.spec.containers[0].securityContext.privileged", "privileged"),
    ],
    ids=["hostPath", "privileged"],
)
def test_baseline_tenant_is_refused_what_baseline_forbids(
    fed: ServerProcess, sims: SimProcess, manifest: str, field: str, words: str
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        fed.client("alice").submit(manifest)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(refused.value.details()).startswith(f"{field}: ")
    assert words in str(refused.value.details())
    assert "'baseline'" in str(refused.value.details())
    assert fed.client("alice").list_all() == []  # nothing stored

    # A tenant an admin set to privileged may, and its namespace is labelled so on the cluster.
    job_id = fed.client("olga").submit(manifest).job_id
    wait_for(lambda: len(gang_pods(sims, "onprem", job_id)) == 1, timeout_s=60)
    namespace = kubectl_json(sims, "get", "namespace", "gpufed-ops")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    created = kubectl(sims, "apply", "-f", "-", stdin=privileged_pod("gpufed-ops"))
    assert created.returncode == 0, created.stderr


def test_schema_errors_name_the_field(fed: ServerProcess) -> None:
    broken = TEMPLATED.replace("limits: {memory: 32Gi}", "limits: {memory: 32 GiB}")
    with pytest.raises(grpc.RpcError) as refused:
        fed.client("alice").submit(broken)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(refused.value.details()).startswith(
        "spec.tasks[0].template.spec.containers[0].resources.limits.memory: must be a Kubernetes quantity"
    )


def test_an_admins_level_change_relabels_the_tenants_namespace(fed: ServerProcess, sims: SimProcess) -> None:
    alice = fed.client("alice")
    first = alice.submit(TEMPLATED).job_id
    wait_for(lambda: len(gang_pods(sims, "onprem", first)) == 2, timeout_s=60)
    labels = kubectl_json(sims, "get", "namespace", "gpufed-vision")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"

    fed.client("admin").set_tenant('{"name": "vision", "podSecurity": "privileged"}')

    def submitted() -> str | None:
        # The server's tenant view follows etcd's watch: until it has the change, baseline refuses.
        try:
            return alice.submit(PRIVILEGED).job_id
        except grpc.RpcError as error:
            if "'baseline'" not in str(error.details()):
                raise
            return None

    second = wait_for(submitted, timeout_s=30)
    wait_for(lambda: len(gang_pods(sims, "onprem", second)) == 1, timeout_s=60)
    labels = kubectl_json(sims, "get", "namespace", "gpufed-vision")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert labels["pod-security.kubernetes.io/warn"] == "privileged"
