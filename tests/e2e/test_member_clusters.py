"""End to end on Kubernetes API servers: `gpufed serve` drives simulated clusters through kubeconfigs.

The simulator runs as its own process (as `gpufed up` runs it) and the server as another; the
server reaches the clusters only with the official `kubernetes` client over HTTP, and the test
reaches them the same way to see what they hold. Faults come through the simulator's admin
endpoint, as an operator's chaos tool would inject them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.e2e.kube import PodRecorder, gang_pods, gangs, job_of, onprem_a100, serve_clusters, sim_admin

pytestmark = pytest.mark.e2e

# Short enough for a test, long enough that the backend's own silence threshold (a quarter of it)
# is not hit by a slow CI machine's scheduling hiccup.
GRACE_S = 4

CLUSTERS: list[dict[str, Any]] = [
    onprem_a100(nodes=3),
    {
        "name": "cloud",
        "provider": "aws",
        "region": "us-east-1",
        "pools": [
            {
                "name": "a100-od",
                "gpuType": "A100",
                "kind": "on_demand",
                "usdPerGpuHour": 2.7447,
                "gpusPerNode": 8,
                "nodes": 2,
            }
        ],
    },
]

RESTART_ON_EVICTION = "  restartPolicy: {onFailure: AbortJob, onEviction: RestartJob, maxRetries: 2}\n"


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with serve_clusters(
        etcd,
        tmp_path,
        sims,
        CLUSTERS,
        grace_s=GRACE_S,
        tenants=[{"name": "platform"}, {"name": "vision"}],
        users=[
            {"name": "admin", "tenant": "platform", "role": "admin"},
            {"name": "alice", "tenant": "vision"},
        ],
    ) as process:
        yield process


def _job(fed: ServerProcess, job_id: str) -> pb.Job:
    return job_of(fed, "alice", job_id)


def test_a_gang_lands_whole_on_one_cluster_and_restarts_whole_when_a_node_is_lost(
    fed: ServerProcess, sims: SimProcess
) -> None:
    # Every pod either cluster ever ran, from watches opened before anything runs: when the master
    # finishes first, Volcano's CompleteJob deletes a worker still running, so a listing taken after
    # success may no longer show the whole gang that ran.
    recorder = PodRecorder()
    for cluster in ("onprem", "cloud"):
        recorder.follow(sims, cluster)
    try:
        _lands_whole_and_restarts_whole(fed, sims, recorder)
    finally:
        recorder.stop()
    assert not recorder.errors, recorder.errors


def _lands_whole_and_restarts_whole(fed: ServerProcess, sims: SimProcess, recorder: PodRecorder) -> None:
    with fed.client("alice") as alice:
        job_id = alice.submit(
            manifest("ddp", workers=4, gpus=2, duration="6s", extra_spec=RESTART_ON_EVICTION)
        ).job_id
    running = wait_for(lambda: (j := _job(fed, job_id)).phase == pb.JOB_PHASE_RUNNING and j, timeout_s=30)
    assert running.cluster == "onprem", "private capacity is used before the cloud's"
    assert running.attempt == 1

    # One gang object with every replica, on one cluster; nothing on the other.
    objects = gangs(sims, "onprem", job_id)
    assert [g["metadata"]["name"] for g in objects] == [f"{job_id}-a1"]
    assert objects[0]["spec"]["minAvailable"] == 5
    pods = gang_pods(sims, "onprem", job_id)
    assert sorted(p.metadata.name for p in pods) == sorted(
        [f"{job_id}-a1-master-0"] + [f"{job_id}-a1-worker-{i}" for i in range(4)]
    )
    assert all(p.status.phase == "Running" for p in pods)
    assert gangs(sims, "cloud", job_id) == []
    assert gang_pods(sims, "cloud", job_id) == []

    # The node under one worker stops reporting: the whole gang, not only that pod, starts again.
    victim = next(p for p in pods if p.metadata.name.endswith("worker-3")).spec.node_name
    sim_admin(sims, "onprem", "POST", f"/faults/nodes/{victim}/lose")
    restarted = wait_for(lambda: (j := _job(fed, job_id)).attempt == 2 and j, timeout_s=30)
    assert "evicted" in " ".join(e.reason for e in restarted.events).lower()
    done = wait_for(lambda: (j := _job(fed, job_id)).phase == pb.JOB_PHASE_SUCCEEDED and j, timeout_s=60)
    assert done.attempt == 2
    phases = [pb.JobPhase.Name(e.phase).removeprefix("JOB_PHASE_") for e in done.events]
    assert phases.count("RUNNING") == 2
    assert phases[-1] == "SUCCEEDED"

    # No pod of attempt 1 runs any more; attempt 2 ran whole, on one cluster, off the lost node.
    for cluster in ("onprem", "cloud"):
        for pod in gang_pods(sims, cluster, job_id):
            if pod.metadata.labels["gpufed.io/attempt"] == "1":
                assert pod.status.phase != "Running", pod.metadata.name
    second = recorder.lives_by_job()[(job_id, 2)]
    assert {life.cluster for life in second} == {done.cluster}
    assert sorted(life.name for life in second) == sorted(
        [f"{job_id}-a2-master-0"] + [f"{job_id}-a2-worker-{i}" for i in range(4)]
    )
    assert all(life.start_s is not None for life in second), "every replica of attempt 2 started"
    assert victim not in {life.node for life in second}


def test_a_cluster_silent_past_its_grace_loses_its_jobs_and_the_stale_copy_goes_when_it_returns(
    fed: ServerProcess, sims: SimProcess
) -> None:
    with fed.client("alice") as alice:
        # Long enough that attempt 1 still runs on the silent cluster when it answers again, after
        # the grace, the move and attempt 2's start: a superseded gang that ended by itself is kept
        # for its logs (the collector's retention), not deleted. At 12 s a loaded run's move outlasted
        # it once, and the deletion this test checks had nothing to delete.
        job_id = alice.submit(manifest("long", workers=2, gpus=4, duration="20s")).job_id
    running = wait_for(lambda: (j := _job(fed, job_id)).phase == pb.JOB_PHASE_RUNNING and j, timeout_s=30)
    assert (running.cluster, running.attempt) == ("onprem", 1)

    # The on-prem API stops answering (connections refused). The gang keeps running there, unseen.
    sim_admin(sims, "onprem", "POST", "/faults/unreachable", {"mode": "close"})
    moved = wait_for(
        lambda: (j := _job(fed, job_id)).attempt == 2 and j.phase == pb.JOB_PHASE_RUNNING and j,
        timeout_s=GRACE_S * 3 + 30,
    )
    assert moved.cluster == "cloud"
    assert "has not answered" in " ".join(e.reason for e in moved.events)
    assert [g["metadata"]["name"] for g in gangs(sims, "cloud", job_id)] == [f"{job_id}-a2"]

    # Back again: the superseded attempt 1, still running there, is deleted, so it never runs twice.
    sim_admin(sims, "onprem", "DELETE", "/faults/unreachable")
    wait_for(lambda: gangs(sims, "onprem", job_id) == [], timeout_s=30)
    wait_for(
        lambda: all(p.status.phase != "Running" for p in gang_pods(sims, "onprem", job_id)), timeout_s=30
    )
    done = wait_for(lambda: (j := _job(fed, job_id)).phase == pb.JOB_PHASE_SUCCEEDED and j, timeout_s=60)
    assert (done.cluster, done.attempt) == ("cloud", 2)
