"""End to end, issue 34: a sweep of 500 trials cannot starve another team.

One 16 x A100 cluster. vision has no guarantee and submits a grid sweep of 500 short trials (one
GPU, 3 s each) with no parallelism limit, as a user who wants it done soonest would: all 500 are
queued at once and fill the cluster by borrowing. nlp, guaranteed 8 A100s, then submits one 8-GPU
job. Its job must be admitted within one placer cycle of its guaranteed share becoming free, however
many of vision's trials are queued behind it and however their ends and the preemption the placer
orders for nlp interleave.

How it is measured, in cycles rather than seconds:

- The server counts every scheduling cycle it begins (`gpufed_scheduling_cycles_started_total` on
  /metrics), before the cycle reads anything, and each `job_admitted` log line names the number of
  the cycle that admitted the job.
- "nlp's share is free" is detected from gpufed's own job cache, the one the placer reads: the
  admin's SummarizeJobs, polled, shows vision's trials holding (placed or running) at most 16 - 8
  GPUs. The placer's own free count is the cluster's, less what placed jobs hold or are promised, so
  from this moment it can fit nlp's gang (it may see the room sooner: the cluster's inventory sees a
  trial's pod end before the trial's record does, and a job admitted before the records show the
  share free was admitted in time). Right after seeing it, the test reads the cycle count C. Every cycle numbered above C began after the share was free and saw it.
- So nlp's job must be admitted by cycle C + 1. (Reading C a little after the fact only makes C
  larger, which the assertion allows; it can never make a slow admission pass as fast by more than
  the cycles that began within one poll, a few milliseconds.)

kubectl then shows the job's pods running on the cluster, and vision still had hundreds of trials
queued behind it.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.contract.kube.kubectl import KUBECTL
from tests.e2e.harness import ServerProcess, manifest, run_cli, wait_for
from tests.e2e.kube import onprem_a100, sim_kubectl_json, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")]

CAPACITY_GPUS = 16
NLP_SHARE_GPUS = 8
TRIALS = 500
HOLDING = (pb.JOB_GROUP_ADMITTED, pb.JOB_GROUP_RUNNING)
CLUSTERS: list[dict[str, Any]] = [onprem_a100(nodes=2)]


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    config = write_config(
        tmp_path / "federation.yaml",
        sims,
        CLUSTERS,
        grace_s=8,
        policy={"defaultGracePeriodSeconds": 1},
        tenants=[
            {"name": "platform"},
            {"name": "vision"},
            {"name": "nlp", "quotas": {"A100": {"guaranteed": NLP_SHARE_GPUS}}},
        ],
        users=[
            {"name": "admin", "tenant": "platform", "role": "admin"},
            {"name": "alice", "tenant": "vision"},
            {"name": "bob", "tenant": "nlp"},
        ],
    )
    process = ServerProcess(
        etcd.endpoint, tmp_path / "state", config=config, extra_args=("--metrics-port", "0")
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def cli(fed: ServerProcess, user: str, *args: str) -> Any:
    token = fed.state_dir / "tokens" / f"{user}.token"
    return run_cli("--server", fed.target, "--token-file", str(token), *args)


def _metrics_url(fed: ServerProcess) -> str:
    for line in fed.log_text().splitlines():
        if '"server_started"' in line:
            return f"http://127.0.0.1:{json.loads(line)['metrics_port']}/metrics"
    raise AssertionError("the server logged no server_started event")


def _cycles_started(url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only
    with opener.open(url, timeout=10) as response:
        text = response.read().decode()
    found = re.search(r"^gpufed_scheduling_cycles_started_total (\S+)$", text, re.MULTILINE)
    assert found is not None, "no cycle count in /metrics"
    return int(float(found.group(1)))


def _admitted_in_cycle(fed: ServerProcess, job_id: str) -> int:
    """The cycle the server's `job_admitted` line names. Polled: the scheduler logs the line once
    its commit returns, and the job cache (which answers GetJob) can have the admission first; on a
    busy server the test read the log in between and found no line (a loaded run, r3-2)."""

    def logged() -> tuple[int] | None:
        for line in fed.log_text().splitlines():
            if '"job_admitted"' in line:
                event = json.loads(line)
                if event["job_id"] == job_id:
                    return (int(event["cycle"]),)
        return None

    (cycle,) = wait_for(logged, timeout_s=30, interval_s=0.05)
    return int(cycle)


def _gpus(summary: pb.JobSummary, tenant: str, groups: tuple[int, ...]) -> int:
    return sum(r.gpus for r in summary.rows if r.tenant == tenant and r.group in groups)


def _sweep(path: Path) -> Path:
    trial = yaml.safe_load(manifest("trial", duration="3s"))
    trial["spec"]["tasks"] = [{"name": "main", "replicas": 1, "image": "pytorch/pytorch:2.3", "gpus": 1}]
    document = {
        "apiVersion": "gpufed.io/v1",
        "kind": "Sweep",
        "metadata": {"name": "wide-sweep"},
        "spec": {
            "search": "grid",
            "parameters": {"seed": list(range(TRIALS))},
            "metric": {"name": "loss", "goal": "minimize"},
            "template": {"metadata": trial["metadata"], "spec": trial["spec"]},
        },
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_one_job_of_another_team_starts_within_one_cycle_of_its_share_becoming_free_beside_500_trials(
    fed: ServerProcess, sims: SimProcess, tmp_path: Path
) -> None:
    url = _metrics_url(fed)
    submitted = cli(fed, "alice", "submit", str(_sweep(tmp_path / "sweep.yaml")))
    assert submitted.returncode == 0, submitted.stderr
    assert f"submitted: {TRIALS} jobs" in submitted.stdout, submitted.stdout
    admin = fed.reader("admin")

    # vision's trials fill the cluster, hundreds more queued behind them.
    def cluster_full() -> bool:
        summary = admin.summarize()
        queued = _gpus(summary, "vision", (pb.JOB_GROUP_QUEUED,))
        return _gpus(summary, "vision", HOLDING) == CAPACITY_GPUS and queued > TRIALS // 2

    wait_for(cluster_full, timeout_s=60, interval_s=0.1)
    job = tmp_path / "eval.yaml"
    job.write_text(manifest("eval", workers=NLP_SHARE_GPUS - 1, gpus=1, duration="60s"))
    done = cli(fed, "bob", "submit", str(job))
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split()[0]
    bob = fed.reader("bob")

    share_free_at: int | None = None
    queued_then = 0
    deadline = time.monotonic() + 60
    while True:
        summary = admin.summarize()
        if share_free_at is None and _gpus(summary, "vision", HOLDING) <= CAPACITY_GPUS - NLP_SHARE_GPUS:
            share_free_at = _cycles_started(url)
            queued_then = _gpus(summary, "vision", (pb.JOB_GROUP_QUEUED,))
        if bob.get(job_id).phase != pb.JOB_PHASE_QUEUED:
            break
        assert time.monotonic() < deadline, "nlp's job was not admitted within 60 s"
        time.sleep(0.005)
    if share_free_at is None:
        # Admitted before the job records showed the share free. The placer counts a cluster's free
        # GPUs from its inventory, which sees a trial's pod end before gpufed's record of the trial
        # does (the reconciler notices it after): on a busy machine the placer may fit nlp while the
        # records still show vision holding 10 of the 16 GPUs (a run had 8 running and 2 admitted in
        # the cycle that admitted nlp). So nlp went in no later than the records could have said
        # its share was free: within one cycle by this test's measure, whatever the records say now.
        summary = admin.summarize()
        share_free_at = _cycles_started(url)
        queued_then = _gpus(summary, "vision", (pb.JOB_GROUP_QUEUED,))
    admitted_in = _admitted_in_cycle(fed, job_id)
    assert admitted_in <= share_free_at + 1, (admitted_in, share_free_at)
    # It overtook hundreds of trials queued before it.
    assert queued_then > TRIALS // 2, queued_then

    # The cluster's own view: the job's 8 pods run there.
    def pods_running() -> bool:
        pods = sim_kubectl_json(sims, "onprem", "get", "pods", "-A", "-l", f"gpufed.io/job-id={job_id}")
        return sum(1 for p in pods["items"] if p.get("status", {}).get("phase") == "Running") == 8

    wait_for(pods_running, timeout_s=30, interval_s=0.2)
    cancelled = cli(fed, "alice", "set", "cancel", "wide-sweep")
    assert cancelled.returncode == 0, cancelled.stderr
