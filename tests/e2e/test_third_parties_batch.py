"""End to end: `kubectl delete job <gang> --cascade=orphan` on a cluster without Volcano.

The same as tests/e2e/test_third_parties.py for a gang made of a headless Service and an Indexed
Job: the pods the batch Job leaves behind are deleted, with its Service, before the next attempt
starts, and the ledger charges the old attempt until they are gone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.e2e.kube import a100_pool, gang_pods, serve_clusters
from tests.e2e.test_third_parties import (
    KUBECTL,
    NAMESPACE,
    RunWatch,
    _ends_with_its_pods,
    _gpufed_objects,
    _no_two_attempts_at_once,
    _retries,
    _running,
    _seen_stopped,
    kubectl,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed"),
]

CLUSTERS: list[dict[str, Any]] = [
    {
        "name": "onprem",
        "provider": "private",
        "region": "dc1",
        "volcano": False,
        "pools": [a100_pool(nodes=2)],
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
        tenants=[{"name": "platform"}, {"name": "vision"}],
        users=[
            {"name": "fin", "tenant": "platform", "role": "finance"},
            {"name": "alice", "tenant": "vision"},
        ],
    ) as process:
        yield process


@pytest.fixture
def pods(sims: SimProcess) -> Iterator[RunWatch]:
    recorder = RunWatch()
    recorder.follow(sims, "onprem")
    yield recorder
    recorder.stop()
    assert not recorder.errors, recorder.errors


def test_a_batch_job_deleted_with_cascade_orphan_has_its_pods_removed_before_the_next_attempt(
    fed: ServerProcess, sims: SimProcess, pods: RunWatch
) -> None:
    with fed.client("alice") as alice:
        job_id = alice.submit(manifest("orphaned", workers=1, gpus=8, duration="20s")).job_id
    _running(fed, job_id, 1)
    wait_for(lambda: len(gang_pods(sims, "onprem", job_id)) == 2, timeout_s=10)
    assert f"job.batch/{job_id}-a1" in kubectl(sims, "get", "jobs.batch", "-n", NAMESPACE, "-o", "name")

    kubectl(sims, "delete", "job.batch", f"{job_id}-a1", "-n", NAMESPACE, "--cascade=orphan")
    restarted = _running(fed, job_id, 2, timeout_s=40)
    assert _retries(restarted) == ["retry 1 of 3"]
    wait_for(lambda: _gpufed_objects(sims, job_id, 1, "pods,services,jobs.batch") == "", timeout_s=20)
    _seen_stopped(pods, job_id, 1)
    _no_two_attempts_at_once(pods, job_id)

    with fed.client("fin") as fin:
        first = next(iv for iv in fin.ledger().intervals if iv.job_id == job_id and iv.attempt == 1)
    assert first.end_s > 0
    _ends_with_its_pods(first.end_s, pods, job_id, 1)
