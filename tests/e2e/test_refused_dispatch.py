"""End to end: a member cluster that keeps refusing a job's gang is backed off from, not hammered.

The cluster here serves no Volcano, so a gang whose replicas differ cannot be made into one Indexed
Job: the backend refuses it on every try, as a cluster with a rejecting admission webhook would. The
placer cannot know that and keeps choosing the cluster; without a backoff that was a requeue loop
(issue 14: attempt 542 in 49 s). Through gRPC only: `explain` says why the job waits and for how
long, `ListClusters` (what `gpufed clusters` shows) says the cluster is refusing.
"""

from __future__ import annotations

import re
import time
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


def test_a_cluster_that_keeps_refusing_is_backed_off_from_and_shown_refusing(fed: ServerProcess) -> None:
    with fed.client("alice") as alice:
        job_id = alice.submit(UNEVEN).job_id
    wait_for(lambda: job_of(fed, "alice", job_id).attempt >= 2, timeout_s=20)
    started = time.monotonic()
    time.sleep(10)
    elapsed_s = time.monotonic() - started + 2

    job = job_of(fed, "alice", job_id)
    # Backoff 1, 2, 4, 8 s: a handful of tries in ~12 s, where the loop made hundreds.
    assert job.attempt <= 6, f"attempt {job.attempt} after {elapsed_s:.0f} s"
    assert len(job.events) <= 2 * job.attempt + 2
    assert not [e.reason for e in job.events if re.search(r"retry \d+ of", e.reason)], "no retry charged"
    assert any("refused the gang" in e.reason for e in job.events)

    with fed.client("alice") as alice:
        summary = alice.explain(job_id).summary
    assert "dispatch to cluster onprem refused" in summary, summary
    assert re.search(r"\(attempt \d+ of backoff\)", summary), summary
    assert re.search(r"(retrying in|not retried there for) \d+ s", summary), summary

    with fed.client("admin") as admin:
        reply = admin.clusters()
    (onprem,) = reply.clusters
    assert onprem.state == "refusing"
    assert "Indexed Job" in onprem.last_error
    assert onprem.refused_jobs == 1
    assert onprem.refusing_since.seconds > 0
    text = clusters_table(reply)
    assert "REFUSING" in text
    assert "onprem: refusing dispatches since" in text


def test_explain_and_clusters_are_quiet_while_nothing_is_refused(fed: ServerProcess) -> None:
    with fed.client("alice") as alice:
        job_id = alice.submit(UNEVEN.replace("gpus: 2}", "gpus: 1}")).job_id
    wait_for(lambda: job_of(fed, "alice", job_id).phase == pb.JOB_PHASE_RUNNING, timeout_s=30)
    with fed.client("alice") as alice:
        assert "refused" not in alice.explain(job_id).summary
    with fed.client("admin") as admin:
        (onprem,) = admin.clusters().clusters
    assert onprem.state == ""
