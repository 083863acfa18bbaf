"""`clusters.kubernetes.manifests` with pod templates: the template's pod, with what gpufed owns over it.

A job is parsed from YAML and made into the gang the dispatcher sends (`workload_for`), so these
cases follow a template from the manifest to the Volcano Job and the Indexed Job a cluster gets.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from clusters.kubernetes import manifests
from clusters.kubernetes.manifests import NodeSelection
from federation.scheduling.workload import workload_for
from federation.spec.priorities import DEFAULT_PRIORITY_CLASSES
from federation.spec.training_job import parse_manifest
from federation.store.jobs import JobPlacement, JobRecord
from placement.model import CapacityKind, ClusterName, GpuType, JobId, JobPhase, TenantId

TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "nlp"}},
    "spec": {
        "containers": [
            {
                "name": "trainer",
                "image": "ghcr.io/example/train:1",
                "args": ["train.py"],
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
                "resources": {"requests": {"cpu": "8", "memory": "64Gi"}},
            },
            {"name": "sidecar", "image": "busybox"},
        ],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "nodeSelector": {"topology.kubernetes.io/zone": "dc1-a"},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]},
                        {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r2"]}]},
                    ]
                }
            }
        },
    },
}


def a_job(tasks: list[dict[str, Any]]) -> JobRecord:
    doc = {
        "apiVersion": "gpufed.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "llm"},
        "spec": {"gpuTypes": ["H100"], "tasks": tasks},
    }
    spec = parse_manifest(yaml.safe_dump(doc), priority_classes=DEFAULT_PRIORITY_CLASSES.keys())
    return JobRecord(
        job_id=JobId("llm-1"),
        tenant=TenantId("nlp"),
        user="ana",
        spec=spec,
        phase=JobPhase.DISPATCHED,
        submitted_at_s=0.0,
        queued_at_s=0.0,
        priority=0,
        placement=JobPlacement(
            cluster=ClusterName("c1"),
            gpu_type=GpuType("H100"),
            kind=CapacityKind.ON_DEMAND,
            usd_per_gpu_hour=1.0,
        ),
    )


SELECTION = NodeSelection(
    node_selector=(("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),),
    expressions=(("gpufed.io/capacity-type", "NotIn", ("spot",)),),
)


def test_volcano_job_carries_the_template_under_gpufeds_fields() -> None:
    job = a_job(
        [
            {"name": "master", "replicas": 1, "gpus": 8, "shmSize": "16Gi", "template": TEMPLATE},
            {"name": "worker", "replicas": 2, "image": "busybox", "gpus": 8, "env": {"EPOCHS": "3"}},
        ]
    )
    body = manifests.volcano_job(workload_for(job), "llm-1-a1", "gpufed-nlp", SELECTION, master_port=29500)
    master, worker = body["spec"]["tasks"]
    pod = master["template"]["spec"]
    main, sidecar = pod["containers"]
    assert main["name"] == "trainer"
    assert main["image"] == "ghcr.io/example/train:1"
    assert main["args"] == ["train.py"]
    assert main["resources"]["requests"] == {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"}
    assert main["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    names = [e["name"] for e in main["env"]]
    assert names[0] == "HF_TOKEN"  # the template's own env first, then gpufed's rendezvous
    assert "MASTER_ADDR" in names
    assert "nvidia.com/gpu" not in json.dumps(sidecar)  # only the main container holds the GPUs
    assert {"name": "gpufed-shm", "mountPath": "/dev/shm"} in main["volumeMounts"]
    assert {"name": "gpufed-shm", "mountPath": "/dev/shm"} in sidecar["volumeMounts"]
    assert {"name": "gpufed-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
    assert pod["nodeSelector"] == {
        "topology.kubernetes.io/zone": "dc1-a",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    }
    assert pod["tolerations"][0] == {"key": "dedicated", "operator": "Exists"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in pod["tolerations"]
    # gpufed's expression joins each of the user's terms (terms are ORed, expressions ANDed).
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert [[e["key"] for e in t["matchExpressions"]] for t in terms] == [
        ["rack", "gpufed.io/capacity-type"],
        ["rack", "gpufed.io/capacity-type"],
    ]
    assert pod["schedulerName"] == "volcano"
    assert pod["restartPolicy"] == "Never"
    labels = master["template"]["metadata"]["labels"]
    assert labels["team"] == "nlp"
    assert labels["gpufed.io/job-id"] == "llm-1"
    # The short-form task is rendered as before: one container named after the task, no volumes.
    short = worker["template"]["spec"]
    assert [c["name"] for c in short["containers"]] == ["worker"]
    assert short["containers"][0]["env"][0] == {"name": "EPOCHS", "value": "3"}
    assert "volumes" not in short
    assert short["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_rendering_leaves_the_stored_template_alone() -> None:
    """Each pod is built from a fresh copy: the gang's spec is the same before and after."""
    job = a_job([{"name": "worker", "replicas": 2, "gpus": 8, "template": TEMPLATE}])
    gang = workload_for(job)
    before = gang.replicas[0].pod_template
    manifests.volcano_job(gang, "llm-1-a1", "gpufed-nlp", SELECTION, master_port=29500)
    manifests.indexed_job(gang, "llm-1-a1", "gpufed-nlp", SELECTION, master_port=29500)
    assert gang.replicas[0].pod_template == before


def test_indexed_job_carries_the_template_and_its_own_subdomain() -> None:
    job = a_job([{"name": "worker", "replicas": 2, "gpus": 4, "template": TEMPLATE}])
    gang = workload_for(job)
    assert manifests.uniform_replica(gang) is not None
    body = manifests.indexed_job(gang, "llm-1-a1", "gpufed-nlp", SELECTION, master_port=29500)
    pod = body["spec"]["template"]["spec"]
    assert pod["containers"][0]["name"] == "trainer"
    assert pod["subdomain"] == "llm-1-a1"
    assert "schedulerName" not in pod
    assert {v["name"] for v in pod["volumes"]} == {"scratch", "gpufed-hostfile"}


def test_replicas_of_different_templates_are_not_uniform() -> None:
    other = json.loads(json.dumps(TEMPLATE))
    other["spec"]["containers"][0]["args"] = ["eval.py"]
    job = a_job(
        [
            {"name": "a", "replicas": 1, "gpus": 4, "template": TEMPLATE},
            {"name": "b", "replicas": 1, "gpus": 4, "template": other},
        ]
    )
    assert manifests.uniform_replica(workload_for(job)) is None


def test_namespace_is_labelled_with_the_jobs_pod_security_level() -> None:
    body = manifests.namespace_manifest("gpufed-", TenantId("nlp"), "restricted")
    labels = body["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"
    assert labels["gpufed.io/tenant"] == "nlp"
