"""End to end, as a user reads logs: `gpufed logs` says what `kubectl logs` says, line for line, while
a gang's pods live and after they are gone, for an attempt that succeeded, one that was preempted
and one that was cancelled (issue 30, items 2 and 3).

The simulated kubelet prints a burst of lines as a real one stamps them (`sim.gpufed.io/log-burst`):
several lines of one stamp, and stamps whose RFC3339Nano fraction is trimmed (`...05.1Z`,
`...05.12Z`). Its containers print nothing else after the burst (`logIntervalS` is an hour), so a
log read any time after the burst is the whole of it. kubectl, against the same simulated cluster,
is the judge; `gpufed logs -o json` gives each line with its pod, container and stamp.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.main import cli
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.e2e.kube import job_of, serve_clusters, sim_kubectl

pytestmark = pytest.mark.e2e

# Offsets of the burst from the first whole second of each container: equal stamps, and fractions
# the kubelet's RFC3339Nano trims (0.1 -> ".1Z", 0.12 -> ".12Z").
BURST = "0.1,0.1,0.12,0.12,0.12,0.2,0.25,0.5"
BURST_LINES = len(BURST.split(","))
SIM_ONLY = {"logIntervalS", "terminationS"}
CLUSTERS: list[dict[str, Any]] = [
    {
        "name": "onprem",
        "provider": "private",
        "region": "dc1",
        "logIntervalS": 3600,
        "pools": [
            {
                "name": "a100",
                "gpuType": "A100",
                "kind": "private",
                "usdPerGpuHour": 1.1,
                "gpusPerNode": 4,
                "nodes": 2,
            }
        ],
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
        grace_s=10,
        # vision only borrows; audio is guaranteed the whole pool, so its gang preempts one of vision's.
        policy={
            "defaultGracePeriodSeconds": 2,
            "privateWaitSecondsPerGpuHour": 0,
            "preemptionLimitGpus": 64,
            "preemptionIntervalSeconds": 600,
        },
        tenants=[
            {"name": "vision", "quotas": {"A100": {"guaranteed": 0, "borrowingLimit": 8}}},
            {"name": "audio", "quotas": {"A100": {"guaranteed": 8, "borrowingLimit": 0}}},
        ],
        users=[{"name": "alice", "tenant": "vision"}, {"name": "bob", "tenant": "audio"}],
    ) as process:
        yield process


def _job(
    name: str,
    duration: str,
    *,
    workers: int = 1,
    annotations: dict[str, str] | None = None,
    one_task: bool = False,
) -> str:
    """A master and `workers` workers; `one_task`: one task (master) of two replicas instead. Volcano ends a
    gang when its first task completes (`TaskCompleted: CompleteJob`) and deletes the others' pods:
    a worker still running when its master ends is gone before kubectl reads it. One task completes
    only when both replicas have succeeded, so its pods stay (the collector's retention) to be read."""
    text = manifest(name, workers=workers, gpus=1, duration=duration)
    if one_task:
        master = text.index("    - {name: master")
        text = text[:master] + '    - {name: master, replicas: 2, image: "pytorch/pytorch:2.3", gpus: 1}\n'
    extra = {"sim.gpufed.io/log-burst": BURST, **(annotations or {})}
    lines = "".join(f'    {k}: "{v}"\n' for k, v in extra.items())
    return text.replace("  annotations:\n", "  annotations:\n" + lines, 1)


def kubectl(sims: SimProcess, *args: str) -> str:
    return sim_kubectl(sims, "onprem", *args).stdout


def kubectl_logs(sims: SimProcess, job_id: str, attempt: int) -> dict[str, list[str]]:
    """Every pod's log of one attempt, stamped, as kubectl prints it: pod name -> lines."""
    pods = json.loads(
        kubectl(
            sims,
            "get",
            "pods",
            "-A",
            "-l",
            f"gpufed.io/job-id={job_id},gpufed.io/attempt={attempt}",
            "-o",
            "json",
        )
    )["items"]
    out = {}
    for pod in pods:
        meta = pod["metadata"]
        out[meta["name"]] = kubectl(
            sims, "logs", "-n", meta["namespace"], meta["name"], "--timestamps"
        ).splitlines()
    return out


def burst_done(sims: SimProcess, job_id: str, replicas: int) -> dict[str, list[str]] | None:
    logs = kubectl_logs(sims, job_id, 1)
    done = len(logs) == replicas and all(
        any(f"burst: line {BURST_LINES} of {BURST_LINES}" in line for line in lines)
        for lines in logs.values()
    )
    return logs if done else None


def gpufed(fed: ServerProcess, user: str, *args: str) -> tuple[int, str, str]:
    """The CLI as a user runs it, in this process (click's runner) against the live server."""
    token = fed.state_dir / "tokens" / f"{user}.token"
    result = CliRunner().invoke(cli, ["--server", fed.target, "--token-file", str(token), *args])
    return result.exit_code, result.stdout, result.stderr


def gpufed_logs(
    fed: ServerProcess, user: str, job_id: str, *args: str
) -> tuple[dict[str, list[str]], list[Any]]:
    """`gpufed logs ... -o json`: lines by pod, as "<stamp> <text>" (as kubectl --timestamps prints
    them), and the notices on stderr."""
    code, out, err = gpufed(fed, user, "logs", job_id, *args, "-o", "json")
    assert code == 0, err
    by_pod: dict[str, list[str]] = defaultdict(list)
    for line in out.splitlines():
        record = json.loads(line)
        assert record["container"] in ("master", "worker")
        by_pod[record["pod"]].append(f"{record['timestamp']} {record['text']}")
    notices = [json.loads(line) for line in err.splitlines() if line.strip()]
    return dict(by_pod), notices


def test_logs_match_kubectl_live_and_kept_for_succeeded_preempted_and_cancelled(
    fed: ServerProcess, sims: SimProcess
) -> None:
    with fed.client("alice") as alice:
        done_id = alice.submit(_job("done", "4s", one_task=True)).job_id
        first_id = alice.submit(_job("first", "300s")).job_id
        second_id = alice.submit(_job("second", "300s")).job_id
    everyone = (done_id, first_id, second_id)
    wait_for(
        lambda: all(job_of(fed, "alice", j).phase == pb.JOB_PHASE_RUNNING for j in everyone), timeout_s=20
    )

    # Live: each pod's lines as kubectl prints them, once the burst is out.
    seen = {j: wait_for(lambda j=j: burst_done(sims, j, 2), timeout_s=15) for j in everyone}
    for job_id in (first_id, second_id):
        live, _ = gpufed_logs(fed, "alice", job_id)
        assert live == seen[job_id]
    # -o yaml: the same records, one YAML document each.
    code, out, err = gpufed(fed, "alice", "-o", "yaml", "logs", first_id)
    assert code == 0, err
    records = [d for d in yaml.safe_load_all(out) if d is not None]
    by_pod: dict[str, list[str]] = defaultdict(list)
    for r in records:
        by_pod[r["pod"]].append(f"{r['timestamp']} {r['text']}")
    assert dict(by_pod) == seen[first_id]
    some_pod = seen[first_id][next(iter(seen[first_id]))]
    stamps = [line.split(" ", 1)[0] for line in some_pod]
    assert len(set(stamps)) < len(stamps), "the burst must share stamps"
    assert any(s.endswith(".1Z") for s in stamps)
    assert any(s.endswith(".12Z") for s in stamps)

    # Succeeded: its pods stay until collected; then an operator deletes the gang.
    wait_for(lambda: job_of(fed, "alice", done_id).phase == pb.JOB_PHASE_SUCCEEDED, timeout_s=20)
    seen[done_id] = kubectl_logs(sims, done_id, 1)
    assert len(seen[done_id]) == 2, seen[done_id]
    assert all(any("exited with code 0" in line for line in lines) for lines in seen[done_id].values())
    live, _ = gpufed_logs(fed, "alice", done_id)
    assert live == seen[done_id]
    kubectl(sims, "delete", "jobs.batch.volcano.sh", "-A", "-l", f"gpufed.io/job-id={done_id}", "--wait=true")

    # Preempted: audio's gang takes the room of one of vision's borrowed gangs.
    with fed.client("bob") as bob:
        bob.submit(_job("urgent", "300s", workers=5))

    def preempted() -> str | None:
        for job_id in (first_id, second_id):
            if job_of(fed, "alice", job_id).attempt > 1:
                return job_id
        return None

    preempted_id = wait_for(preempted, timeout_s=20)
    cancelled_id = second_id if preempted_id == first_id else first_id
    with fed.client("alice") as alice:
        alice.cancel(cancelled_id)
    wait_for(lambda: job_of(fed, "alice", cancelled_id).phase == pb.JOB_PHASE_CANCELLED, timeout_s=20)
    wait_for(lambda: not kubectl_logs(sims, done_id, 1), timeout_s=10)
    wait_for(lambda: not kubectl_logs(sims, preempted_id, 1), timeout_s=10)
    wait_for(lambda: not kubectl_logs(sims, cancelled_id, 1), timeout_s=10)

    # After the pods are gone: the kept copy, line for line what kubectl showed.
    for job_id in everyone:
        kept, notices = gpufed_logs(fed, "alice", job_id, "--attempt", "1")
        assert kept == seen[job_id], job_id
        cut = [n for n in notices if "kept copy cut" in n.get("notice", "")]
        # Copied while the attempt was being stopped: a visible marker says lines may be missing.
        assert bool(cut) == (job_id != done_id), (job_id, notices)

    # describe knows when each ended attempt started.
    with fed.client("alice") as alice:
        for job_id in everyone:
            first = alice.describe(job_id).attempts[0]
            assert first.started_at.seconds > 0, (job_id, first)
            assert {r.pod for r in first.replicas} == set(seen[job_id])
    code, out, _ = gpufed(fed, "alice", "describe", cancelled_id)
    assert code == 0
    assert "Started:  -" not in out

    # Another tenant cannot read the kept logs, in the same words as for a job that does not exist.
    code, _, theirs = gpufed(fed, "bob", "logs", preempted_id, "--attempt", "1")
    assert code != 0
    assert f"job '{preempted_id}' not found" in theirs
    code, _, missing = gpufed(fed, "bob", "logs", "nope-00000000")
    assert theirs.replace(preempted_id, "nope-00000000") == missing


def test_an_attempt_without_logs_says_why_and_fails(fed: ServerProcess, sims: SimProcess) -> None:
    """Containers that never started wrote nothing: `logs` says so, with a non-zero exit, in the
    chosen format."""
    with fed.client("alice") as alice:
        job_id = alice.submit(
            _job("nopull", "5s", annotations={"sim.gpufed.io/fail-image-pull": "true"})
        ).job_id
        wait_for(lambda: job_of(fed, "alice", job_id).reason == "ImagePullBackOff", timeout_s=20)
        alice.cancel(job_id)
    wait_for(lambda: job_of(fed, "alice", job_id).phase == pb.JOB_PHASE_CANCELLED, timeout_s=20)
    code, out, err = gpufed(fed, "alice", "logs", job_id, "--attempt", "1")
    assert code != 0
    assert out == ""
    assert "no logs kept" in err
    assert "never started" in err
    # Under -o json the error is one JSON object (on stderr, as for every command), stdout empty.
    code, out, err = gpufed(fed, "alice", "-o", "json", "logs", job_id, "--attempt", "1")
    assert code != 0
    assert out == ""
    error = json.loads(err)["error"]
    assert error["code"] == "NOT_FOUND"
    assert "never started" in error["message"]


def test_an_attempt_evicted_by_a_drain_keeps_its_logs(fed: ServerProcess, sims: SimProcess) -> None:
    """An operator drains the node under a running gang (`kubectl drain`): the cluster evicts its
    pods, and the attempt ends without gpufed having stopped it. Its logs are kept all the same."""
    with fed.client("alice") as alice:
        job_id = alice.submit(_job("drained", "300s")).job_id
    wait_for(lambda: job_of(fed, "alice", job_id).phase == pb.JOB_PHASE_RUNNING, timeout_s=20)
    seen = wait_for(lambda: burst_done(sims, job_id, 2), timeout_s=15)
    live, _ = gpufed_logs(fed, "alice", job_id)
    assert live == seen
    nodes = json.loads(kubectl(sims, "get", "pods", "-A", "-l", f"gpufed.io/job-id={job_id}", "-o", "json"))
    for node in sorted({p["spec"]["nodeName"] for p in nodes["items"]}):
        kubectl(sims, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=20s")
    wait_for(lambda: job_of(fed, "alice", job_id).attempt > 1, timeout_s=20)
    wait_for(lambda: not kubectl_logs(sims, job_id, 1), timeout_s=10)
    kept, notices = gpufed_logs(fed, "alice", job_id, "--attempt", "1")
    assert kept == seen
    # Read as the pods were killed: a visible marker says lines written after may be missing.
    assert {n["pod"] for n in notices if "kept copy cut" in n.get("notice", "")} == set(seen)
    with fed.client("alice") as alice:
        first = alice.describe(job_id).attempts[0]
    assert first.started_at.seconds > 0
    assert {r.pod for r in first.replicas} == set(seen)
