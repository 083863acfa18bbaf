"""End to end, a cloud gang that says it resumes from a checkpoint is moved back to private GPUs.

One private cluster of 8 A100s at an internal rate and one cloud cluster of A100s at list price.
A blocker job holds the private GPUs while two day-long gangs burst to the cloud: `stuck`, which says
nothing about checkpoints, and `resumable`, which states `resumable: true`. When the blocker ends (its
owner cancels it once both gangs run in the cloud), the private GPUs are idle with nothing queued, and
the placer's estimate of what the rest of a day-long cloud run costs is hundreds of dollars over the
same work at the internal rate. gpufed
must stop `resumable` (with the grace period to write its checkpoint), requeue it without charging
a retry, and start it on the private cluster; `stuck` stays where it is, although its longer limit
would save more, because nothing says it can resume.

The clusters are judged by the official Kubernetes client, as an operator would look at them: no
pod of the moved gang's first attempt is left in the cloud, and its second attempt runs on the
private cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.e2e.kube import a100_pool, gang_pods, job_of, serve_clusters

pytestmark = pytest.mark.e2e

CLUSTERS: list[dict[str, Any]] = [
    {
        "name": "dc",
        "provider": "private",
        "region": "dc1",
        "objectStore": "dc-s3",
        "pools": [a100_pool(nodes=1)],
    },
    {
        "name": "aws",
        "provider": "aws",
        "region": "us-east-1",
        "objectStore": "s3-us-east-1",
        "pools": [
            {
                "name": "a100",
                "gpuType": "A100",
                "kind": "on_demand",
                "usdPerGpuHour": 4.1,
                "gpusPerNode": 8,
                "nodes": 2,
            }
        ],
    },
]

TENANTS: list[dict[str, Any]] = [
    {"name": "platform"},
    {"name": "vision", "quotas": {"A100": {"guaranteed": 8, "borrowingLimit": 24}}},
]

USERS: list[dict[str, Any]] = [
    {"name": "admin", "tenant": "platform", "role": "admin"},
    {"name": "vic", "tenant": "vision"},
]

DAY_LONG = "  maxRuntime: 1d\n"


def _logged(fed: ServerProcess, event: str) -> list[dict[str, Any]]:
    """The server's log lines of one event (it logs one JSON object a line)."""
    return [json.loads(line) for line in fed.log_text().splitlines() if f'"{event}"' in line]


def _attempts(pods: list[Any]) -> set[str]:
    return {p.metadata.labels["gpufed.io/attempt"] for p in pods}


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with serve_clusters(
        etcd,
        tmp_path,
        sims,
        CLUSTERS,
        grace_s=4,
        policy={
            "defaultGracePeriodSeconds": 2,
            # Burst at once when private GPUs are full: the move is what brings the gang back.
            "privateWaitSecondsPerGpuHour": 0,
            "repatriate": True,
            "repatriateMinSavingUsd": 100,
            "moveOverheadSeconds": 900,
        },
        tenants=TENANTS,
        users=USERS,
    ) as process:
        yield process


def test_a_resumable_cloud_gang_moves_to_idle_private_gpus_and_one_that_is_not_stays(
    fed: ServerProcess, sims: SimProcess
) -> None:
    with fed.client("vic") as vic:
        # Runs until cancelled below. It must hold the private GPUs until both gangs are seen running in
        # the cloud (else one lands on them, or moves before the test sees it in the cloud), and a run of
        # fixed length (it was 20 s) is either a race on a busy machine or a wait on a quiet one.
        blocker = vic.submit(manifest("blocker", gpus=4, duration="1h")).job_id
        wait_for(lambda: job_of(fed, "vic", blocker).phase == pb.JOB_PHASE_RUNNING, timeout_s=60)
        # Two days' limit: by the placer's estimate the dearer one to leave in the cloud.
        stuck = vic.submit(manifest("stuck", gpus=4, duration="1h", extra_spec="  maxRuntime: 2d\n")).job_id
        resumable = vic.submit(
            manifest("resumable", gpus=4, duration="1h", extra_spec=DAY_LONG + "  resumable: true\n")
        ).job_id
    for job_id in (stuck, resumable):
        running = wait_for(
            lambda j=job_id: (job := job_of(fed, "vic", j)).phase == pb.JOB_PHASE_RUNNING and job,
            timeout_s=60,
        )
        assert running.cluster == "aws", running

    # The blocker ends; the private node is idle and nothing is queued.
    with fed.client("vic") as vic:
        vic.cancel(blocker)
    wait_for(lambda: job_of(fed, "vic", blocker).phase == pb.JOB_PHASE_CANCELLED, timeout_s=60)
    moved = wait_for(
        lambda: (
            (job := job_of(fed, "vic", resumable)).phase == pb.JOB_PHASE_RUNNING and job.attempt == 2 and job
        ),
        timeout_s=90,
    )
    assert (moved.cluster, moved.capacity_kind) == ("dc", "private"), moved
    requeued = [e for e in moved.events if e.phase == pb.JOB_PHASE_QUEUED and e.attempt == 2]
    assert len(requeued) == 1, moved.events
    assert "stopped at a checkpoint to move to cluster dc" in requeued[0].reason
    assert "saves" in requeued[0].reason
    assert "preempted for" not in requeued[0].reason

    # The official client's view: the first attempt's pods are gone from the cloud, the second runs
    # on the private cluster.
    wait_for(lambda: not gang_pods(sims, "aws", resumable), timeout_s=30)
    assert _attempts(gang_pods(sims, "dc", resumable)) == {"2"}

    # The job that did not say it resumes was never touched, and one move was ordered, once.
    kept = job_of(fed, "vic", stuck)
    assert (kept.phase, kept.attempt, kept.cluster) == (pb.JOB_PHASE_RUNNING, 1, "aws"), kept
    assert _attempts(gang_pods(sims, "aws", stuck)) == {"1"}
    orders = _logged(fed, "move_ordered")
    assert [(o["job_id"], o["from_cluster"], o["to_cluster"]) for o in orders] == [(resumable, "aws", "dc")]
    assert float(orders[0]["saving_usd"]) > 100
    # A move evicts only the job itself: no preemption was ordered for anyone.
    assert _logged(fed, "preemption_ordered") == []
