"""End to end, the usage ledger against what the clusters ran: the report's GPU-hours per tenant
equal the integral of GPUs held over time, measured independently from the clusters' own pods.

A mix of jobs runs on simulated Kubernetes clusters through the public API: one finishes, one is
preempted by an approved urgent job and runs again, one fails, one is cancelled before it starts;
the server is killed and restarted in the middle. A watch on every cluster's pods, opened before
anything runs, records when each pod started and when it stopped holding its GPUs.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.e2e.kube import PodRecorder, job_of, onprem_a100, serve_clusters

pytestmark = pytest.mark.e2e

CLUSTERS: list[dict[str, Any]] = [
    onprem_a100(nodes=2),
    {
        "name": "gcp",
        "provider": "gcp",
        "region": "us-east4",
        "volcano": False,
        "pools": [
            {
                "name": "l4",
                "gpuType": "L4",
                "kind": "on_demand",
                "usdPerGpuHour": 0.7045,
                "gpusPerNode": 1,
                "nodes": 4,
            }
        ],
    },
]
TENANTS: list[dict[str, Any]] = [
    {"name": "platform"},
    {"name": "research", "quotas": {"A100": {"cap": 32}}},
    {"name": "seniors", "parent": "research", "quotas": {"A100": {"guaranteed": 16}}},
    {"name": "interns", "parent": "research", "quotas": {"A100": {"guaranteed": 0, "borrowingLimit": 16}}},
]
USERS: list[dict[str, Any]] = [
    {"name": "admin", "tenant": "platform", "role": "admin"},
    {"name": "fin", "tenant": "platform", "role": "finance"},
    {"name": "sara", "tenant": "seniors"},
    {"name": "ivan", "tenant": "interns", "maxPriorityClass": "normal"},
]
POLICY = {
    "defaultGracePeriodSeconds": 1,
    "privateWaitSecondsPerGpuHour": 0,
    "preemptionLimitGpus": 64,
    "preemptionIntervalSeconds": 600,
}


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with serve_clusters(
        etcd, tmp_path, sims, CLUSTERS, grace_s=4, policy=POLICY, tenants=TENANTS, users=USERS
    ) as process:
        yield process


def _phase(fed: ServerProcess, user: str, job_id: str, phase: int, timeout_s: float = 60) -> pb.Job:
    job: pb.Job = wait_for(lambda: (j := job_of(fed, user, job_id)).phase == phase and j, timeout_s=timeout_s)
    return job


def _failing(name: str) -> str:
    text = manifest(name, gpu="L4", workers=1, gpus=1, duration="2s")
    return text.replace(
        '    sim.gpufed.io/duration: "2s"\n',
        '    sim.gpufed.io/duration: "2s"\n    sim.gpufed.io/exit-code: "3"\n',
    )


def _ledger_by_tenant(fed: ServerProcess, start_s: float, end_s: float) -> dict[str, float]:
    with fed.client("fin") as fin:
        intervals = fin.ledger(start_s=start_s, end_s=end_s).intervals
    out: dict[str, float] = defaultdict(float)
    for iv in intervals:
        assert iv.end_s > 0, f"interval still open at the end: {iv}"
        out[iv.tenant] += iv.gpu_hours
    return dict(out)


def _tenants(report_json: str) -> dict[str, float]:
    return {row["tenant"]: row["gpu_hours"] for row in json.loads(report_json)["rows"]}


def _report_by_tenant(fed: ServerProcess, start_s: float, end_s: float) -> dict[str, float]:
    """GPU-hours per tenant as finance's report gives them."""
    with fed.client("fin") as fin:
        return _tenants(fin.report(start_s=start_s, end_s=end_s, group_by=["tenant"], fmt="json").content)


def test_the_ledger_matches_the_clusters_gpu_time_to_the_second_across_a_restart(
    fed: ServerProcess, sims: SimProcess
) -> None:
    recorder = PodRecorder()
    for cluster in ("onprem", "gcp"):
        recorder.follow(sims, cluster)
    started_s = time.time() - 60
    try:
        # Granted first: the intern's 5 s job must still run when the urgent one is submitted, and
        # each call between the two is time a busy machine could let it end by itself in.
        with fed.client("admin") as admin:
            admin.grant_approval(
                tenant="seniors", priority_class="urgent", duration_s=3600, reason="deadline"
            )
        with fed.client("ivan") as ivan:
            intern = ivan.submit(manifest("intern", workers=1, gpus=8, duration="5s")).job_id
            # No B200 exists anywhere: it waits, and is cancelled before it ever starts.
            never = ivan.submit(manifest("never", gpu="B200", workers=1, gpus=1, duration="1s")).job_id
        _phase(fed, "ivan", intern, pb.JOB_PHASE_RUNNING)
        with fed.client("sara") as sara:
            paper = sara.submit(
                manifest(
                    "paper", workers=1, gpus=8, duration="3s", extra_spec="  priorityClassName: urgent\n"
                )
            ).job_id
            broken = sara.submit(_failing("broken")).job_id
        # Running, or already ended: a 3 s gang that ends before the reconciler's first look goes from
        # DISPATCHED straight to SUCCEEDED.
        wait_for(
            lambda: job_of(fed, "sara", paper).phase in (pb.JOB_PHASE_RUNNING, pb.JOB_PHASE_SUCCEEDED),
            timeout_s=60,
        )
        with fed.client("ivan") as ivan:
            ivan.cancel(never)
        _phase(fed, "sara", broken, pb.JOB_PHASE_FAILED)

        # A crash in the middle: the ledger is in etcd, written with each transition.
        fed.kill()
        fed.start()

        _phase(fed, "sara", paper, pb.JOB_PHASE_SUCCEEDED)
        done = _phase(fed, "ivan", intern, pb.JOB_PHASE_SUCCEEDED, timeout_s=90)
        assert done.attempt == 2, "the intern's job was preempted once and ran again"
        assert job_of(fed, "ivan", never).phase == pb.JOB_PHASE_CANCELLED
        # Let the last pods' terminations reach the recorder.
        wait_for(lambda: all(p.end_s is not None for p in recorder.pods.values() if p.start_s), timeout_s=15)
    finally:
        recorder.stop()
    end_s = time.time() + 1

    with fed.client("fin") as fin:
        intervals = list(fin.ledger(start_s=started_s, end_s=end_s).intervals)
    ended = sorted((iv.job_id, iv.attempt, iv.ended) for iv in intervals)
    assert ended == sorted(
        [(intern, 1, "preempted"), (intern, 2, "finished"), (paper, 1, "finished"), (broken, 1, "failed")]
    )
    assert never not in {iv.job_id for iv in intervals}, "a job cancelled before it started costs nothing"

    assert recorder.errors == [], "the pod watch must see every change"
    ledger = _report_by_tenant(fed, started_s, end_s)
    assert ledger == pytest.approx(_ledger_by_tenant(fed, started_s, end_s), rel=1e-9)
    cluster_side = recorder.gpu_hours_by_tenant()
    assert set(ledger) == set(cluster_side) == {"interns", "seniors"}
    for tenant, hours in cluster_side.items():
        # To the second: every interval's ends agree with the pods' within a second of its GPUs.
        gpu_count = sum(iv.gpu_count for iv in intervals if iv.tenant == tenant)
        assert abs(ledger[tenant] - hours) * 3600 <= gpu_count * 1.0, (tenant, ledger[tenant], hours)

    # Another restart changes no figure.
    before = _report_by_tenant(fed, started_s, end_s)
    fed.stop()
    fed.start()
    assert _report_by_tenant(fed, started_s, end_s) == before
    with fed.client("sara") as sara:
        assert set(_tenants(sara.report(start_s=started_s, end_s=end_s, fmt="json").content)) == {"seniors"}


def test_reports_are_for_finance_and_each_tenants_own_members_only(fed: ServerProcess) -> None:
    with fed.client("fin") as fin:
        html = fin.report(fmt="html")
        assert html.content_type == "text/html"
        assert 'id="cost-by-tenant"' in html.content
        assert fin.export_focus().content.startswith("ChargePeriodStart,")
    with fed.client("fin") as fin:
        assert fin.ledger().intervals is not None
    with fed.client("sara") as sara:
        sara.ledger()
        sara.ledger(tenant="seniors")
        with pytest.raises(grpc.RpcError) as other:
            sara.ledger(tenant="interns")
        assert other.value.code() == grpc.StatusCode.NOT_FOUND
    with fed.client("admin") as admin, pytest.raises(grpc.RpcError) as refused:
        admin.ledger()
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
