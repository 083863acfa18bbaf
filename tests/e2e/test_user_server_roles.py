"""`gpufed serve --role` from the operator's side (issue 30, item 15): an `api` server and a
`scheduler` server on one real etcd, over a simulated Kubernetes cluster both reach by kubeconfig.

The `api` server is started first and alone, and stays up throughout: it never writes the leader key
(etcd's own record of every write to it, an `etcdctl watch` opened before the api server started, is
the judge), its /metrics counts no scheduling cycle, and it is ready without a leader. Jobs submitted
through it are scheduled by the `scheduler` server (which holds the key, etcdctl says) and run on the
cluster (kubectl says). With the scheduler killed (SIGKILL, as a node dies), the api server goes on
serving reads and accepting submissions, and the scheduler's return schedules what waited; through
all of it, another tenant sees nothing of alice's jobs through the api server.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest

from datasync.loopback_ports import free_port
from federation.api.client import GpufedClient
from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess, etcdctl_binary
from federation.runtime.sim_process import SimProcess
from federation.store.job_store import LEADER_KEY
from tests.e2e.harness import ServerProcess, manifest, run_cli, wait_for
from tests.e2e.kube import onprem_a100, sim_kubectl_json, write_config
from tests.etcdctl import endpoint_status, etcdctl

pytestmark = pytest.mark.e2e

CLUSTERS: list[dict[str, Any]] = [onprem_a100(nodes=1)]
USERS = [
    {"name": "admin", "tenant": "platform", "role": "admin"},
    {"name": "alice", "tenant": "vision", "role": "member"},
    {"name": "bob", "tenant": "nlp", "role": "member"},
]
# A killed scheduler's key outlives it by the lease: 2 s (etcd's least) rather than the default 5.
LEASE_TTL_S = "2"
LEADER = LEADER_KEY.decode()


def _leader(etcd: EtcdProcess) -> str:
    return etcdctl(etcd.endpoint, "get", LEADER, "--print-value-only").stdout.strip()


def _http(server: ServerProcess, path: str) -> tuple[int, str]:
    """GET on the server's HTTP port (its port from the `server_started` log line): status and body."""
    port = next(
        json.loads(line)["metrics_port"]
        for line in server.current_log().splitlines()
        if '"server_started"' in line
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only
    try:
        with opener.open(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()


def _metric(server: ServerProcess, name: str) -> float:
    status, text = _http(server, "/metrics")
    assert status == 200
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert found is not None, f"no {name} in /metrics"
    return float(found.group(1))


def _leader_writes(watch: subprocess.Popen[str]) -> list[str]:
    """Every value written to the leader key since the watch's revision (deletes as '')."""
    watch.terminate()
    out, _ = watch.communicate(timeout=10)
    values = []
    for line in out.splitlines():
        for event in json.loads(line).get("Events") or []:
            values.append(base64.b64decode(event["kv"].get("value", "")).decode())
    return values


def _phase(client: GpufedClient, job_id: str) -> int:
    return int(client.get(job_id).phase)


def _pods_of(sims: SimProcess, job_id: str) -> list[str]:
    """The job's pods on the cluster, as kubectl lists them."""
    found = sim_kubectl_json(sims, "onprem", "get", "pods", "-A", "-l", f"gpufed.io/job-id={job_id}")
    return [item["metadata"]["name"] for item in found["items"]]


def test_an_api_server_never_leads_its_jobs_run_by_the_scheduler_and_it_serves_without_one(
    etcd: EtcdProcess, sims: SimProcess, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "federation.yaml",
        sims,
        CLUSTERS,
        grace_s=30,
        tenants=[{"name": "platform"}, {"name": "vision"}, {"name": "nlp"}],
        users=USERS,
    )
    common = ("--lease-ttl-s", LEASE_TTL_S, "--metrics-port", "0")
    api = ServerProcess(
        etcd.endpoint, tmp_path / "api", config=config, identity="api", extra_args=("--role", "api", *common)
    )
    scheduler = ServerProcess(
        etcd.endpoint,
        tmp_path / "scheduler",
        config=config,
        identity="scheduler",
        extra_args=("--role", "scheduler", *common),
    )
    # etcd's record of every write to the leader key from now on, whenever the watch opens.
    since = endpoint_status(etcd.endpoint).revision + 1
    watch = subprocess.Popen(
        [
            str(etcdctl_binary()),
            f"--endpoints={etcd.endpoint}",
            "watch",
            LEADER,
            f"--rev={since}",
            "-w",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        api.start()
        # The api server bootstrapped the config first, so the users' tokens are in its state dir.
        alice, bob = api.client("alice"), api.client("bob")

        # Alone: ready (no leader to wait for), reads and submissions answered, no election.
        status, why = _http(api, "/readyz")
        assert (status, why) == (200, "ready: api, no leader: submissions wait for one\n")
        first = alice.submit(manifest("first", duration="1s")).job_id
        assert _phase(alice, first) == pb.JOB_PHASE_QUEUED
        assert [j.job_id for j in alice.list_all()] == [first]
        assert _leader(etcd) == ""
        assert _metric(api, "gpufed_leader") == 0
        assert _metric(api, "gpufed_scheduling_cycles_started_total") == 0

        # The scheduler takes the free key at once, and runs what the api server accepted.
        scheduler.start()
        wait_for(lambda: _leader(etcd) == "scheduler-1", timeout_s=30)
        wait_for(lambda: _phase(alice, first) == pb.JOB_PHASE_SUCCEEDED, timeout_s=60)
        assert _pods_of(sims, first), "kubectl lists no pod of the job the scheduler ran"
        assert _metric(scheduler, "gpufed_scheduling_cycles_started_total") > 0
        assert _metric(api, "gpufed_scheduling_cycles_started_total") == 0
        assert _http(api, "/readyz") == (200, "ready: api, leader scheduler-1\n")

        # The scheduler dies; once its lease has run out there is no leader at all.
        scheduler.kill()
        wait_for(lambda: _leader(etcd) == "", timeout_s=30)
        assert _http(api, "/readyz") == (200, "ready: api, no leader: submissions wait for one\n")
        assert _phase(alice, first) == pb.JOB_PHASE_SUCCEEDED
        second = alice.submit(manifest("second", duration="1s")).job_id
        assert _phase(alice, second) == pb.JOB_PHASE_QUEUED
        assert {j.job_id for j in alice.list_all()} == {first, second}

        # Back, it leads again (the key was free all along) and runs what waited.
        scheduler.start()
        wait_for(lambda: _leader(etcd) == "scheduler-2", timeout_s=30)
        wait_for(lambda: _phase(alice, second) == pb.JOB_PHASE_SUCCEEDED, timeout_s=60)
        assert _pods_of(sims, second)
        assert _metric(api, "gpufed_leader") == 0
        assert _metric(api, "gpufed_scheduling_cycles_started_total") == 0
        assert "leader_elected" not in api.log_text()
        # Its history is its own SQLite file here, which no leader archives into: it says so.
        assert "api_server_reads_a_local_history" in api.log_text()
        assert "api_server_reads_a_local_history" not in scheduler.log_text()

        # Another tenant, through the api server, learns nothing of alice's jobs; no token, no answer.
        assert [j.job_id for j in bob.list_all()] == []
        for job_id in (first, second):
            with pytest.raises(grpc.RpcError) as refused:
                bob.get(job_id)
            assert refused.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED)
        with GpufedClient(api.target, "not-a-token") as stranger, pytest.raises(grpc.RpcError) as refused:
            stranger.list_all()
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    finally:
        scheduler.stop()
        api.stop()
        writes = _leader_writes(watch)
    # Only the scheduler ever held the key (two terms; '' is a lease's expiry or a resignation).
    assert {w for w in writes if w} == {"scheduler-1", "scheduler-2"}, writes


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_bad_role_is_refused_naming_it_and_the_roles(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["serve", "--etcd", f"http://127.0.0.1:{free_port()}"]
    if how == "flag":
        args += ["--role", "leader"]
    else:
        monkeypatch.setenv("GPUFED_SERVER_ROLE", "leader")
    done = run_cli(*args, timeout_s=30)
    assert done.returncode == 2, done.stderr
    assert "Invalid value for '--role': 'leader' is not one of 'all', 'api', 'scheduler'" in done.stderr
