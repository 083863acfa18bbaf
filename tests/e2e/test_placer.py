"""End to end, the placer's decisions on simulated Kubernetes clusters, through the public API.

Three clusters: on-prem A100s at an internal rate, and two clouds with H100 and L4 at their list
prices (the L4 prices are close, the H100 ones are not). Tenants form a tree with quotas; the
urgent class needs an admin's approval. Each test submits through gRPC as a user would and checks
where gangs land, and what the clusters hold, with the official Kubernetes client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.e2e.kube import a100_pool, gang_pods, job_of, serve_clusters

pytestmark = pytest.mark.e2e

GRACE_S = 4
# Victims get this long to stop (the policy default; no job here sets its own).
EVICTION_GRACE_S = 2

CLUSTERS: list[dict[str, Any]] = [
    {
        "name": "onprem",
        "provider": "private",
        "region": "dc1",
        "objectStore": "onprem-s3",
        "pools": [a100_pool(nodes=2)],
    },
    {
        "name": "aws",
        "provider": "aws",
        "region": "us-east-1",
        "objectStore": "s3-us-east-1",
        "pools": [
            {
                "name": "h100",
                "gpuType": "H100",
                "kind": "on_demand",
                "usdPerGpuHour": 6.88,
                "gpusPerNode": 8,
                "nodes": 1,
            },
            {
                "name": "l4",
                "gpuType": "L4",
                "kind": "on_demand",
                "usdPerGpuHour": 0.8049,
                "gpusPerNode": 1,
                "nodes": 4,
            },
        ],
    },
    {
        "name": "gcp",
        "provider": "gcp",
        "region": "us-east4",
        "objectStore": "gcs-us-east4",
        "volcano": False,
        "pools": [
            {
                "name": "h100",
                "gpuType": "H100",
                "kind": "on_demand",
                "usdPerGpuHour": 5.0,
                "gpusPerNode": 8,
                "nodes": 1,
            },
            {
                "name": "l4",
                "gpuType": "L4",
                "kind": "on_demand",
                "usdPerGpuHour": 0.7045,
                "gpusPerNode": 1,
                "nodes": 4,
            },
        ],
    },
]

POLICY: dict[str, Any] = {
    "defaultGracePeriodSeconds": EVICTION_GRACE_S,
    # Go to the cloud as soon as private capacity does not fit: these tests are about where, not when.
    "privateWaitSecondsPerGpuHour": 0,
    "preemptionLimitGpus": 64,
    "preemptionIntervalSeconds": 600,
}

TENANTS: list[dict[str, Any]] = [
    {"name": "platform"},
    {"name": "research", "quotas": {"A100": {"cap": 32}}},
    # Seniors own the on-prem A100s; interns own none and borrow what is idle.
    {"name": "seniors", "parent": "research", "quotas": {"A100": {"guaranteed": 16}}},
    {"name": "interns", "parent": "research", "quotas": {"A100": {"guaranteed": 0, "borrowingLimit": 16}}},
]

USERS: list[dict[str, Any]] = [
    {"name": "admin", "tenant": "platform", "role": "admin"},
    {"name": "sara", "tenant": "seniors"},
    {"name": "ivan", "tenant": "interns", "maxPriorityClass": "normal"},
]


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with serve_clusters(
        etcd,
        tmp_path,
        sims,
        CLUSTERS,
        grace_s=GRACE_S,
        policy=POLICY,
        datasets=[{"name": "c4-en@2024-06", "store": "s3-us-east-1", "sizeGiB": 800}],
        egress=[{"from": "s3-us-east-1", "to": "gcs-us-east4", "usdPerGb": 0.09}],
        tenants=TENANTS,
        users=USERS,
    ) as process:
        yield process


def _running(fed: ServerProcess, user: str, job_id: str, timeout_s: float = 30) -> pb.Job:
    job: pb.Job = wait_for(
        lambda: (j := job_of(fed, user, job_id)).phase == pb.JOB_PHASE_RUNNING and j, timeout_s=timeout_s
    )
    return job


def test_an_h100_gang_bursts_to_the_cheapest_public_h100_cluster(
    fed: ServerProcess, sims: SimProcess
) -> None:
    with fed.client("sara") as sara:
        # Running past the test's end: seen running, however long the checks take on a busy machine.
        job_id = sara.submit(manifest("h100", gpu="H100", workers=1, gpus=4, duration="1h")).job_id
    job = _running(fed, "sara", job_id)
    # No private H100 exists; gcp lists them at 5.00 $/GPU-hour, aws at 6.88.
    assert job.cluster == "gcp"
    assert len(gang_pods(sims, "gcp", job_id)) == 2
    assert gang_pods(sims, "aws", job_id) == []


def test_a_job_runs_near_its_dataset_when_prices_are_close(fed: ServerProcess) -> None:
    spec = "  maxRuntime: 1h\n"
    # Both run past the test's end: each is seen running, however long the other's check took.
    with fed.client("sara") as sara:
        plain = sara.submit(
            manifest("plain", gpu="L4", workers=1, gpus=1, duration="1h", extra_spec=spec)
        ).job_id
        near = sara.submit(
            manifest(
                "near",
                gpu="L4",
                workers=1,
                gpus=1,
                duration="1h",
                extra_spec=spec + "  dataset: c4-en@2024-06\n",
            )
        ).job_id
    # Without data, gcp's L4 is the cheaper by 0.10 $/hour. With 800 GiB in s3-us-east-1, moving it
    # to gcs-us-east4 would cost about 77 $ and the time to copy it: aws, next to the data, wins.
    assert _running(fed, "sara", plain).cluster == "gcp"
    assert _running(fed, "sara", near).cluster == "aws"


def test_a_seniors_approved_urgent_job_preempts_an_interns_borrowed_gpus_and_the_intern_runs_later(
    fed: ServerProcess, sims: SimProcess
) -> None:
    # The intern's job borrows all 16 on-prem A100s (interns are guaranteed none). It must still run
    # when the approval comes, a few calls and a cycle or two later: at 5 s, a machine busy enough to
    # spread those over 5 s let it end by itself first, and nothing was left to preempt. It runs past
    # the test's end; the test waits for its second attempt to run, not to finish.
    with fed.client("ivan") as ivan:
        intern = ivan.submit(manifest("intern", workers=1, gpus=8, duration="1h")).job_id
    first = _running(fed, "ivan", intern)
    assert (first.cluster, first.attempt) == ("onprem", 1)

    # The senior's urgent job is accepted, but waits until an admin approves the class.
    with fed.client("sara") as sara:
        urgent = sara.submit(
            # Running for long enough that the test sees it running, even on a busy machine.
            manifest("paper", workers=1, gpus=8, duration="2s", extra_spec="  priorityClassName: urgent\n")
        ).job_id
        reasons = wait_for(lambda: list(sara.explain(urgent).reasons), timeout_s=15)
    assert any(r.code == "approval_required" for r in reasons), reasons
    assert job_of(fed, "ivan", intern).attempt == 1, "no one is preempted for an unapproved job"

    with fed.client("admin") as admin:
        granted = admin.grant_approval(
            tenant="seniors", priority_class="urgent", duration_s=3600, reason="NeurIPS camera-ready"
        )
        assert [a.approval_id for a in admin.list_approvals(tenant="seniors").approvals] == [
            granted.approval_id
        ]

    # Approved: the intern's gang is evicted (with its grace period), the urgent one runs on-prem.
    # Seen running or already ended: a 2 s gang that ends before the reconciler's first look goes
    # from DISPATCHED straight to SUCCEEDED, and a wait for RUNNING alone could miss it.
    paper = wait_for(
        lambda: (
            (j := job_of(fed, "sara", urgent)).phase in (pb.JOB_PHASE_RUNNING, pb.JOB_PHASE_SUCCEEDED) and j
        ),
        timeout_s=40,
    )
    assert paper.cluster == "onprem"
    bumped = job_of(fed, "ivan", intern)
    assert bumped.attempt == 2
    # The intern may not read the senior's job: his history says why without naming it; an admin
    # sees which job it was.
    seen_by_ivan = " ".join(e.reason for e in bumped.events)
    assert urgent not in seen_by_ivan
    assert "preempted for a job of another tenant" in seen_by_ivan
    seen_by_admin = " ".join(e.reason for e in job_of(fed, "admin", intern).events)
    assert "preempted for " + urgent in seen_by_admin
    assert all(
        p.status.phase != "Running"
        for p in gang_pods(sims, "onprem", intern)
        if p.metadata.labels["gpufed.io/attempt"] == "1"
    )

    # The urgent job ends; the intern's job runs again, whole, on the GPUs it gave up.
    wait_for(lambda: job_of(fed, "sara", urgent).phase == pb.JOB_PHASE_SUCCEEDED, timeout_s=60)
    again = wait_for(
        lambda: (j := job_of(fed, "ivan", intern)).phase == pb.JOB_PHASE_RUNNING and j.attempt == 2 and j,
        timeout_s=60,
    )
    assert again.cluster == "onprem"
    second = [p for p in gang_pods(sims, "onprem", intern) if p.metadata.labels["gpufed.io/attempt"] == "2"]
    assert sorted(p.metadata.name for p in second) == [f"{intern}-a2-master-0", f"{intern}-a2-worker-0"]
    assert all(p.status.phase == "Running" for p in second)


def test_admins_set_tenants_and_approvals_and_members_only_read_their_own(fed: ServerProcess) -> None:
    with fed.client("admin") as admin:
        admin.set_tenant(
            "name: interns\nparent: research\nquotas: {A100: {guaranteed: 4, borrowingLimit: 12}}\n"
        )
        doc = json.loads(admin.get_tenant("interns").document)
        assert doc["quotas"] == {"A100": {"guaranteed": 4, "borrowingLimit": 12}}
        with pytest.raises(grpc.RpcError) as bad:
            admin.set_tenant("name: orphans\nparent: nowhere\n")
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "nowhere" in str(bad.value.details())
        with pytest.raises(grpc.RpcError) as busy:
            admin.delete_tenant("research")
        assert busy.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        approval = admin.grant_approval(
            tenant="interns", priority_class="urgent", duration_s=60, reason="demo day"
        )
        admin.revoke_approval(approval.approval_id)
        assert list(admin.list_approvals(include_expired=True).approvals) == []

    with fed.client("ivan") as ivan:
        assert [t.name for t in ivan.list_tenants().tenants] == ["interns"]
        with pytest.raises(grpc.RpcError) as hidden:
            ivan.get_tenant("seniors")
        assert hidden.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as denied:
            ivan.set_tenant("name: interns\nquotas: {A100: {guaranteed: 16}}\n")
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # An intern is limited to "normal": "high" is refused at submission, naming the limit.
        with pytest.raises(grpc.RpcError) as above:
            ivan.submit(manifest("eager", extra_spec="  priorityClassName: high\n"))
        assert above.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'normal'" in str(above.value.details())
