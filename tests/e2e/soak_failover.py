"""The failover soak (issue 33): jobs offered at a fixed rate to an HA group of `gpufed serve`
processes on one real etcd, while whichever server leads is SIGKILLed again and again (each victim
started again, as a supervisor would); then every accepted job is recounted, with etcdctl in etcd and
with psql in the PostgreSQL history, and judged against the pods the simulated clusters ran, as
kubectl watched them. What `bench/soak_failover.py` runs at full size (200 jobs/s, 20 kills) and
`tests/e2e/test_soak_failover.py` runs small.

What "nothing lost, nothing doubled" means here, each judged by a tool that is not gpufed:

* every acknowledged submission's job is in exactly one place, etcd (etcdctl) or the history
  (psql), SUCCEEDED, and no other job of the soak exists (a retried submission made no second job);
* each attempt has exactly one ledger interval, closed, across both stores, and a job's attempts
  never overlap in time (no two attempts running at once);
* each attempt's pod was created once (one pod uid for its name, as kubectl's watch saw), every
  attempt that holds an interval had a pod that started and every pod that started is charged;
* no two pods of one job ran at once.

Each takeover is timed from the SIGKILL: to the successor's `leader_acquired` (the dead leader's key
expired and it won the election) and `leader_first_cycle_done` (its first scheduling cycle committed:
it schedules again; the failover time), from its own log's timestamps, and to its `/readyz` saying
it leads with its first pass done (cycle, reconciler tick, cycle), polled every 20 ms.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import itertools
import json
import os
import re
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from datasync.loopback_ports import free_port
from federation.api.client import GpufedClient
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.postgres_process import PostgresProcess, postgres_bin_dir
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, wait_for
from tests.e2e.kube import write_config
from tests.e2e.soak import (
    BOOTSTRAP_FINISHED,
    DSN_ENV,
    USERS,
    SubmitTurns,
    clusters,
    soak_manifest,
    submit_until_accepted,
)
from tests.e2e.soak import SoakPlan as _SizePlan
from tests.etcdctl import count_keys, etcdctl

JOBS_PREFIX = "/gpufed/jobs/"
LEDGER_PREFIX = "/gpufed/ledger/"
IDEM_PREFIX = "/gpufed/idem/"
LEADER_KEY = "/gpufed/leader"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
# What /readyz answers on the leader once its first pass is done (federation.runtime.readiness).
LEADING_READY = "ready: leader, first pass done"
LEADING = "leader"
# What a new leader logs once its first scheduling cycle is done (federation.runtime.server), and how
# long a takeover is given to get there before the soak goes on without it.
FIRST_CYCLE = "leader_first_cycle_done"
FIRST_CYCLE_WAIT_S = 300.0
# How often the surviving servers' /readyz is asked during a takeover: the measure's resolution.
READYZ_POLL_S = 0.02
# One line per pod event, fields apart by "|" (an empty field stays a field).
POD_FIELDS = (
    "{.type}|{.object.metadata.uid}|{.object.metadata.namespace}/{.object.metadata.name}|"
    "{.object.metadata.labels.gpufed\\.io/job-id}|{.object.metadata.labels.gpufed\\.io/attempt}|"
    "{.object.status.startTime}|{.object.status.containerStatuses[0].state.terminated.finishedAt}"
    '{"\\n"}'
)


@dataclass(frozen=True, slots=True)
class FailoverSoakPlan:
    rate_per_s: float  # submissions offered per second, paced from the start
    kills: int
    servers: int = 3  # two stand by, so a kill never waits for the last victim's restart
    # Each successor, once it schedules (its first cycle done), leads this long before it is killed.
    kill_gap_s: float = 3.0
    # Submissions go on at least this long, and until the kills are done; then stop.
    min_submit_s: float = 5.0
    max_jobs: int = 1_000_000
    job_s: float = 1.0  # each pod's run on the simulated cluster
    clusters: int = 4
    nodes_per_cluster: int = 16  # of 8 A100 each: jobs take one GPU
    retain_s: float = 10.0  # history.retainInEtcd: ended jobs move to PostgreSQL after it
    submit_threads: int = 16
    drain_timeout_s: float = 600.0
    # `gpufed serve --lease-ttl-s`; None: the servers' default, which is what the soak measures.
    lease_ttl_s: int | None = None


@dataclass(frozen=True, slots=True)
class Takeover:
    victim: str
    successor: str
    killed_at_s: float  # since the run began
    to_leading_s: float  # the kill to a survivor's /readyz saying it leads (the key is won)
    # The kill to its /readyz saying its first pass is done; None if not within the kill gap.
    to_ready_s: float | None
    killed_wall_s: float = 0.0  # time.time() at the kill, to read the successor's log against
    # From the successor's own log, after the run: the kill to `leader_acquired` (the key won) and
    # to `leader_first_cycle_done` (its first scheduling cycle committed: it schedules).
    to_key_s: float | None = None
    to_scheduling_s: float | None = None


@dataclass(frozen=True, slots=True)
class PodSeen:
    uid: str
    name: str
    job_id: str
    attempt: int
    start_s: float | None
    end_s: float | None


@dataclass
class FailoverSoakResult:
    plan: FailoverSoakPlan
    accepted: dict[str, str] = field(default_factory=dict)  # idempotency key -> job id
    submitted: int = 0  # first tries made (offered); every one retried until acknowledged
    submit_retries: int = 0
    submit_took_s: float = 0.0
    drain_took_s: float = 0.0
    takeovers: list[Takeover] = field(default_factory=list)
    restarts_failed: list[str] = field(default_factory=list)
    # The recount, with the servers stopped.
    etcd_jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # job id -> record
    etcd_intervals: list[dict[str, Any]] = field(default_factory=list)
    etcd_idem_jobs: list[str] = field(default_factory=list)
    sql_jobs: dict[str, tuple[str, int]] = field(default_factory=dict)  # job id -> (phase, attempts)
    sql_intervals: list[tuple[str, int, float, float]] = field(default_factory=list)
    pods: dict[str, PodSeen] = field(default_factory=dict)  # cluster/uid -> what kubectl saw
    pod_watch_errors: list[str] = field(default_factory=list)

    @property
    def job_ids(self) -> set[str]:
        return set(self.accepted.values())

    def intervals(self) -> dict[tuple[str, int], tuple[float, float | None]]:
        """Every ledger interval of the soak's jobs, by (job, attempt), across both stores: (start,
        end or None while open). An interval's key and SQL id are its job and attempt, so one in
        both stores (archived, its etcd delete not done yet) is one interval, not two."""
        out: dict[tuple[str, int], tuple[float, float | None]] = {}
        for job, attempt, start, end in self.sql_intervals:
            out[(job, attempt)] = (start, end)
        for iv in self.etcd_intervals:
            ended = iv.get("end_s")
            out.setdefault(
                (str(iv["job_id"]), int(iv["attempt"])),
                (float(iv["start_s"]), None if ended is None else float(ended)),
            )
        return out

    def lost(self) -> set[str]:
        return self.job_ids - set(self.sql_jobs) - set(self.etcd_jobs)

    def extra_jobs(self) -> set[str]:
        """Jobs in either store that no acknowledged submission names: a retry that made a second
        job instead of finding the first."""
        return (set(self.sql_jobs) | set(self.etcd_jobs)) - self.job_ids

    def phases(self) -> dict[str, tuple[str, int]]:
        """Each job's phase and attempt count, from etcd where it is still there, else from SQL."""
        found = dict(self.sql_jobs)
        for job, record in self.etcd_jobs.items():
            found[job] = (str(record.get("phase")), int(record.get("attempt", 0)))
        return found

    def not_succeeded(self) -> set[str]:
        phases = self.phases()
        return {j for j in self.job_ids if j in phases and phases[j][0] != "SUCCEEDED"}

    def attempts_mismatched(self) -> set[str]:
        """Jobs whose charged attempts are not exactly 1..its attempt count: an attempt that ran
        without an interval, or an interval of an attempt the job never had."""
        charged: dict[str, set[int]] = defaultdict(set)
        for job, attempt in self.intervals():
            charged[job].add(attempt)
        return {
            job
            for job, (_, attempts) in self.phases().items()
            if job in self.job_ids and charged.get(job, set()) != set(range(1, attempts + 1))
        }

    def open_intervals(self) -> set[tuple[str, int]]:
        return {key for key, (_, end) in self.intervals().items() if end is None}

    def overlapping_attempts(self) -> set[str]:
        """Jobs two of whose attempts' intervals overlap in time."""
        by_job: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for (job, _), (start, end) in self.intervals().items():
            by_job[job].append((start, float("inf") if end is None else end))
        return {
            job
            for job, spans in by_job.items()
            if any(b[0] < a[1] for a, b in itertools.pairwise(sorted(spans)))
        }

    def attempts_beyond_first(self) -> int:
        return sum(1 for _, attempt in self.intervals() if attempt > 1)

    def pods_created_twice(self) -> set[str]:
        """Pod names (namespace/name, the attempt's) with more than one uid: created again."""
        uids: dict[str, set[str]] = defaultdict(set)
        for pod in self.pods.values():
            uids[pod.name].add(pod.uid)
        return {name for name, found in uids.items() if len(found) > 1}

    def pods_overlapping(self) -> set[str]:
        """Jobs two of whose pods of different attempts ran at the same time."""
        by_job: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
        for pod in self.pods.values():
            if pod.start_s is not None:
                by_job[pod.job_id].append((pod.start_s, pod.end_s or float("inf"), pod.attempt))
        return {
            job
            for job, lives in by_job.items()
            if any(b[0] < a[1] and a[2] != b[2] for a, b in itertools.pairwise(sorted(lives)))
        }

    def doubled(self) -> set[str]:
        """Jobs done more than once in any sense: a second job for one submission, an attempt's pod
        created again, two attempts charged or running at once."""
        twice = {name.rsplit("/", 1)[-1] for name in self.pods_created_twice()}
        pod_jobs = {p.job_id for p in self.pods.values() if p.name.rsplit("/", 1)[-1] in twice}
        return self.extra_jobs() | pod_jobs | self.overlapping_attempts() | self.pods_overlapping()

    def ran(self) -> set[tuple[str, int]]:
        return {(p.job_id, p.attempt) for p in self.pods.values() if p.start_s is not None}

    def charged(self) -> set[tuple[str, int]]:
        return set(self.intervals())

    def problems(self) -> list[str]:
        """Every broken invariant, in words; empty when the soak held."""
        out: list[str] = []
        if len(self.accepted) != self.submitted:
            out.append(f"{len(self.accepted)} of {self.submitted} submissions acknowledged")
        if len(self.job_ids) != len(self.accepted):
            out.append("two idempotency keys got the same job id")
        if lost := self.lost():
            out.append(f"{len(lost)} accepted jobs in neither etcd nor SQL, e.g. {sorted(lost)[:3]}")
        if extra := self.extra_jobs():
            out.append(f"{len(extra)} jobs no submission was acknowledged for, e.g. {sorted(extra)[:3]}")
        if idem_extra := set(self.etcd_idem_jobs) - self.job_ids:
            out.append(
                f"{len(idem_extra)} idempotency keys in etcd name unknown jobs: {sorted(idem_extra)[:3]}"
            )
        if undone := self.not_succeeded():
            out.append(f"{len(undone)} jobs did not end SUCCEEDED, e.g. {sorted(undone)[:3]}")
        if mismatched := self.attempts_mismatched():
            out.append(
                f"{len(mismatched)} jobs whose intervals are not one per attempt: {sorted(mismatched)[:3]}"
            )
        if still_open := self.open_intervals():
            out.append(f"{len(still_open)} ledger intervals left open, e.g. {sorted(still_open)[:3]}")
        if overlap := self.overlapping_attempts():
            out.append(f"{len(overlap)} jobs with two attempts charged at once, e.g. {sorted(overlap)[:3]}")
        if again := self.pods_created_twice():
            out.append(f"{len(again)} pods created more than once, e.g. {sorted(again)[:3]}")
        if pods_overlap := self.pods_overlapping():
            out.append(
                f"{len(pods_overlap)} jobs with two attempts' pods running at once: {sorted(pods_overlap)[:3]}"
            )
        ran, charged = self.ran(), self.charged()
        if ran != charged:
            diff = sorted(ran ^ charged)
            out.append(f"pods and ledger disagree on {len(diff)} attempts, e.g. {diff[:3]}")
        if self.pod_watch_errors:
            out.append(f"kubectl's pod watch failed: {self.pod_watch_errors[:2]}")
        if len(self.takeovers) != self.plan.kills:
            out.append(f"{len(self.takeovers)} of {self.plan.kills} leader kills taken over")
        if self.restarts_failed:
            out.append(f"{len(self.restarts_failed)} victims did not serve again: {self.restarts_failed[:2]}")
        return out

    def failover_s(self) -> list[float]:
        """The kill to the successor's first cycle done (it schedules), for each takeover whose log
        says so (one killed in its first cycle does not)."""
        return [t.to_scheduling_s for t in self.takeovers if t.to_scheduling_s is not None]

    def figures(self) -> list[str]:
        """`name: value unit` lines."""
        plan = self.plan
        took = self.submit_took_s + self.drain_took_s
        scheduling = self.failover_s() or [0.0]
        ready = [t.to_ready_s for t in self.takeovers if t.to_ready_s is not None] or [0.0]
        key = [t.to_leading_s if t.to_key_s is None else t.to_key_s for t in self.takeovers] or [0.0]
        return [
            f"soak_offered_rate: {plan.rate_per_s:g} jobs/s",
            f"soak_submitted: {self.submitted} jobs",
            f"soak_submit_rate: {self.submitted / max(self.submit_took_s, 1e-9):.1f} jobs/s",
            f"soak_accepted: {len(self.accepted)} jobs",
            f"soak_submit_retries: {self.submit_retries} calls",
            f"soak_throughput: {len(self.accepted) / max(took, 1e-9):.1f} jobs/s",
            f"soak_drain_s: {self.drain_took_s:.1f} s",
            f"soak_in_etcd_at_end: {len(self.etcd_jobs)} jobs",
            f"soak_in_sql_at_end: {len(self.sql_jobs)} jobs",
            f"soak_lost: {len(self.lost())} jobs",
            f"soak_doubled: {len(self.doubled())} jobs",
            f"soak_overlapping_attempts: {len(self.overlapping_attempts())} jobs",
            f"soak_pods_created_twice: {len(self.pods_created_twice())} pods",
            f"soak_attempts_beyond_first: {self.attempts_beyond_first()} attempts",
            f"soak_kills: {len(self.takeovers)} kills",
            f"soak_failover_median_s: {statistics.median(scheduling):.2f} s",
            f"soak_failover_max_s: {max(scheduling):.2f} s",
            f"soak_failover_to_leader_key_median_s: {statistics.median(key):.2f} s",
            f"soak_failover_to_leader_key_max_s: {max(key):.2f} s",
            # The first pass (cycle, tick, cycle) is seen only when it ends within the kill gap:
            # its tick works through the backlog of the leaderless seconds.
            f"soak_failover_first_pass_seen: {sum(1 for t in self.takeovers if t.to_ready_s)} kills",
            f"soak_failover_to_first_pass_median_s: {statistics.median(ready):.2f} s",
            f"soak_failover_unmeasured: {len(self.takeovers) - len(self.failover_s())} kills",
            f"soak_lease_ttl_s: {plan.lease_ttl_s or 'default'} s",
            f"soak_problems: {len(self.problems())} problems",
        ]


def _size_plan(plan: FailoverSoakPlan) -> _SizePlan:
    """The history soak's plan, for its cluster layout (`tests.e2e.soak.clusters`)."""
    return _SizePlan(
        jobs=0,
        kills=0,
        rate_per_s=plan.rate_per_s,
        retain_s=plan.retain_s,
        compaction_s=0,
        clusters=plan.clusters,
        nodes_per_cluster=plan.nodes_per_cluster,
    )


def _readyz(port: int) -> str:
    """What a server's /readyz says, or "" when it does not answer."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return str(response.read().decode().strip())
    except urllib.error.HTTPError as error:
        return str(error.read().decode().strip())
    except OSError:
        return ""


def _iso_s(text: str) -> float | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


class LogTail:
    """A server's log, read from where the last look stopped (the logs grow by megabytes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self._seen: set[str] = set()

    def saw(self, event: str) -> bool:
        if event in self._seen:
            return True
        with contextlib.suppress(OSError), self.path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
            self._offset += len(chunk)
            *lines, self._partial = (self._partial + chunk).split(b"\n")
            for line in lines:
                found = re.search(rb'"event": "([a-z_]+)"', line)
                if found:
                    self._seen.add(found.group(1).decode())
        return event in self._seen


class PodWatch:
    """`kubectl get pods --watch` on each cluster: every pod of a gpufed job, as the cluster reports
    it. kubectl (Go, a process of its own) rather than the Python client: at the soak's rate a
    watch decoded in this process took CPU the servers needed."""

    def __init__(self, sims: SimProcess, cluster_names: list[str], kubectl: str) -> None:
        self.sims = sims
        self.pods: dict[str, PodSeen] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._threads = [
            threading.Thread(target=self._follow, args=(name, kubectl), daemon=True, name=f"pods-{name}")
            for name in cluster_names
        ]
        self._procs: list[subprocess.Popen[str]] = []

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _follow(self, cluster: str, kubectl: str) -> None:
        # kubectl ends when the server closes the watch; it is started again, and its first list
        # gives every pod still there (a finished pod stays until the collector removes its gang).
        while not self._stopped.is_set():
            proc = subprocess.Popen(
                [kubectl, "--kubeconfig", str(self.sims.kubeconfig), "--context", cluster,
                 "get", "pods", "--all-namespaces", "-l", "gpufed.io/job-id", "--watch",
                 "--output-watch-events", "-o", f"jsonpath={POD_FIELDS}"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            with self._lock:
                self._procs.append(proc)
            assert proc.stdout is not None
            for line in proc.stdout:
                self._seen(cluster, line.rstrip("\n"))
            proc.wait()
            if not self._stopped.is_set() and proc.returncode not in (0, None):
                err = proc.stderr.read() if proc.stderr else ""
                self.errors.append(f"{cluster}: kubectl exited {proc.returncode}: {err.strip()[:200]}")
                time.sleep(0.5)

    def _seen(self, cluster: str, line: str) -> None:
        parts = line.split("|")
        if len(parts) != 7 or not parts[3]:
            return
        kind, uid, name, job_id, attempt, started, finished = parts
        key = f"{cluster}/{uid}"
        with self._lock:
            old = self.pods.get(key)
            start_s = (old.start_s if old else None) or _iso_s(started)
            end_s = (old.end_s if old else None) or _iso_s(finished)
            if kind == "DELETED" and end_s is None and start_s is not None:
                end_s = time.time()  # killed on deletion: it ran until the cluster removed it
            self.pods[key] = PodSeen(uid, f"{cluster}/{name}", job_id, int(attempt or 0), start_s, end_s)

    def settled(self) -> bool:
        with self._lock:
            return all(p.end_s is not None for p in self.pods.values() if p.start_s is not None)

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)


class FailoverSoak:
    """One run under `work_dir`; `run()` returns the result, with every process gone."""

    def __init__(
        self, plan: FailoverSoakPlan, work_dir: Path, postgres: PostgresProcess, database: str, kubectl: str
    ) -> None:
        self.plan = plan
        self.work_dir = work_dir
        self.postgres = postgres
        self.dsn = postgres.create_database(database)
        self.kubectl = kubectl
        self.result = FailoverSoakResult(plan)
        self.etcd = EtcdProcess(work_dir / "etcd")
        self.clusters = clusters(_size_plan(plan))
        self.sims = SimProcess(work_dir / "sim", self.clusters)
        self.servers: list[ServerProcess] = []
        self.metrics_ports: dict[str, int] = {}
        self.t0 = 0.0
        self._kills_done = threading.Event()
        self._lock = threading.Lock()
        self._tokens: dict[str, str] = {}
        # Server starts, off the main thread; a pool that lives as long as the run, since a process
        # may be tied to the thread that started it.
        self._starter = ThreadPoolExecutor(plan.servers, thread_name_prefix="soak-start")
        self._restarts: list[Future[None]] = []

    def run(self, log: Any = print) -> FailoverSoakResult:
        os.environ[DSN_ENV] = self.dsn  # the servers inherit it; the config names the variable only
        self.etcd.start()
        try:
            self.sims.start()
            try:
                self._run(log)
            finally:
                self.sims.stop()
        finally:
            self.etcd.stop()
        return self.result

    def _run(self, log: Any) -> None:
        plan = self.plan
        began = time.monotonic()
        pods = PodWatch(self.sims, [c["name"] for c in self.clusters], self.kubectl)
        try:
            config = write_config(
                self.work_dir / "federation.yaml",
                self.sims,
                self.clusters,
                grace_s=60,
                tenants=[{"name": "platform"}] + [{"name": f"t{i}"} for i in range(4)],
                users=USERS,
                history={"dsnEnv": DSN_ENV, "retainInEtcd": f"{plan.retain_s}s", "archiveRatePerS": 2000},
            )
            lease = () if plan.lease_ttl_s is None else ("--lease-ttl-s", str(plan.lease_ttl_s))
            names = "abcdefgh"[: plan.servers]
            self.metrics_ports = {n: free_port() for n in names}
            self.servers = [
                ServerProcess(
                    self.etcd.endpoint,
                    self.work_dir / f"state-{n}",
                    config=config,
                    identity=n,
                    extra_args=(*lease, "--metrics-port", str(self.metrics_ports[n])),
                )
                for n in names
            ]
            # The first bootstraps the config alone; the others start once it has (two bootstraps
            # at once on a loaded machine outlasted the harness's wait).
            first, *others = self.servers
            starting = self._starter.submit(_start, first)
            wait_for(lambda: starting.done() or BOOTSTRAP_FINISHED in first.log_text(), timeout_s=120)
            starting.result() if starting.done() else None
            standbys = [self._starter.submit(_start, s) for s in others]
            starting.result()
            for s in standbys:
                s.result()
            self._tokens = {
                u["name"]: (first.state_dir / "tokens" / f"{u['name']}.token").read_text().strip()
                for u in USERS
            }
            pods.start()
            log(f"{plan.servers} servers serving in {time.monotonic() - began:.0f} s")
            self.t0 = time.monotonic()
            killer = threading.Thread(target=self._kill_leaders, args=(log,), daemon=True, name="soak-killer")
            counter = itertools.count()
            submitters = [
                threading.Thread(target=self._submit, args=(counter,), daemon=True, name=f"soak-submit-{n}")
                for n in range(plan.submit_threads)
            ]
            for t in [killer, *submitters]:
                t.start()
            for t in submitters:
                t.join()
            self.result.submit_took_s = time.monotonic() - self.t0
            log(
                f"submitted {self.result.submitted} jobs in {self.result.submit_took_s:.0f} s "
                f"({self.result.submit_retries} retries), {len(self.result.takeovers)} kills"
            )
            killer.join()
            for restart in self._restarts:
                with contextlib.suppress(Exception):
                    restart.result()
            drain_from = time.monotonic()
            with contextlib.suppress(AssertionError):
                wait_for(self._drained, timeout_s=plan.drain_timeout_s, interval_s=1.0)
            self.result.drain_took_s = time.monotonic() - drain_from
            log(f"drained in {self.result.drain_took_s:.0f} s")
            with contextlib.suppress(AssertionError):
                wait_for(pods.settled, timeout_s=30, interval_s=0.5)
        finally:
            self._kills_done.set()
            self._starter.shutdown(wait=True)
            stopping = [threading.Thread(target=s.stop, daemon=True) for s in self.servers]
            for t in stopping:
                t.start()
            for t in stopping:
                t.join()
            pods.stop()
        self.result.takeovers = [self._split(t) for t in self.result.takeovers]
        self.result.pods = dict(pods.pods)
        self.result.pod_watch_errors = list(pods.errors)
        # Counted with every server stopped, so nothing moves while the stores are read.
        self._recount()

    def _now(self) -> float:
        return time.monotonic() - self.t0

    # -- submissions -----------------------------------------------------------------------------

    def _submit(self, counter: itertools.count[int]) -> None:
        plan = self.plan
        users = [u["name"] for u in USERS if u["name"] != "admin"]
        clients: dict[tuple[str, str], GpufedClient] = {}
        try:
            while (i := next(counter)) < plan.max_jobs:
                # Paced: submission i is due at i / rate, however many threads there are.
                due = i / plan.rate_per_s
                if due >= plan.min_submit_s and self._kills_done.is_set():
                    return
                if (delay := due - self._now()) > 0:
                    time.sleep(delay)
                with self._lock:
                    self.result.submitted += 1
                key, user = f"soak-{i}", users[i % len(users)]
                text = soak_manifest(i, plan.job_s)
                job_id = submit_until_accepted(
                    SubmitTurns(
                        lambda: self.servers, clients, self._tokens[user], user, timeout_s=10, pause_s=0.05
                    ),
                    key,
                    text,
                    first_turn=i,
                    on_error=self._count_submit_retry,
                    lock=self._lock,
                )
                with self._lock:
                    self.result.accepted[key] = job_id
        finally:
            for client in clients.values():
                client.close()

    # -- kills -----------------------------------------------------------------------------------

    def _count_submit_retry(self) -> None:
        self.result.submit_retries += 1

    def _alive(self, server: ServerProcess) -> bool:
        return server.proc is not None and server.proc.poll() is None

    def _leads(self, server: ServerProcess, ready: bool = False) -> bool:
        """Whether a live server's /readyz says it leads (with its first pass done, if `ready`)."""
        if not self._alive(server):
            return False
        said = _readyz(self.metrics_ports[server.identity])
        return said == LEADING_READY if ready else said.partition(": ")[2].startswith(LEADING)

    def _kill_leaders(self, log: Any) -> None:
        try:
            time.sleep(self.plan.kill_gap_s)  # the first kill too comes once load flows
            for _ in range(self.plan.kills):
                self._kill_one(log)
        except Exception as error:  # the run goes on to its count; the missing kills are a problem
            log(f"kills stopped: {error!r}")
        finally:
            self._kills_done.set()

    def _kill_one(self, log: Any) -> None:
        """Kill whoever leads, with a standby serving beside it; time the takeover until the
        successor schedules (its first cycle done, as its log says), let load flow `kill_gap_s`
        more, and start the victim again in the background meanwhile."""
        plan = self.plan
        leader = wait_for(
            lambda: next((s for s in self.servers if self._leads(s)), None), timeout_s=120, interval_s=0.1
        )
        wait_for(
            lambda: any(self._alive(s) and s is not leader for s in self.servers),
            timeout_s=120,
            interval_s=0.1,
        )
        identity = f"{leader.identity}-{leader.starts}"
        killed_at, killed_wall = self._now(), time.time()
        leader.kill()
        killed = time.monotonic()
        survivors = [s for s in self.servers if s is not leader and self._alive(s)]
        successor: ServerProcess | None = None
        while successor is None:
            if time.monotonic() > killed + 120:
                raise RuntimeError(f"no survivor led within 120 s of killing {identity}")
            successor = next((s for s in survivors if self._leads(s)), None)
            if successor is None:
                time.sleep(READYZ_POLL_S)
        led = time.monotonic()
        self._restarts.append(self._starter.submit(self._restart, leader))
        # Until it schedules: its first cycle, over the whole queue, is done (at most a while; a
        # takeover that does not get there is counted as unmeasured, and the soak goes on).
        tail = LogTail(successor.state_dir / f"server-{successor.identity}-{successor.starts}.log")
        with contextlib.suppress(AssertionError):
            wait_for(lambda: tail.saw(FIRST_CYCLE), timeout_s=FIRST_CYCLE_WAIT_S, interval_s=0.05)
        scheduled = time.monotonic()
        # Its first pass (cycle, tick, cycle) if it ends within the gap that follows.
        ready_s: float | None = None
        while time.monotonic() < scheduled + plan.kill_gap_s:
            if ready_s is None and self._leads(successor, ready=True):
                ready_s = time.monotonic() - killed
            time.sleep(READYZ_POLL_S if ready_s is None else 0.1)
        takeover = Takeover(
            identity,
            f"{successor.identity}-{successor.starts}",
            killed_at,
            led - killed,
            ready_s,
            killed_wall,
        )
        self.result.takeovers.append(takeover)
        first_pass = "not within the gap" if ready_s is None else f"{ready_s:.2f} s"
        log(
            f"kill {len(self.result.takeovers)} at {killed_at:.0f} s: {identity} -> {takeover.successor} "
            f"leads {takeover.to_leading_s:.2f} s after, schedules {scheduled - killed:.2f} s, "
            f"first pass {first_pass}"
        )

    def _split(self, takeover: Takeover) -> Takeover:
        """The takeover with the successor's own times: the key won, the first cycle done."""
        name = takeover.successor.rsplit("-", 1)[0]
        log_path = self.work_dir / f"state-{name}" / f"server-{takeover.successor}.log"
        found: dict[str, float] = {}
        with contextlib.suppress(OSError):
            for line in log_path.read_text(errors="replace").splitlines():
                for event in ("leader_acquired", "leader_first_cycle_done"):
                    if event not in found and f'"event": "{event}"' in line:
                        with contextlib.suppress(ValueError, KeyError):
                            at = _iso_s(json.loads(line)["timestamp"])
                            if at is not None and at >= takeover.killed_wall_s:
                                found[event] = at - takeover.killed_wall_s
        return dataclasses.replace(
            takeover,
            to_key_s=found.get("leader_acquired"),
            to_scheduling_s=found.get("leader_first_cycle_done"),
        )

    def _restart(self, victim: ServerProcess) -> None:
        try:
            _start(victim)
        except Exception as error:
            self.result.restarts_failed.append(f"{victim.identity}: {error!r}"[:300])

    # -- the drain and the count -----------------------------------------------------------------

    def _psql(self, query: str) -> list[list[str]]:
        """Rows of a query, as psql (PostgreSQL's own client) prints them: one line a row, "|"."""
        psql = postgres_bin_dir() / "psql"
        done = subprocess.run(
            [str(psql if psql.exists() else "psql"), self.dsn, "-X", "-A", "-t", "-F", "|", "-c", query],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        return [line.split("|") for line in done.stdout.splitlines() if line]

    def _etcd_values(self, prefix: str) -> list[tuple[str, dict[str, Any]]]:
        """Every key under `prefix` with its JSON value, as etcdctl prints them."""
        out = etcdctl(self.etcd.endpoint, "get", prefix, "--prefix", "-w", "json").stdout
        found = json.loads(out).get("kvs", [])
        return [
            (base64.b64decode(kv["key"]).decode(), json.loads(base64.b64decode(kv["value"]))) for kv in found
        ]

    def _drained(self) -> bool:
        """Every accepted job ended: the cheap counts first (jobs in SQL are ended), the records in
        etcd read only when the counts add up."""
        want = self.result.job_ids
        in_sql = int(self._psql("SELECT count(*) FROM history_jobs")[0][0])
        if in_sql + count_keys(self.etcd.endpoint, JOBS_PREFIX) < len(want):
            return False
        sql = {row[0] for row in self._psql("SELECT job_id FROM history_jobs")}
        live = {
            key.removeprefix(JOBS_PREFIX): record.get("phase")
            for key, record in self._etcd_values(JOBS_PREFIX)
        }
        return all(j in sql or live.get(j) in TERMINAL for j in want)

    def _recount(self) -> None:
        """The stores' own account: etcdctl for etcd, psql for the history."""
        result = self.result
        result.etcd_jobs = {key.removeprefix(JOBS_PREFIX): rec for key, rec in self._etcd_values(JOBS_PREFIX)}
        result.etcd_intervals = [rec for _, rec in self._etcd_values(LEDGER_PREFIX)]
        result.etcd_idem_jobs = [str(rec.get("job_id")) for _, rec in self._etcd_values(IDEM_PREFIX)]
        result.sql_jobs = {
            row[0]: (row[1], int(row[2]))
            for row in self._psql("SELECT job_id, phase, record_json::json->>'attempt' FROM history_jobs")
        }
        result.sql_intervals = [
            (row[0], int(row[1]), float(row[2]), float(row[3]))
            for row in self._psql("SELECT job_id, attempt, start_s, end_s FROM history_intervals")
        ]


def _start(server: ServerProcess, attempts: int = 3) -> None:
    """Start a server, again if it did not serve in time (a loaded machine), as a supervisor would."""
    for attempt in range(attempts):
        try:
            server.start()
            return
        except Exception:
            if attempt == attempts - 1:
                raise
            time.sleep(1.0)
