"""Seeded chaos on member clusters that other people touch, judged from the clusters' own pods.

While jobs of two tenants run through `gpufed serve` on two simulated clusters (as `gpufed up` runs
them), third parties act at random with the real kubectl: they delete gpufed's namespaces, orphan and
delete gang objects, delete pods, cordon, drain, taint, label and delete nodes, and run their own GPU
pods and Jobs (some suspended and resumed). Afterwards, from a pod watch opened before anything ran
and from the clusters' own nodes:

- every job succeeded or failed by its restart policy;
- no job ever had two attempts' pods running at once;
- attempts per job stay within its retries plus a bounded number of backed-off federation retries;
- ledger intervals match the pods' lifetimes within a second;
- the free GPUs gpufed reports match the nodes' own view.

The chaos runs in four rounds of 7.5 s, each a test case of its own with its own seed and its own
federation: thirty seconds of chaos in all, as when it ran as one round, with the jobs' run times
scaled to a round's length. The seed is printed; `GPUFED_CHAOS_SEED=N` replays the round of seed N
alone.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, manifest, wait_for
from tests.e2e.kube import PodLife, PodRecorder, job_of, onprem_a100, serve_clusters

pytestmark = pytest.mark.e2e

KUBECTL = shutil.which(
    "kubectl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
)

CLUSTERS: list[dict[str, Any]] = [
    onprem_a100(nodes=4),
    {
        "name": "cloud",
        "provider": "aws",
        "region": "us-east-1",
        "pools": [
            {
                "name": "a100-od",
                "gpuType": "A100",
                "kind": "on_demand",
                "usdPerGpuHour": 2.7447,
                "gpusPerNode": 8,
                "nodes": 3,
            }
        ],
    },
]
TENANTS = [{"name": "platform"}, {"name": "vision"}, {"name": "nlp"}]
USERS = [
    {"name": "admin", "tenant": "platform", "role": "admin"},
    {"name": "fin", "tenant": "platform", "role": "finance"},
    {"name": "alice", "tenant": "vision"},
    {"name": "bob", "tenant": "nlp"},
]
POLICY = {"defaultGracePeriodSeconds": 1, "privateWaitSecondsPerGpuHour": 0}
MAX_RETRIES = 3
RESTART = f"  restartPolicy: {{onFailure: AbortJob, onEviction: RestartJob, maxRetries: {MAX_RETRIES}}}\n"
# Attempts the federation may add on its own errors (refused dispatches, lost clusters), backed off.
FEDERATION_RETRY_BOUND = 6
# Two waves of jobs that run through the chaos, not before it.
JOBS_PER_WAVE = 6
# A round of chaos, and how long each job's pods run when nothing hits them (whole seconds, least
# and most): a quarter to a half of a round, as 8-16 s jobs were to the 30 s of chaos when it ran as one
# round, so that jobs of both waves are running, and being hit, all through the round.
CHAOS_S = 7.5
JOB_S = (2, 4)
# One round per seed; thirty seconds of chaos in all. `GPUFED_CHAOS_SEED=N` runs the round of seed N.
SEEDS = (
    [int(os.environ["GPUFED_CHAOS_SEED"])]
    if os.environ.get("GPUFED_CHAOS_SEED")
    else [20261125, 20261126, 20261127, 20261128]
)
# A pod's end is taken when its deletion is seen, so overlaps shorter than a watch delivery are noise.
OVERLAP_TOLERANCE_S = 0.25
LEDGER_TOLERANCE_S = 1.0


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with serve_clusters(
        etcd, tmp_path, sims, CLUSTERS, grace_s=6, policy=POLICY, tenants=TENANTS, users=USERS
    ) as process:
        yield process


class ThirdParty:
    """Another team and the cluster's operators, acting with the real kubectl on one cluster."""

    def __init__(self, sims: SimProcess, cluster: str, rng: random.Random, cache: Path) -> None:
        assert KUBECTL is not None
        self.cluster = cluster
        self.rng = rng
        self.base = [
            KUBECTL,
            "--kubeconfig",
            str(sims.kubeconfig),
            "--context",
            cluster,
            "--cache-dir",
            str(cache),
        ]
        self.log: list[str] = []
        self.deleted_nodes: set[str] = set()
        # Nodes this party cordoned (a drain does) or tainted: the ones its operators heal after.
        self.cordoned: set[str] = set()
        self.tainted: set[str] = set()
        self.foreign = 0

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*self.base, "--request-timeout=15s", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        self.log.append(f"{self.cluster}: kubectl {' '.join(args)} -> {result.returncode}")
        return result

    def _items(self, *args: str) -> list[dict[str, Any]]:
        result = self.kubectl("get", *args, "-o", "json")
        if result.returncode != 0:
            return []
        items: list[dict[str, Any]] = json.loads(result.stdout)["items"]
        return items

    def nodes(self) -> list[str]:
        return sorted(n["metadata"]["name"] for n in self._items("nodes"))

    def gangs(self) -> list[tuple[str, str]]:
        """gpufed's gangs that are running now: the ones whose loss hurts."""
        return [
            (g["metadata"]["namespace"], g["metadata"]["name"])
            for g in self._items("jobs.batch.volcano.sh", "-A", "-l", "gpufed.io/job-id")
            if (g.get("status") or {}).get("state", {}).get("phase") == "Running"
        ]

    def gang_pods(self) -> list[tuple[str, str]]:
        return [
            (p["metadata"]["namespace"], p["metadata"]["name"])
            for p in self._items("pods", "-A", "-l", "gpufed.io/job-id")
            if (p.get("status") or {}).get("phase") == "Running"
        ]

    # The acts, each picked at random.
    def delete_namespace(self) -> None:
        tenant = self.rng.choice(["vision", "nlp"])
        self.kubectl("delete", "namespace", f"gpufed-{tenant}", "--wait=false")

    def orphan_gang(self) -> None:
        if gangs := self.gangs():
            ns, name = self.rng.choice(gangs)
            self.kubectl(
                "delete", "jobs.batch.volcano.sh", name, "-n", ns, "--cascade=orphan", "--wait=false"
            )

    def delete_gang(self) -> None:
        if gangs := self.gangs():
            ns, name = self.rng.choice(gangs)
            self.kubectl("delete", "jobs.batch.volcano.sh", name, "-n", ns, "--wait=false")

    def delete_pod(self) -> None:
        if pods := self.gang_pods():
            ns, name = self.rng.choice(pods)
            self.kubectl("delete", "pod", name, "-n", ns, "--wait=false")

    def drain(self) -> None:
        if nodes := self.nodes():
            node = self.rng.choice(nodes)
            self.cordoned.add(node)  # cordoned first, even when the eviction then times out
            self.kubectl(
                "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=20s"
            )

    def uncordon(self) -> None:
        if nodes := self.nodes():
            node = self.rng.choice(nodes)
            if self.kubectl("uncordon", node).returncode == 0:
                self.cordoned.discard(node)

    def taint(self) -> None:
        if nodes := self.nodes():
            node = self.rng.choice(nodes)
            self.tainted.add(node)
            self.kubectl("taint", "nodes", node, "chaos=1:NoSchedule", "--overwrite")

    def label(self) -> None:
        if nodes := self.nodes():
            self.kubectl(
                "label",
                "nodes",
                self.rng.choice(nodes),
                f"chaos/mark={self.rng.randint(0, 9)}",
                "--overwrite",
            )

    def delete_node(self) -> None:
        # At most one node per cluster: the gangs must still fit somewhere.
        nodes = self.nodes()
        if self.deleted_nodes or len(nodes) < 3:
            return
        node = self.rng.choice(nodes)
        if self.kubectl("delete", "node", node, "--wait=false").returncode == 0:
            self.deleted_nodes.add(node)

    def foreign_pod(self) -> None:
        self.foreign += 1
        self.kubectl("create", "namespace", "other-team")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"notebook-{self.foreign}", "annotations": {"sim.gpufed.io/duration": "5s"}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {"name": "nb", "image": "jupyter:latest", "resources": {"limits": {"nvidia.com/gpu": 2}}}
                ],
            },
        }
        self.kubectl("apply", "-n", "other-team", "-f", "-", stdin=json.dumps(pod))

    def foreign_job(self) -> None:
        self.foreign += 1
        self.kubectl("create", "namespace", "other-team")
        suspended = self.rng.random() < 0.5
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"etl-{self.foreign}"},
            "spec": {
                "parallelism": 2,
                "completions": 2,
                "suspend": suspended,
                "template": {
                    "metadata": {"annotations": {"sim.gpufed.io/duration": "4s"}},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {"name": "etl", "image": "etl:1", "resources": {"limits": {"nvidia.com/gpu": 1}}}
                        ],
                    },
                },
            },
        }
        self.kubectl("apply", "-n", "other-team", "-f", "-", stdin=json.dumps(job))
        if suspended:
            self.kubectl(
                "patch",
                "job",
                f"etl-{self.foreign}",
                "-n",
                "other-team",
                "--type=merge",
                "-p",
                '{"spec":{"suspend":false}}',
            )

    def acts(self) -> list[Callable[[], None]]:
        return [
            self.delete_namespace,
            self.delete_namespace,
            self.orphan_gang,
            self.orphan_gang,
            self.orphan_gang,
            self.delete_gang,
            self.delete_pod,
            self.delete_pod,
            self.drain,
            self.uncordon,
            self.taint,
            self.label,
            self.delete_node,
            self.foreign_pod,
            self.foreign_job,
        ]

    def heal(self) -> None:
        """The operators put their nodes back: uncordoned, untainted (deleted nodes stay deleted).
        Only the nodes this party cordoned or tainted: a kubectl call takes a few tenths of a
        second, and two for every node took about 2 s of each run."""
        for node in sorted(self.cordoned - self.deleted_nodes):
            self.kubectl("uncordon", node)
        for node in sorted(self.tainted - self.deleted_nodes):
            self.kubectl("taint", "nodes", node, "chaos-")


def _wait_terminal(fed: ServerProcess, owners: dict[str, str], timeout_s: float) -> dict[str, pb.Job]:
    """Every job once all have ended; otherwise a failure that shows where the others are stuck."""
    done = {pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED}
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = {job_id: job_of(fed, user, job_id) for job_id, user in owners.items()}
        stuck = {job_id: j for job_id, j in jobs.items() if j.phase not in done}
        if not stuck:
            return jobs
        if time.monotonic() > deadline:
            lines = [
                f"{job_id}: {pb.JobPhase.Name(j.phase)} attempt {j.attempt}, {len(j.events)} events, last: "
                + "; ".join(e.reason for e in j.events[-3:])
                for job_id, j in stuck.items()
            ]
            raise AssertionError(f"{len(stuck)} jobs never ended:\n" + "\n".join(lines))
        time.sleep(0.5)


def _overlaps(lives: dict[tuple[str, int], list[PodLife]]) -> list[str]:
    """Pairs of pods of one job, from different attempts, that surely held GPUs at the same time.

    A pod's startTime is whole seconds, so it may have started up to a second after the time
    recorded; its end is taken when its deletion or termination is seen, which is never early. The
    overlap counted is the least the times allow, less a watch delivery's delay."""
    by_job: dict[str, list[PodLife]] = defaultdict(list)
    for (job_id, _), pods in lives.items():
        by_job[job_id].extend(p for p in pods if p.start_s is not None)

    def latest_start(p: PodLife) -> float:
        assert p.start_s is not None
        return p.start_s + 1.0 if float(p.start_s).is_integer() else p.start_s

    found = []
    for job_id, pods in by_job.items():
        for a in pods:
            for b in pods:
                if a.attempt >= b.attempt:
                    continue
                a_end = a.end_s if a.end_s is not None else float("inf")
                b_end = b.end_s if b.end_s is not None else float("inf")
                overlap = min(a_end, b_end) - max(latest_start(a), latest_start(b))
                if overlap > OVERLAP_TOLERANCE_S:
                    found.append(
                        f"{job_id}: {a.name}@{a.cluster} and {b.name}@{b.cluster} overlap {overlap:.2f}s"
                    )
    return found


def _within(ledger_s: float, pod_s: float) -> bool:
    """The ledger's time within a second of the pod's. A pod's startTime and finishedAt are whole
    seconds (RFC 3339 without fractions), so the true time lies in [pod_s, pod_s + 1)."""
    if float(pod_s).is_integer():
        return pod_s - LEDGER_TOLERANCE_S <= ledger_s < pod_s + 1 + LEDGER_TOLERANCE_S
    return abs(ledger_s - pod_s) <= LEDGER_TOLERANCE_S


def _node_view_free(sims: SimProcess, cluster: str) -> int:
    """Free GPUs as the cluster's own nodes and pods say: allocatable minus what live pods request."""
    api = k8s_config.new_client_from_config(config_file=str(sims.kubeconfig), context=cluster)
    with api:
        core = k8s.CoreV1Api(api)
        nodes = core.list_node().items
        pods = core.list_pod_for_all_namespaces().items
    used: dict[str, int] = defaultdict(int)
    for pod in pods:
        if pod.spec.node_name and pod.status.phase in ("Pending", "Running"):
            for c in pod.spec.containers:
                used[pod.spec.node_name] += int(
                    ((c.resources.requests or c.resources.limits) or {}).get("nvidia.com/gpu", 0)
                )
    free = 0
    for node in nodes:
        if node.spec.unschedulable or any(t.effect == "NoSchedule" for t in node.spec.taints or []):
            continue
        allocatable = int((node.status.allocatable or {}).get("nvidia.com/gpu", 0))
        free += max(0, allocatable - used[node.metadata.name])
    return free


def _gpufed_free(fed: ServerProcess, cluster: str) -> int:
    with fed.client("admin") as admin:
        clusters = {c.name: c for c in admin.clusters().clusters}
    return sum(p.free_gpus for p in clusters[cluster].pools)


@pytest.mark.timeout(480)
@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed-{s}" for s in SEEDS])
# The rounds run one after another on one worker, not side by side: four rounds at once (four
# servers, simulators and kubectl storms) loaded the machine enough that the server saw a gang's
# pods gone 2 s after they ended, past the ledger check's second (seen twice in five runs).
@pytest.mark.xdist_group("chaos_member_clusters")
def test_chaos_by_third_parties(fed: ServerProcess, sims: SimProcess, tmp_path: Path, seed: int) -> None:
    print(f"chaos seed: {seed}")
    rng = random.Random(seed)
    recorder = PodRecorder()
    for cluster in ("onprem", "cloud"):
        recorder.follow(sims, cluster)
    parties = [ThirdParty(sims, c["name"], rng, tmp_path / f"kube-{c['name']}") for c in CLUSTERS]
    owners: dict[str, str] = {}
    started_s = time.time()
    try:

        def submit_wave(wave: int) -> None:
            for i in range(JOBS_PER_WAVE):
                user = "alice" if i % 2 == 0 else "bob"
                text = manifest(
                    f"job-{wave}-{i}",
                    workers=rng.randint(1, 2),
                    gpus=rng.choice([1, 2, 4]),
                    duration=f"{rng.randint(*JOB_S)}s",
                    extra_spec=RESTART,
                )
                with fed.client(user) as client:
                    owners[client.submit(text).job_id] = user

        submit_wave(0)
        begun = time.monotonic()
        second_wave = False
        while time.monotonic() < begun + CHAOS_S:
            if not second_wave and time.monotonic() > begun + CHAOS_S / 3:
                submit_wave(1)
                second_wave = True
            party = rng.choice(parties)
            rng.choice(party.acts())()
            time.sleep(rng.uniform(0.2, 0.8))
        for party in parties:
            party.heal()
        jobs = _wait_terminal(fed, owners, timeout_s=240)
    finally:
        recorder.stop()
    log = "\n".join(line for p in parties for line in p.log)
    assert not recorder.errors, recorder.errors

    # Every job ended by its restart policy, within its retries plus bounded federation retries.
    for job_id, job in jobs.items():
        assert job.phase in (pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED), (job_id, job.phase, log)
        assert job.attempt <= 1 + MAX_RETRIES + FEDERATION_RETRY_BOUND, (job_id, job.attempt, job.events)
        if job.phase == pb.JOB_PHASE_FAILED:
            assert job.message, f"{job_id} failed without saying why"

    # No job ever had two attempts' pods holding GPUs at once.
    lives = recorder.lives_by_job()
    overlaps = _overlaps(lives)
    assert overlaps == [], "\n".join(overlaps) + "\n" + log

    # The ledger's intervals match the pods' lifetimes.
    with fed.client("fin") as fin:
        intervals = list(fin.ledger(start_s=started_s - 60, end_s=time.time() + 60).intervals)
    by_attempt = {(iv.job_id, iv.attempt): iv for iv in intervals}
    for (job_id, attempt), pods in lives.items():
        ran = [p for p in pods if p.start_s is not None]
        if job_id not in owners or not ran:
            continue
        interval = by_attempt.get((job_id, attempt))
        first_start = min(p.start_s for p in ran if p.start_s is not None)
        last_end = max(p.end_s if p.end_s is not None else float("inf") for p in ran)
        if interval is None:
            # A gang killed within a second of starting may never be seen running: what is not
            # charged is then under a second, which is the bound. Anything longer must be charged.
            longest_s = (last_end + 1.0 if float(last_end).is_integer() else last_end) - first_start
            assert longest_s <= LEDGER_TOLERANCE_S, (
                f"{job_id} attempt {attempt} ran pods for up to {longest_s:.2f}s but has no ledger interval: "
                + ", ".join(f"{p.name}@{p.node} {p.start_s}..{p.end_s}" for p in ran)
                + f"\nevents: {[e.reason for e in jobs[job_id].events]}"
            )
            continue
        assert interval.end_s > 0, f"{job_id} attempt {attempt}: interval still open"
        assert _within(interval.start_s, first_start), (job_id, attempt, interval, first_start)
        assert _within(interval.end_s, last_end), (job_id, attempt, interval, last_end)
    for iv in intervals:
        ran = [p for p in lives.get((iv.job_id, iv.attempt), []) if p.start_s is not None]
        assert ran or iv.gpu_hours == 0, (
            f"ledger charges {iv.job_id} attempt {iv.attempt}, whose pods never ran"
        )

    # Once the foreign work is done too, gpufed's free GPUs are the nodes' own.
    for cluster in ("onprem", "cloud"):
        wait_for(
            lambda c=cluster: _gpufed_free(fed, c) == _node_view_free(sims, c), timeout_s=60, interval_s=0.5
        )
