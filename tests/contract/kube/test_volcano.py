"""Volcano Jobs' lifecycle policies (Volcano docs, "VolcanoJob": policies, events and actions).

A pod of a running Volcano Job that is deleted or evicted raises the `PodEvicted` event; the job's
policy for it decides: `RestartJob` restarts every pod (the job goes through `Restarting`, its
`status.version` and `retryCount` grow, and new pods are made), `AbortJob` kills them and leaves the
job `Aborted`, `TerminateJob` leaves it `Terminated`. Pods are named `<job>-<task>-<index>`.
Skipped where the cluster has no Volcano.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.contract.kube import facts
from tests.contract.kube.kubectl import Kubectl
from tests.contract.kube.manifests import sim_duration
from tests.contract.kube.waits import until


def vcjob(name: str, action: str, *, gpus: int = 1) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "busybox:1.36",
        "command": ["sh", "-c", "sleep 600"],
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus)}},
    }
    template = {
        "metadata": {"annotations": sim_duration(600)},
        "spec": {"restartPolicy": "Never", "containers": [container]},
    }
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "volcano",
            "minAvailable": 2,
            "maxRetry": 3,
            "policies": [{"event": "PodEvicted", "action": action}],
            "tasks": [{"name": "worker", "replicas": 2, "template": template}],
        },
    }


@pytest.fixture
def volcano(kubectl: Kubectl) -> None:
    if not facts.has_resource(kubectl, "jobs.batch.volcano.sh"):
        pytest.skip("the cluster has no Volcano")
    facts.gpu_nodes(kubectl, 1)


def _job(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(kubectl("get", "jobs.batch.volcano.sh", name, "-n", ns, "-o", "json"))
    return found


def _running(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any]:
    return until(
        lambda: (j := _job(kubectl, ns, name))["status"].get("state", {}).get("phase") == "Running" and j,
        what=f"vcjob {name} to run",
    )


@pytest.mark.usefixtures("volcano")
def test_deleting_a_pod_restarts_the_job(kubectl: Kubectl, ns: str) -> None:
    kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(vcjob("restarts", "RestartJob")))
    before = _running(kubectl, ns, "restarts")
    old_uids = {p["metadata"]["uid"] for p in facts.pods(kubectl, ns)}
    kubectl("delete", "pod", "restarts-worker-0", "-n", ns, "--wait=false")

    def restarted() -> dict[str, Any] | None:
        job = _job(kubectl, ns, "restarts")
        status: dict[str, Any] = job["status"]
        pods = facts.pods(kubectl, ns)
        fresh = {p["metadata"]["uid"] for p in pods} - old_uids
        if status.get("state", {}).get("phase") == "Running" and len(fresh) == 2 and len(pods) == 2:
            return status
        return None

    status = until(restarted, what="the job to restart every pod", timeout_s=90)
    assert status.get("version", 0) > before["status"].get("version", 0)
    assert status.get("retryCount", 0) >= 1


@pytest.mark.usefixtures("volcano")
def test_deleting_a_pod_aborts_the_job(kubectl: Kubectl, ns: str) -> None:
    kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(vcjob("aborts", "AbortJob")))
    _running(kubectl, ns, "aborts")
    kubectl("delete", "pod", "aborts-worker-1", "-n", ns, "--wait=false")
    until(
        lambda: _job(kubectl, ns, "aborts")["status"].get("state", {}).get("phase") == "Aborted",
        what="the job to be Aborted",
        timeout_s=90,
    )
    until(
        lambda: not [p for p in facts.pods(kubectl, ns) if p["status"].get("phase") == "Running"],
        what="no pod of the aborted job to run",
    )
