"""Nodes, eviction, garbage collection, the default scheduler and the kubelet's admission.

From the Kubernetes documentation:
- "Safely Drain a Node": `kubectl drain` evicts every pod (bare pods with --force) through the
  Eviction API and returns once they are gone; an evicted pod is deleted after its grace period.
- "Garbage collection" / PodGC: pods bound to a node that no longer exists are deleted.
- "Jobs", suspending: a suspended Job's active pods are deleted, and it creates none until resumed;
  the Job gets a `Suspended` condition.
- "Pod scheduling": without a gang scheduler, the default scheduler places a Job's pods one by one:
  those that fit run, the rest stay Pending with `PodScheduled=False, reason=Unschedulable`.
- "Resource management" / kubelet admission: a pod bound with `spec.nodeName` to a node without room
  for its extended resource is rejected by the kubelet: phase Failed, reason `OutOf<resource>`.
"""

from __future__ import annotations

import json

from tests.contract.kube import facts
from tests.contract.kube.kubectl import Kubectl
from tests.contract.kube.manifests import dump, job, pod
from tests.contract.kube.waits import until


def _running_on(kubectl: Kubectl, ns: str, name: str) -> str:
    def check() -> str | None:
        found = facts.pod(kubectl, ns, name)
        if found and found["status"].get("phase") == "Running":
            return str(found["spec"]["nodeName"])
        return None

    return until(check, what=f"pod {name} to run", timeout_s=60)


def test_drain_evicts_everything_and_completes(fresh_kubectl: Kubectl, fresh_ns: str) -> None:
    kubectl, ns = fresh_kubectl, fresh_ns
    node = facts.gpu_nodes(kubectl, 8)[0]
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(pod("bare", gpus=4, node_name=node)))
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(pod("short", gpus=1, node_name=node, seconds=1)))
    _running_on(kubectl, ns, "bare")
    until(
        lambda: (facts.pod(kubectl, ns, "short") or {}).get("status", {}).get("phase") == "Succeeded",
        what="the short pod to complete",
    )
    out = kubectl(
        "drain",
        node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--force",
        "--timeout=90s",
        timeout_s=120,
    )
    assert "drained" in out
    # drain returns once the evicted pods are gone: none of them is left on the node.
    left = [p["metadata"]["name"] for p in facts.pods(kubectl, ns) if p["spec"].get("nodeName") == node]
    assert left == []
    assert json.loads(kubectl("get", "node", node, "-o", "json"))["spec"]["unschedulable"] is True
    kubectl("uncordon", node)


def test_pods_of_a_deleted_node_are_garbage_collected(fresh_kubectl: Kubectl, fresh_ns: str) -> None:
    kubectl, ns = fresh_kubectl, fresh_ns
    node = facts.gpu_nodes(kubectl, 8)[0]
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(pod("doomed", gpus=2, node_name=node)))
    _running_on(kubectl, ns, "doomed")
    kubectl("delete", "node", node)
    # PodGC deletes pods bound to a node that no longer exists (after a short quarantine).
    until(
        lambda: facts.pod(kubectl, ns, "doomed") is None, what="the orphaned pod to be deleted", timeout_s=120
    )


def test_suspended_job_creates_no_pods_and_suspending_deletes_them(kubectl: Kubectl, ns: str) -> None:
    facts.gpu_nodes(kubectl, 1)
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(job("held", parallelism=2, gpus=1, suspend=True)))
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(job("live", parallelism=2, gpus=1)))
    until(lambda: len(facts.pods(kubectl, ns, "job-name=live")) == 2, what="the live Job's pods")
    assert facts.pods(kubectl, ns, "job-name=held") == []
    kubectl("patch", "job", "live", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    until(
        lambda: (
            [
                p
                for p in facts.pods(kubectl, ns, "job-name=live")
                if not p["metadata"].get("deletionTimestamp")
            ]
            == []
        ),
        what="the suspended Job's pods to go",
    )

    def suspended() -> bool:
        conditions = json.loads(kubectl("get", "job", "live", "-n", ns, "-o", "json"))["status"].get(
            "conditions"
        )
        return any(c["type"] == "Suspended" and c["status"] == "True" for c in conditions or [])

    until(suspended, what="the Suspended condition")
    kubectl("patch", "job", "held", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    until(lambda: len(facts.pods(kubectl, ns, "job-name=held")) == 2, what="the resumed Job's pods")


def test_a_job_without_a_gang_scheduler_starts_the_pods_that_fit(
    fresh_kubectl: Kubectl, fresh_ns: str
) -> None:
    kubectl, ns = fresh_kubectl, fresh_ns
    big = facts.gpu_nodes(kubectl, 8)
    # One more 8-GPU pod than there are 8-GPU nodes: all but one run, one waits.
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(job("greedy", parallelism=len(big) + 1, gpus=8)))

    def split() -> tuple[int, int] | None:
        phases = [p["status"].get("phase") for p in facts.pods(kubectl, ns, "job-name=greedy")]
        running, pending = phases.count("Running"), phases.count("Pending")
        return (running, pending) if running == len(big) and pending == 1 else None

    until(split, what="all pods but one to run", timeout_s=60)
    waiting = next(
        p for p in facts.pods(kubectl, ns, "job-name=greedy") if p["status"].get("phase") == "Pending"
    )
    scheduled = [c for c in waiting["status"].get("conditions", []) if c["type"] == "PodScheduled"]
    assert scheduled
    assert scheduled[0]["status"] == "False"
    assert scheduled[0]["reason"] == "Unschedulable"


def test_kubelet_rejects_a_pinned_pod_beyond_free_gpus(fresh_kubectl: Kubectl, fresh_ns: str) -> None:
    kubectl, ns = fresh_kubectl, fresh_ns
    node = facts.gpu_nodes(kubectl, 8)[0]
    allocatable = int(
        json.loads(kubectl("get", "node", node, "-o", "json"))["status"]["allocatable"]["nvidia.com/gpu"]
    )
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(pod("holder", gpus=allocatable, node_name=node)))
    _running_on(kubectl, ns, "holder")
    kubectl("apply", "-n", ns, "-f", "-", stdin=dump(pod("intruder", gpus=6, node_name=node)))

    def rejected() -> dict[str, object] | None:
        found = facts.pod(kubectl, ns, "intruder")
        return found["status"] if found and found["status"].get("phase") == "Failed" else None

    status = until(rejected, what="the kubelet to reject the pod", timeout_s=60)
    assert status.get("reason") == "OutOfnvidia.com/gpu"
    # The node never shows more GPUs in use than it has.
    in_use = sum(
        int(p["spec"]["containers"][0]["resources"].get("requests", {}).get("nvidia.com/gpu", "0"))
        for p in facts.pods(kubectl, ns)
        if p["spec"].get("nodeName") == node and p["status"].get("phase") in ("Running", "Pending")
    )
    assert in_use <= allocatable
