"""End to end: people other than gpufed act on a member cluster, with the real kubectl.

Operators clean up namespaces and delete gang objects by hand, sometimes with `--cascade=orphan`.
gpufed owns its tenants' namespaces and its gangs' pods: a deleted namespace is made again (no
requeue loop), and pods that outlive their gang object are removed before the job's next attempt
starts, with the ledger interval open until they are gone. The judges are the real kubectl and a pod
watch of the official client, never gpufed's own view.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.e2e.kube import PodRecorder, gang_pods, job_of, onprem_a100, serve_clusters, sim_kubectl

KUBECTL = shutil.which(
    "kubectl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
)
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed"),
]

NAMESPACE = "gpufed-vision"

CLUSTERS: list[dict[str, Any]] = [
    onprem_a100(nodes=2),
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
            {"name": "admin", "tenant": "platform", "role": "admin"},
            {"name": "fin", "tenant": "platform", "role": "finance"},
            {"name": "alice", "tenant": "vision"},
        ],
    ) as process:
        yield process


@dataclass
class RunWatch(PodRecorder):
    """PodRecorder, plus when the watch first saw each pod running and when it saw it stop (the
    pods' startTime has whole seconds only, too coarse to tell two attempts apart)."""

    runs: dict[str, list[Any]] = field(default_factory=dict)

    def _seen(self, cluster: str, kind: str, pod: Any) -> None:
        super()._seen(cluster, kind, pod)
        labels = pod.metadata.labels or {}
        if "gpufed.io/job-id" not in labels:
            return
        now = time.time()
        with self.lock:
            run = self.runs.setdefault(
                pod.metadata.uid,
                [labels["gpufed.io/job-id"], int(labels.get("gpufed.io/attempt", "0")), None, None],
            )
            if run[2] is None and pod.status.phase == "Running" and kind != "DELETED":
                run[2] = now
            stopped = kind == "DELETED" or pod.status.phase in {"Succeeded", "Failed"}
            if run[2] is not None and run[3] is None and stopped:
                run[3] = now

    def spans(self, job_id: str) -> dict[int, list[tuple[float, float | None]]]:
        """Per attempt, each pod's (seen running, seen stopped) as the watch saw it."""
        out: dict[int, list[tuple[float, float | None]]] = {}
        with self.lock:
            for job, attempt, start, end in self.runs.values():
                if job == job_id and start is not None:
                    out.setdefault(attempt, []).append((start, end))
        return out


@pytest.fixture
def pods(sims: SimProcess) -> Iterator[RunWatch]:
    """Every pod the cluster runs, from a watch opened before anything runs."""
    recorder = RunWatch()
    recorder.follow(sims, "onprem")
    yield recorder
    recorder.stop()
    assert not recorder.errors, recorder.errors


def kubectl(sims: SimProcess, *args: str) -> str:
    return sim_kubectl(sims, "onprem", *args).stdout


def _job(fed: ServerProcess, job_id: str) -> pb.Job:
    return job_of(fed, "alice", job_id)


def _running(fed: ServerProcess, job_id: str, attempt: int, timeout_s: float = 30) -> pb.Job:
    return wait_for(
        lambda: (j := _job(fed, job_id)).phase == pb.JOB_PHASE_RUNNING and j.attempt == attempt and j,
        timeout_s=timeout_s,
    )


def _retries(job: pb.Job) -> list[str]:
    """The retries charged to the job, as its history words them."""
    return [m.group(0) for e in job.events if (m := re.search(r"retry \d+ of \d+", e.reason))]


def _seen_stopped(pods: RunWatch, job_id: str, attempt: int) -> None:
    """Wait until the pod watch saw every pod of the attempt stop: it lags the API server a little
    (more on a busy machine), so a check right after the pods are gone could still miss the event."""

    def stopped() -> bool:
        spans = pods.spans(job_id).get(attempt)
        return bool(spans) and all(end is not None for _, end in spans or [])

    wait_for(stopped, timeout_s=10)


def _ends_with_its_pods(end_s: float, pods: RunWatch, job_id: str, attempt: int) -> None:
    """The attempt's ledger interval ends when its pods did, not when gpufed noticed (the grace
    period is 8 s here). Its end is the pods' own, which Kubernetes keeps in whole seconds (so up to
    1 s before the instant), and the watch saw it a moment after (up to about 1 s on a busy machine)."""
    pods_end = max(end for _, end in pods.spans(job_id)[attempt] if end is not None)
    assert -2.0 <= end_s - pods_end <= 1.0, (end_s, pods_end)


def _no_two_attempts_at_once(pods: RunWatch, job_id: str) -> None:
    """The pod watch's verdict: no pod of an attempt was seen running before every pod of the
    attempts before it was seen stopped."""
    spans = pods.spans(job_id)
    attempts = sorted(spans)
    for earlier, later in itertools.pairwise(attempts):
        ends = [end for _, end in spans[earlier]]
        assert all(e is not None for e in ends), f"attempt {earlier} has pods still running"
        last_end = max(e for e in ends if e is not None)
        first_start = min(start for start, _ in spans[later])
        assert first_start >= last_end, (
            f"attempt {later} ran from {first_start:.3f} while attempt {earlier}'s pods ran until {last_end:.3f}"
        )


def _gpufed_objects(
    sims: SimProcess, job_id: str, attempt: int, kinds: str = "pods,services,podgroups,jobs.batch.volcano.sh"
) -> str:
    """Every object of the attempt that kubectl finds: pods, services, pod groups, gang objects."""
    name = f"{job_id}-a{attempt}"
    found = kubectl(sims, "get", kinds, "-A", "-o", "name")
    return "\n".join(line for line in found.splitlines() if line.endswith(f"/{name}") or f"/{name}-" in line)


def test_a_deleted_tenant_namespace_is_recreated_and_its_jobs_do_not_loop(
    fed: ServerProcess, sims: SimProcess
) -> None:
    with fed.client("alice") as alice:
        first = alice.submit(manifest("first", workers=1, gpus=4, duration="30s")).job_id
    _running(fed, first, 1)
    assert NAMESPACE in kubectl(sims, "get", "namespaces", "-o", "name")

    # A person cleans up the tenant's namespace while its job runs; then the tenant submits again.
    kubectl(sims, "delete", "namespace", NAMESPACE)
    with fed.client("alice") as alice:
        second = alice.submit(manifest("second", workers=1, gpus=4, duration="30s")).job_id

    # The running job lost its gang with the namespace: restarted once, per its restart policy. The
    # new one runs at its first attempt: gpufed made the namespace again instead of looping.
    restarted = _running(fed, first, 2)
    assert _retries(restarted) == ["retry 1 of 3"]
    fresh = _running(fed, second, 1)
    assert _retries(fresh) == []
    assert f"namespace/{NAMESPACE}" in kubectl(sims, "get", "namespaces", "-o", "name")

    # And they stay put: no attempt counter climbing behind a RUNNING face.
    time.sleep(3)
    for job_id, attempt in ((first, 2), (second, 1)):
        job = _job(fed, job_id)
        assert (job.phase, job.attempt) == (pb.JOB_PHASE_RUNNING, attempt), job
        assert len(job.events) < 10, [e.reason for e in job.events]
    running = kubectl(
        sims, "get", "pods", "-n", NAMESPACE, "--field-selector=status.phase=Running", "-o", "name"
    )
    assert len(running.split()) == 4


def test_a_gang_deleted_with_cascade_orphan_has_its_pods_removed_before_the_next_attempt(
    fed: ServerProcess, sims: SimProcess, pods: RunWatch
) -> None:
    with fed.client("alice") as alice:
        job_id = alice.submit(manifest("orphaned", workers=1, gpus=8, duration="20s")).job_id
    _running(fed, job_id, 1)
    wait_for(lambda: len(gang_pods(sims, "onprem", job_id)) == 2, timeout_s=10)

    # The gang object goes; its pods would run on, unowned, beside the next attempt.
    kubectl(sims, "delete", "vcjob", f"{job_id}-a1", "-n", NAMESPACE, "--cascade=orphan")
    restarted = _running(fed, job_id, 2, timeout_s=40)
    assert _retries(restarted) == ["retry 1 of 3"]

    # Nothing of attempt 1 is left on the cluster: pods, service, pod group.
    wait_for(lambda: _gpufed_objects(sims, job_id, 1) == "", timeout_s=20)
    _seen_stopped(pods, job_id, 1)
    _no_two_attempts_at_once(pods, job_id)

    # Finance sees what the cloud billed: attempt 1's interval ends when its pods did.
    with fed.client("fin") as fin:
        intervals = {iv.attempt: iv for iv in fin.ledger().intervals if iv.job_id == job_id}
    first = intervals[1]
    assert first.end_s > 0, "attempt 1's interval is closed"
    _ends_with_its_pods(first.end_s, pods, job_id, 1)
    assert intervals[2].end_s == 0, "attempt 2 still runs"


def test_a_gang_deleted_while_running_restarts_only_after_its_pods_are_gone(
    fed: ServerProcess, sims: SimProcess, pods: RunWatch
) -> None:
    with fed.client("alice") as alice:
        job_id = alice.submit(manifest("deleted", workers=1, gpus=8, duration="20s")).job_id
    _running(fed, job_id, 1)
    wait_for(lambda: len(gang_pods(sims, "onprem", job_id)) == 2, timeout_s=10)

    # An ordinary delete (background): the object goes at once, its pods are stopped after it.
    kubectl(sims, "delete", "vcjob", f"{job_id}-a1", "-n", NAMESPACE, "--wait=false")
    restarted = _running(fed, job_id, 2, timeout_s=40)
    assert _retries(restarted) == ["retry 1 of 3"]
    wait_for(lambda: _gpufed_objects(sims, job_id, 1) == "", timeout_s=20)
    _seen_stopped(pods, job_id, 1)
    _no_two_attempts_at_once(pods, job_id)
