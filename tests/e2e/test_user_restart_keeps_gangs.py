"""Issue 30, item 14: restarting `gpufed up` (SIGTERM, or SIGKILL) costs no running job anything.

The simulated clusters keep their state across the restart (`clusters.sim.persist`), as a real cluster
keeps running while its control plane restarts: after the restart the same pods are there (kubectl is
the judge: same uids and start times), no attempt is charged, a `maxRetries: 0` job finishes
SUCCEEDED, and the ledger holds one interval per job, opened before the restart and closed once.
The simulator SIGKILLed alone stops `gpufed up` with exit code 1 and a message saying why; the next
start finds the clusters where they were.

Driven as a user drives it: `python -m federation up` as a process of its own (`Up`), jobs and the
ledger over gRPC as the tenant's member, pods through the real kubectl on the simulator's kubeconfig.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
import yaml

from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.embedded import default_config_path
from tests.contract.kube.kubectl import KUBECTL
from tests.e2e.harness import manifest, wait_for
from tests.e2e.test_up_crash import Up, processes_mentioning

pytestmark = pytest.mark.e2e

NO_RETRY = "  restartPolicy: {onFailure: AbortJob, onEviction: AbortJob, maxRetries: 0}\n"
RETRIES = "  restartPolicy: {onFailure: RestartJob, onEviction: RestartJob, maxRetries: 3}\n"


class Federation:
    """One `gpufed up` for the module, started again whenever a test left it stopped."""

    def __init__(self, up: Up) -> None:
        self.up = up
        self.start_s = 0.0

    def running(self) -> Up:
        proc = self.up.proc
        if proc is None or proc.poll() is not None:
            self.start()
        return self.up

    def start(self) -> None:
        """Start `gpufed up`, timing it: the next test's jobs must outlast a restart as slow."""
        began = time.monotonic()
        self.up.start()
        self.start_s = max(self.start_s, time.monotonic() - began)

    def job_duration_s(self) -> float:
        """Long enough to run through a restart (a stop, then as long as the slowest start so far:
        beside stress-ng a restart outlasted 1.5 times the module's first start, and a gang ended
        during it), short enough to end within the test."""
        return max(8.0, 1.5 * self.start_s + 4)


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    root = tmp_path_factory.mktemp("restart")
    federation = yaml.safe_load(default_config_path().read_text())
    # The history database: SQLite under the state dir (the default's may name one by environment).
    federation.pop("history", None)
    config = root / "federation.yaml"
    config.write_text(yaml.safe_dump(federation, sort_keys=False))
    up = Up(root / "state", config)
    instance = Federation(up)
    try:
        # Started here, so that the first test's time is its restart's, not also the first start's
        # (that made it the suite's slowest, 31 s on a busy machine).
        instance.running()
        yield instance
    finally:
        up.stop()
        for pid in processes_mentioning(str(up.state_dir)):
            os.kill(pid, signal.SIGKILL)


def _pods(up: Up, job_ids: set[str]) -> dict[str, tuple[str, str, str]]:
    """name -> (uid, startTime, phase) of the jobs' pods, on every simulated cluster, by kubectl."""
    kubeconfig = up.state_dir / "sim" / "kubeconfig"
    contexts = [c["name"] for c in yaml.safe_load(kubeconfig.read_text())["contexts"]]
    found = {}
    for context in contexts:
        got = subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(kubeconfig), "--context", context,
             "get", "pods", "--all-namespaces", "-l", "gpufed.io/job-id", "-o", "json"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert got.returncode == 0, got.stderr[-2000:]
        for pod in json.loads(got.stdout)["items"]:
            if pod["metadata"]["labels"]["gpufed.io/job-id"] in job_ids:
                status = pod.get("status") or {}
                found[pod["metadata"]["name"]] = (
                    pod["metadata"]["uid"],
                    status.get("startTime", ""),
                    status.get("phase", ""),
                )
    return found


def _snapshotted_running(up: Up) -> set[str]:
    """The uids of the pods the simulator's snapshots (`<state-dir>/sim/state/`) hold as running."""
    uids = set()
    for path in (up.state_dir / "sim" / "state").glob("*.json"):
        try:
            objects = json.loads(path.read_text())["objects"]
        except (OSError, ValueError):
            continue
        uids |= {
            o["object"]["metadata"]["uid"]
            for o in objects
            if o["type"] == "/pods" and (o["object"].get("status") or {}).get("phase") == "Running"
        }
    return uids


def _identities(pods: dict[str, tuple[str, str, str]]) -> dict[str, tuple[str, str]]:
    return {name: (uid, started) for name, (uid, started, _phase) in pods.items()}


def _submit_two(up: Up, duration_s: float, tag: str) -> tuple[str, str]:
    with up.client("alice") as alice:
        once = alice.submit(manifest(f"once-{tag}", duration=f"{duration_s:.0f}s", extra_spec=NO_RETRY))
        again = alice.submit(manifest(f"again-{tag}", duration=f"{duration_s:.0f}s", extra_spec=RETRIES))
        ids = (once.job_id, again.job_id)
        wait_for(
            lambda: all(alice.get(j).phase == pb.JOB_PHASE_RUNNING for j in ids), timeout_s=20, interval_s=0.1
        )
        # Both gangs' pods run (two each: a master and a worker).
        wait_for(
            lambda: [p[2] for p in _pods(up, set(ids)).values()] == ["Running"] * 4,
            timeout_s=10,
            interval_s=0.2,
        )
    return ids


def _restart_costs_nothing(fed: Federation, stop: str) -> None:
    up = fed.running()
    duration_s = fed.job_duration_s()
    ids = _submit_two(up, duration_s, stop)
    with up.client("alice") as alice:
        attempts = {j: alice.get(j).attempt for j in ids}
        before = _pods(up, set(ids))
    assert len(before) == 4, before

    if stop == "sigterm":
        up.stop()
    else:
        # A SIGKILL loses what the clusters' last snapshot (at most 0.2 s old) does not hold yet.
        uids = {uid for uid, _started, _phase in before.values()}
        wait_for(lambda: _snapshotted_running(up) >= uids, timeout_s=5, interval_s=0.05)
        up.sigkill()
    wait_for(lambda: not processes_mentioning(str(up.state_dir)), timeout_s=20, interval_s=0.05)
    fed.start()

    # The same pods: the restart reached neither the pods nor their start times.
    after = _pods(up, set(ids))
    assert _identities(after) == _identities(before), (before, after)
    assert {p[2] for p in after.values()} <= {"Running", "Succeeded"}, after
    with up.client("alice") as alice:
        assert {j: alice.get(j).attempt for j in ids} == attempts
        wait_for(
            lambda: all(alice.get(j).phase == pb.JOB_PHASE_SUCCEEDED for j in ids),
            timeout_s=duration_s + 10,
            interval_s=0.2,
        )
        for job_id in ids:
            job = alice.get(job_id)
            assert job.attempt == attempts[job_id], job
        # One interval per job: the attempt that ran through the restart, charged once.
        intervals = [i for i in alice.ledger().intervals if i.job_id in ids]
    assert sorted((i.job_id, i.attempt) for i in intervals) == sorted(attempts.items()), intervals
    for interval in intervals:
        assert interval.HasField("end"), interval
        assert interval.end.ToSeconds() - interval.start.ToSeconds() >= duration_s - 2, interval


def test_a_sigterm_restart_of_gpufed_up_keeps_every_running_gang(fed: Federation) -> None:
    _restart_costs_nothing(fed, "sigterm")


def test_a_sigkill_restart_of_gpufed_up_keeps_every_running_gang(fed: Federation) -> None:
    _restart_costs_nothing(fed, "sigkill")


def test_the_simulator_killed_alone_stops_gpufed_up_saying_why_and_a_start_finds_its_pods(
    fed: Federation,
) -> None:
    up = fed.running()
    duration_s = fed.job_duration_s()
    ids = _submit_two(up, duration_s, "simkill")
    with up.client("alice") as alice:
        attempts = [alice.get(j).attempt for j in ids]
    before = _pods(up, set(ids))
    assert len(before) == 4, before
    # A SIGKILL loses what the clusters' last snapshot (at most 0.2 s old) does not hold yet.
    uids = {uid for uid, _started, _phase in before.values()}
    wait_for(lambda: _snapshotted_running(up) >= uids, timeout_s=5, interval_s=0.05)
    sim_pid = json.loads((up.state_dir / "sim" / "sim.pid").read_text())["pid"]
    os.kill(sim_pid, signal.SIGKILL)
    assert up.proc is not None
    assert up.proc.wait(timeout=30) == 1
    stderr = up.stderr_path.read_text()
    assert "the simulated clusters' process exited with code -9" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    fed.start()
    assert _identities(_pods(up, set(ids))) == _identities(before)
    with up.client("alice") as alice:
        wait_for(
            lambda: all(alice.get(j).phase == pb.JOB_PHASE_SUCCEEDED for j in ids),
            timeout_s=duration_s + 10,
            interval_s=0.2,
        )
        assert [alice.get(j).attempt for j in ids] == attempts
