"""End to end: a job's logs and its describe view through the one gRPC endpoint (issue 18).

`gpufed serve` drives a simulated cluster (its own process) with the official client; the test talks
to the server only through gRPC, and to the cluster through the official client only to see what it
holds. The simulated kubelet writes each container's log (docs/kubernetes.md) and fails containers
by pod annotation: an OOM kill, an image that never pulls.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client as k8s

from clusters.logtext import stamp_ns
from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, manifest, run_cli, wait_for
from tests.e2e.kube import _api, a100_pool, gang_pods, gangs, job_of, serve_clusters, sim_admin

pytestmark = pytest.mark.e2e

# Keys of the simulator's cluster config that gpufed's own config does not take.
SIM_ONLY = {"logIntervalS", "terminationS"}
CLUSTERS: list[dict[str, Any]] = [
    {
        "name": "onprem",
        "provider": "private",
        "region": "dc1",
        "logIntervalS": 0.2,
        # A real kubelet notices a stopped container on its next relist, once a second: a killed
        # pod stays that long (the simulator's default is 0.2 s).
        "terminationS": 1.0,
        "pools": [a100_pool(nodes=2)],
    }
]


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    clusters = [{k: v for k, v in c.items() if k not in SIM_ONLY} for c in CLUSTERS]
    with serve_clusters(
        etcd,
        tmp_path,
        sims,
        clusters,
        grace_s=4,
        tenants=[{"name": "platform"}, {"name": "vision"}, {"name": "audio"}],
        users=[
            {"name": "admin", "tenant": "platform", "role": "admin"},
            {"name": "alice", "tenant": "vision"},
            {"name": "bob", "tenant": "audio"},
        ],
    ) as process:
        yield process


def _annotated(name: str, annotations: dict[str, str], *, duration: str = "3s", extra: str = "") -> str:
    text = manifest(name, workers=3, gpus=1, duration=duration, extra_spec=extra)
    lines = "".join(f'    {k}: "{v}"\n' for k, v in annotations.items())
    return text.replace("  annotations:\n", "  annotations:\n" + lines, 1)


def delete_gang(sims: SimProcess, cluster: str, namespace: str, name: str) -> None:
    with _api(sims, cluster) as api:
        k8s.CustomObjectsApi(api).delete_namespaced_custom_object(
            "batch.volcano.sh", "v1alpha1", namespace, "jobs", name, propagation_policy="Background"
        )


def gpufed(fed: ServerProcess, user: str, *args: str) -> str:
    """The CLI, as a user runs it against the server."""
    token = fed.state_dir / "tokens" / f"{user}.token"
    done = run_cli("--server", fed.target, "--token-file", str(token), *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _logs(fed: ServerProcess, user: str, **request: Any) -> list[pb.LogChunk]:
    with fed.client(user) as client:
        return list(client.logs(pb.StreamLogsRequest(**request), timeout_s=60))


def _by_replica(chunks: list[pb.LogChunk]) -> dict[tuple[str, int], list[str]]:
    found: dict[tuple[str, int], list[str]] = {}
    for c in chunks:
        if c.lines:
            found.setdefault((c.task, c.replica), []).extend(c.lines)
    return found


ALL_FOUR = {("master", 0), ("worker", 0), ("worker", 1), ("worker", 2)}


# The master outlives its workers by a second, as a DDP master that waits for every rank does: were
# they to end together, Volcano's CompleteJob could kill a worker in the very moment it ends by itself,
# and such a pod goes at once (the next test kills workers on purpose).
def test_logs_of_a_gang_follow_then_kept_after_pods_are_gone(fed: ServerProcess, sims: SimProcess) -> None:
    with fed.client("alice") as alice:
        job_id = alice.submit(_annotated("ddp", {"sim.gpufed.io/duration.master": "5"}, duration="4s")).job_id
    wait_for(lambda: job_of(fed, "alice", job_id).phase == pb.JOB_PHASE_RUNNING, timeout_s=30)

    # -f: lines arrive while the job runs, and the stream ends when the job does.
    arrivals: list[pb.LogChunk] = []
    done = threading.Event()

    def follow() -> None:
        with fed.client("alice") as client:
            for chunk in client.logs(pb.StreamLogsRequest(job_id=job_id, follow=True), timeout_s=60):
                arrivals.append(chunk)
        done.set()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    finished = wait_for(
        lambda: (j := job_of(fed, "alice", job_id)).phase == pb.JOB_PHASE_SUCCEEDED and j, timeout_s=60
    )
    assert done.wait(20), "the follow did not end when the job ended"
    followed = _by_replica(arrivals)
    assert set(followed) == ALL_FOUR
    # Streamed while the job ran, not sent at its end: the master's first lines came before its last
    # line was written, and more came after them. (Compared by what arrived, not by the clock: a
    # busy machine can hold any step of this for a second.)
    master = [c for c in arrivals if (c.task, c.replica) == ("master", 0) and c.lines]
    assert not any("exited with code 0" in line for line in master[0].lines), "sent only at the end"
    assert len(master) >= 2, "lines must stream while the job runs, not at its end"
    assert any("exited with code 0" in line for line in followed[("master", 0)])
    assert finished.reason == ""

    # Once the gang's pods are collected (here by an operator, before gpufed's own hour is up), the
    # logs are served from the kept copy.
    for gang in gangs(sims, "onprem", job_id):
        delete_gang(sims, "onprem", gang["metadata"]["namespace"], gang["metadata"]["name"])
    wait_for(lambda: not gang_pods(sims, "onprem", job_id), timeout_s=60)
    kept = _logs(fed, "alice", job_id=job_id)
    assert {c.source for c in kept if c.lines} == {"kept"}
    kept_lines = _by_replica(kept)
    assert set(kept_lines) == ALL_FOUR
    assert kept_lines[("master", 0)][-1] == followed[("master", 0)][-1]
    tail = _by_replica(_logs(fed, "alice", job_id=job_id, task="worker", replica=1, tail_lines=2))
    assert tail == {("worker", 1): kept_lines[("worker", 1)][-2:]}
    stamped = _by_replica(_logs(fed, "alice", job_id=job_id, task="master", tail_lines=1, timestamps=True))
    assert stamped[("master", 0)][0].split(" ", 1)[0].endswith("Z")
    printed = gpufed(fed, "alice", "logs", job_id, "--tail", "1").splitlines()
    assert sorted(line.split(" | ", 1)[0] for line in printed) == [
        "master-0",
        "worker-0",
        "worker-1",
        "worker-2",
    ]

    # Another tenant: NOT_FOUND, word for word as for a job that does not exist.
    with fed.client("bob") as bob:
        with pytest.raises(grpc.RpcError) as theirs:
            list(bob.logs(pb.StreamLogsRequest(job_id=job_id), timeout_s=10))
        with pytest.raises(grpc.RpcError) as missing:
            list(bob.logs(pb.StreamLogsRequest(job_id="nope-00000000"), timeout_s=10))
        with pytest.raises(grpc.RpcError) as get_theirs:
            bob.get(job_id)
        with pytest.raises(grpc.RpcError) as described:
            bob.describe(job_id)
    assert theirs.value.code() == grpc.StatusCode.NOT_FOUND
    assert theirs.value.details() == get_theirs.value.details() == f"job '{job_id}' not found"
    assert described.value.details() == theirs.value.details()
    assert missing.value.details() == "job 'nope-00000000' not found"


def test_workers_killed_when_the_master_ends_keep_their_logs(fed: ServerProcess, sims: SimProcess) -> None:
    """The master ends first; Volcano's `TaskCompleted: CompleteJob` kills the running workers, whose
    pods go within `terminationS`, before the reconciler keeps the attempt. Their logs are kept all
    the same: the backend read each one as the pod watch saw it marked for deletion."""
    with fed.client("alice") as alice:
        job_id = alice.submit(
            _annotated("mpi", {"sim.gpufed.io/duration.master": "3"}, duration="60s")
        ).job_id
    wait_for(
        lambda: job_of(fed, "alice", job_id).phase == pb.JOB_PHASE_SUCCEEDED,
        timeout_s=60,
    )
    # The cluster says the workers were killed: deleted while they ran, not ended by themselves.
    with _api(sims, "onprem") as api:
        events = k8s.CoreV1Api(api).list_event_for_all_namespaces().items
    killed = {
        e.involved_object.name for e in events if e.reason == "Killing" and job_id in e.involved_object.name
    }
    assert {name.rsplit("-", 2)[-2] for name in killed} == {"worker"}
    for gang in gangs(sims, "onprem", job_id):
        delete_gang(sims, "onprem", gang["metadata"]["namespace"], gang["metadata"]["name"])
    wait_for(lambda: not gang_pods(sims, "onprem", job_id), timeout_s=60)
    kept = _logs(fed, "alice", job_id=job_id)
    assert {c.source for c in kept if c.lines} == {"kept"}
    kept_lines = _by_replica(kept)
    assert set(kept_lines) == ALL_FOUR
    for worker in range(3):
        assert any("started" in line for line in kept_lines[("worker", worker)])
        assert not any("exited with code 0" in line for line in kept_lines[("worker", worker)])
    assert any("exited with code 0" in line for line in kept_lines[("master", 0)])
    with fed.client("alice") as alice:
        described = alice.describe(job_id)
    replicas = {(r.task, r.replica): r for r in described.attempts[-1].replicas}
    assert set(replicas) == ALL_FOUR
    assert {replicas[("worker", i)].exit_code for i in range(3)} == {137}
    assert replicas[("master", 0)].exit_code == 0


def test_oom_killed_attempts_keep_their_logs_and_say_why(fed: ServerProcess) -> None:
    retry = "  restartPolicy: {onFailure: RestartJob, onEviction: RestartJob, maxRetries: 1}\n"
    with fed.client("alice") as alice:
        job_id = alice.submit(
            # The master alone runs out of memory. With every replica told to, Volcano's AbortJob
            # deleted the others while they ran, and one that reached its own OOM kill within its
            # grace period went with the log copied at its deletion, before the kill's last line
            # (the known limit of `clusters/kubernetes/last_words.py`): the test failed under load.
            _annotated("oom", {"sim.gpufed.io/oom-kill-after-s.master": "1.5"}, duration="30s", extra=retry)
        ).job_id
    failed = wait_for(
        lambda: (j := job_of(fed, "alice", job_id)).phase == pb.JOB_PHASE_FAILED and j, timeout_s=90
    )
    assert failed.attempt == 2
    assert failed.reason == "OOMKilled"
    with fed.client("alice") as alice:
        listed = {j.job_id: j for j in alice.list_all()}
        description = alice.describe(job_id)
    assert listed[job_id].reason == "OOMKilled"
    assert [a.attempt for a in description.attempts] == [1, 2]
    for attempt in description.attempts:
        assert attempt.cluster == "onprem"
        assert attempt.gpu_type == "A100"
        # Volcano's AbortJob deletes the gang's running pods once one fails; the failed ones stay.
        assert {(r.task, r.replica) for r in attempt.replicas} <= ALL_FOUR
        assert any(r.reason == "OOMKilled" and r.exit_code == 137 for r in attempt.replicas)
    table = gpufed(fed, "alice", "list").splitlines()
    assert table[0].split()[:4] == ["JOB", "TENANT", "PHASE", "REASON"]
    assert next(row for row in table if row.startswith(job_id)).split()[3] == "OOMKilled"
    described = gpufed(fed, "alice", "describe", job_id)
    assert "Phase:     FAILED (OOMKilled)" in described
    assert described.count("OOMKilled") >= 3
    # The failed first attempt's logs, after the second attempt replaced it.
    first = _by_replica(_logs(fed, "alice", job_id=job_id, attempt=1))
    killed = {(r.task, r.replica) for r in description.attempts[0].replicas if r.reason == "OOMKilled"}
    assert killed <= set(first)
    for where in killed:
        assert any("out of memory" in line for line in first[where])


def test_an_image_that_never_pulls_shows_in_list_and_describe(fed: ServerProcess) -> None:
    with fed.client("alice") as alice:
        job_id = alice.submit(_annotated("pull", {"sim.gpufed.io/fail-image-pull": "true"})).job_id
        # A watch says why the job waits while it is still DISPATCHED, without a phase change.
        watched = next(
            event
            for event in alice.watch(job_id=job_id, include_initial=True, timeout_s=60)
            if event.job.reason == "ImagePullBackOff"
        )
        assert watched.job.phase == pb.JOB_PHASE_DISPATCHED

        def reason() -> bool:
            return {j.job_id: j for j in alice.list_all()}[job_id].reason == "ImagePullBackOff"

        wait_for(reason, timeout_s=60)
        description = alice.describe(job_id)
        # Logs of containers that never started: a clear notice per replica, not silence.
        unstarted = list(alice.logs(pb.StreamLogsRequest(job_id=job_id), timeout_s=10))
        alice.cancel(job_id)
    assert description.job.phase == pb.JOB_PHASE_DISPATCHED
    live = description.attempts[-1]
    # Read after the wait: the kubelet may be retrying the pull by then (ErrImagePull).
    assert live.reason in {"ImagePullBackOff", "ErrImagePull"}
    assert all(r.reason in {"ImagePullBackOff", "ErrImagePull"} for r in live.replicas)
    assert any("ImagePullBackOff" in w or "ErrImagePull" in w for w in description.wait_reasons)
    assert any(e.reason in {"Failed", "BackOff"} for e in live.events)
    assert {(c.task, c.replica) for c in unstarted} == ALL_FOUR
    assert all("waiting to start" in c.notice for c in unstarted)


LIMITS = {"maxStreamsPerTenant": 2, "maxStreamsPerServer": 3, "maxBytesPerCall": 3000}


@pytest.fixture
def limited(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server with small log limits (the config's `logs:`) and a long grace for a lost cluster."""
    clusters = [{k: v for k, v in c.items() if k not in SIM_ONLY} for c in CLUSTERS]
    with serve_clusters(
        etcd,
        tmp_path,
        sims,
        clusters,
        grace_s=60,
        tenants=[{"name": "vision"}, {"name": "audio"}],
        users=[{"name": "alice", "tenant": "vision"}, {"name": "bob", "tenant": "audio"}],
        logs=LIMITS,
    ) as process:
        yield process


def _running(fed: ServerProcess, user: str, name: str) -> str:
    with fed.client(user) as client:
        job_id = client.submit(manifest(name, workers=1, gpus=1, duration="60s")).job_id
    wait_for(lambda: job_of(fed, user, job_id).phase == pb.JOB_PHASE_RUNNING, timeout_s=30)
    return job_id


def test_stream_and_byte_limits_hold(limited: ServerProcess) -> None:
    mine = _running(limited, "alice", "mine")
    theirs = _running(limited, "bob", "theirs")
    clients = [limited.client("alice"), limited.client("alice"), limited.client("bob")]
    streams = [
        c.logs(pb.StreamLogsRequest(job_id=j, follow=True, task="master"))
        for c, j in zip(clients, (mine, mine, theirs), strict=True)
    ]
    try:
        for stream in streams:
            next(stream)  # open and streaming
        with limited.client("alice") as alice, pytest.raises(grpc.RpcError) as tenant_full:
            list(alice.logs(pb.StreamLogsRequest(job_id=mine, tail_lines=1), timeout_s=10))
        with limited.client("bob") as bob, pytest.raises(grpc.RpcError) as server_full:
            list(bob.logs(pb.StreamLogsRequest(job_id=theirs, tail_lines=1), timeout_s=10))
    finally:
        for stream in streams:
            stream.cancel()
        for c in clients:
            c.close()
    assert tenant_full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "tenant vision already has 2 log streams open" in (tenant_full.value.details() or "")
    assert server_full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "already streams 3 logs" in (server_full.value.details() or "")

    # Closed streams give their places back; a call past the byte limit stops at it.
    def bytes_limited() -> grpc.RpcError | None:
        got: list[pb.LogChunk] = []
        with limited.client("alice") as alice:
            try:
                got.extend(alice.logs(pb.StreamLogsRequest(job_id=mine), timeout_s=10))
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "per call" in (
                    error.details() or ""
                ):
                    assert sum(len(line) + 1 for c in got for line in c.lines) <= LIMITS["maxBytesPerCall"]
                    return error
                raise
        return None

    assert wait_for(bytes_limited, timeout_s=30), "the log never grew past the byte limit"


def test_an_unreachable_cluster_is_unavailable_by_name_and_a_follow_goes_on(
    limited: ServerProcess, sims: SimProcess
) -> None:
    job_id = _running(limited, "alice", "outage")
    chunks: list[pb.LogChunk] = []
    stop = threading.Event()

    def follow() -> None:
        with limited.client("alice") as client:
            stream = client.logs(
                pb.StreamLogsRequest(job_id=job_id, follow=True, task="master", timestamps=True)
            )
            for chunk in stream:
                chunks.append(chunk)
                if stop.is_set():
                    stream.cancel()
                    return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    wait_for(lambda: sum(len(c.lines) for c in chunks) >= 3, timeout_s=20)
    sim_admin(sims, "onprem", "POST", "/faults/unreachable", {"mode": "close"})
    try:
        # The simulator cuts watches but not open log follows (clusters/sim/server.py), so the
        # follow rides the outage out; its resume after a cut is tested in test_job_logs.py.
        with limited.client("alice") as alice, pytest.raises(grpc.RpcError) as down:
            list(alice.logs(pb.StreamLogsRequest(job_id=job_id), timeout_s=30))
        lines_before = sum(len(c.lines) for c in chunks)
    finally:
        sim_admin(sims, "onprem", "DELETE", "/faults/unreachable")
    assert down.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "cluster onprem" in (down.value.details() or "")
    wait_for(lambda: sum(len(c.lines) for c in chunks) >= lines_before + 5, timeout_s=40)
    stop.set()
    thread.join(15)
    # In time order as instants (RFC3339Nano trims zeros: as text, ...32.5Z sorts after ...32.52Z);
    # lines may share a stamp (started and command), but none comes twice.
    lines = [line for c in chunks for line in c.lines]
    stamps = [stamp_ns(line.split(" ", 1)[0]) for line in lines]
    instants = [s for s in stamps if s is not None]
    assert len(instants) == len(stamps), "every line asked with timestamps=True begins with one"
    assert instants == sorted(instants)
    assert len(lines) == len(set(lines)), "a follow must not repeat lines"
