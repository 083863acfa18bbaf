"""A crash loses no accepted job and runs no gang twice.

The server is SIGKILLed while jobs are queued and running, then started again on the same etcd (one
member, and a three-member cluster).
The simulated clusters keep a journal of every gang they created, like a real cluster outlives its
control plane; the test reads it to prove no job's attempt was started twice.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from federation.api.client import GpufedClient
from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.etcd_cluster import EtcdCluster

pytestmark = pytest.mark.e2e


def _dispatches(state_dir: Path) -> Counter[tuple[str, int]]:
    counts: Counter[tuple[str, int]] = Counter()
    for journal in (state_dir / "clusters").glob("*.journal"):
        for line in journal.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from the kill
            if record.get("op") == "dispatch":
                counts[(record["job_id"], int(record["attempt"]))] += 1
    return counts


DURATION = "4s"


@pytest.mark.parametrize("kill_after_s", [0.0, 1.0], ids=["kill-at-first-start", "kill-mid-run"])
def test_sigkill_with_jobs_queued_and_running_loses_nothing_and_runs_nothing_twice(
    any_etcd: EtcdProcess | EtcdCluster, tmp_path: Path, kill_after_s: float
) -> None:
    server = ServerProcess(any_etcd.endpoint, tmp_path / "state")
    server.start()
    try:
        with server.client("alice") as alice, server.client("bob") as bob:
            # 16 A100 on onprem, 8 H100 on cloud: 12 gangs of 4 GPUs cannot all run at once. Each
            # runs 4 s: the second half is queued until the first ends, and the kill below must land
            # while it still is (at 2 s, the sleep and the reads before the kill could outlast the
            # first half on a busy machine, and the second was admitted already).
            accepted = []
            for i in range(8):
                accepted.append(
                    alice.submit(manifest(f"a{i}", gpus=2, duration=DURATION), idempotency_key=f"a{i}").job_id
                )
            for i in range(4):
                accepted.append(
                    bob.submit(
                        manifest(f"b{i}", gpus=2, gpu="H100", duration=DURATION), idempotency_key=f"b{i}"
                    ).job_id
                )
            # Kill once gangs run (capacity is 24 GPUs for 48 asked, so others are still queued).
            wait_for(
                lambda: any(_phase(alice, bob, j) == pb.JOB_PHASE_RUNNING for j in accepted), timeout_s=30
            )
            time.sleep(kill_after_s)
            # At once after a read that saw both: gangs running and jobs still queued.
            phases = wait_for(
                lambda: (
                    (c := Counter(_phase(alice, bob, j) for j in accepted))[pb.JOB_PHASE_RUNNING] > 0
                    and c[pb.JOB_PHASE_QUEUED] > 0
                    and c
                ),
                timeout_s=30,
            )
        server.kill()
        # Submissions acknowledged before the kill survive it; idempotent retries after the restart
        # find the same jobs rather than new ones.
        server.start()
        with server.client("alice") as alice, server.client("bob") as bob, server.client("admin") as admin:
            again = alice.submit(manifest("a0", gpus=2, duration=DURATION), idempotency_key="a0")
            assert not again.created
            assert again.job_id == accepted[0]
            wait_for(
                lambda: all(
                    j.phase == pb.JOB_PHASE_SUCCEEDED for j in admin.list_all() if j.job_id in accepted
                ),
                timeout_s=60,
            )
            jobs = {j.job_id: j for j in admin.list_all()}
    finally:
        server.stop()
    assert set(accepted) <= set(jobs), "an accepted job was lost"
    assert len(jobs) == len(accepted), "a job was created twice"
    dispatches = _dispatches(tmp_path / "state")
    assert all(count == 1 for count in dispatches.values()), f"a gang was started twice: {dispatches}"
    assert {job_id for job_id, _ in dispatches} == set(accepted)
    assert all(j.attempt == 1 for j in jobs.values())
    # The kill really did land with work in flight: some gangs running, some jobs still queued.
    assert phases[pb.JOB_PHASE_RUNNING] > 0, phases
    assert phases[pb.JOB_PHASE_QUEUED] > 0, phases


def _phase(alice: GpufedClient, bob: GpufedClient, job_id: str) -> pb.JobPhase.ValueType:
    """The job's phase, asked as its own tenant (the other one gets NOT_FOUND)."""
    for client in (alice, bob):
        try:
            return client.get(job_id).phase
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.NOT_FOUND:
                raise
    raise AssertionError(f"job {job_id} not found by either tenant")
