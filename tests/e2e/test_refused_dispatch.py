"""End to end: a member cluster that keeps refusing a job's gang is backed off from, not hammered.

The cluster here serves no Volcano, so a gang whose replicas differ cannot be made into one Indexed
Job. That gang was sent there again and again and refused each time (issue 14: attempt 542 in 49 s;
backed off since, up to attempt 7): now the placer knows which clusters run such a gang and never
sends it where it would be refused (issue 32; tests/e2e/test_gpu_types.py). The backoff from a
cluster that refuses for reasons the placer cannot see is tested in tests/unit/test_dispatch_backoff.py.
Through gRPC only: `explain` says why the job waits, `ListClusters` (what `gpufed clusters` shows)
never shows the cluster refusing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.render import clusters_table
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, wait_for
from tests.e2e.kube import a100_pool, job_of, serve_clusters

pytestmark = pytest.mark.e2e

CLUSTERS: list[dict[str, Any]] = [
    {
        "name": "onprem",
        "provider": "private",
        "region": "dc1",
        "volcano": False,
        "pools": [a100_pool(nodes=2)],
    },
]

# Master and workers want different GPUs: one pod template (an Indexed Job) cannot run them.
UNEVEN = """apiVersion: gpufed.io/v1
kind: TrainingJob
metadata:
  name: uneven
  annotations:
    sim.gpufed.io/duration: "60s"
spec:
  gpuTypes: [A100]
  tasks:
    - {name: master, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 1}
    - {name: worker, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 2}
"""


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with serve_clusters(
        etcd,
        tmp_path,
        sims,
        CLUSTERS,
        grace_s=8,
        tenants=[{"name": "platform"}, {"name": "vision"}],
        users=[
            {"name": "admin", "tenant": "platform", "role": "admin"},
            {"name": "alice", "tenant": "vision"},
        ],
    ) as process:
        yield process


def test_a_gang_the_cluster_would_refuse_is_never_sent_there(fed: ServerProcess) -> None:
    with fed.client("alice") as alice:
        job_id = alice.submit(UNEVEN).job_id
        wait_for(lambda: bool(alice.explain(job_id).reasons), timeout_s=20)
        reasons = alice.explain(job_id).reasons
        # A uniform gang submitted after it runs: cycles went by with the uneven gang in the queue.
        later = alice.submit(
            UNEVEN.replace("name: uneven", "name: even").replace("gpus: 2}", "gpus: 1}")
        ).job_id
    wait_for(lambda: job_of(fed, "alice", later).phase == pb.JOB_PHASE_RUNNING, timeout_s=30)
    assert [r.code for r in reasons] == ["placement_rules"], reasons
    assert "needs Volcano" in reasons[0].message
    job = job_of(fed, "alice", job_id)
    assert (job.phase, job.attempt) == (pb.JOB_PHASE_QUEUED, 1)
    assert not [e for e in job.events if "refused" in e.reason]
    with fed.client("admin") as admin:
        reply = admin.clusters()
    (onprem,) = reply.clusters
    assert onprem.state == ""
    assert "REFUSING" not in clusters_table(reply)


def test_explain_and_clusters_are_quiet_while_nothing_is_refused(fed: ServerProcess) -> None:
    with fed.client("alice") as alice:
        job_id = alice.submit(UNEVEN.replace("gpus: 2}", "gpus: 1}")).job_id
    wait_for(lambda: job_of(fed, "alice", job_id).phase == pb.JOB_PHASE_RUNNING, timeout_s=30)
    with fed.client("alice") as alice:
        assert "refused" not in alice.explain(job_id).summary
    with fed.client("admin") as admin:
        (onprem,) = admin.clusters().clusters
    assert onprem.state == ""
