"""The history soak (issue 19): jobs pushed through two servers on one etcd, with the archiver on and
the leader SIGKILLed during archiving, then counted in PostgreSQL plus etcd. What
`bench/soak_history.py` runs at full size and `tests/e2e/test_soak_history.py` runs small.

Everything is real: etcd (with the auto-compaction `EtcdProcess` runs), PostgreSQL as the one history
both servers share, `gpufed serve` twice as OS processes, the simulated clusters in their own process,
the archiver of whichever server leads. Time is compressed: `history.retainInEtcd` (an hour in
production) is seconds here, and so is etcd's compaction retention, so that "after the first hour"
is after the first minute. The judges are independent of the servers: etcdctl for etcd's size,
revisions and keys, SQL for the history, and (when asked) a watch on the clusters' pods for what ran.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg

from federation.api.client import GpufedClient
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.postgres_process import PostgresProcess
from federation.runtime.sim_process import SimProcess
from tests.e2e.harness import ServerProcess, wait_for
from tests.e2e.kube import PodRecorder, gpufed_pod_jobs, write_config
from tests.etcdctl import count_keys, endpoint_status, etcdctl, keys

DSN_ENV = "GPUFED_SOAK_HISTORY_DSN"
# What a server logs once its bootstrap has written the config into etcd (federation.runtime.bootstrap).
BOOTSTRAP_FINISHED = '"event": "bootstrap_finished"'
GPUFED_PREFIX = "/gpufed/"
JOBS_PREFIX = "/gpufed/jobs/"
LEDGER_PREFIX = "/gpufed/ledger/"
LEADER_KEY = "/gpufed/leader"
LOGS_PREFIX = "/gpufed/logs/"
USERS = [{"name": "admin", "tenant": "platform", "role": "admin"}] + [
    {"name": f"u{i}", "tenant": f"t{i}"} for i in range(4)
]
MiB = 1024 * 1024
KiB = 1024

# The size model behind the stated bound (see `SoakPlan.bound_bytes`). Per live job: its record with
# events (about 2-3 KiB as JSON), its ledger interval, idempotency and wait keys, its kept-log keys
# once its attempt ended (the attempt's summary, about 1 KiB, and one tail per replica: a few hundred
# bytes from the simulator), and the index entries etcd keeps per key; 16 KiB is well above what a
# one-attempt job holds. Kept logs leave etcd with their job (the archiver moves them to SQL), so
# nothing in etcd outlives the live window and the bound is flat in the jobs through.
LIVE_JOB_BYTES = 16 * KiB
# Per job, the revisions its life writes (submit, admit, dispatch, running, end, interval open and
# close, archive deletes: about 12) times the mean size of a revision's value (a job record: at most
# about 3 KiB). Measured and printed by the soak, so a wrong assumption shows.
REVISIONS_PER_JOB = 16
REVISION_BYTES = 4 * KiB
# bbolt's own pages, the config (tenants, users, tokens, clusters) and the leader/lease keys.
BASE_BYTES = 16 * MiB
# bbolt leaves B+tree pages part-full after deletes and holds freed pages until no reader needs them.
BBOLT_SLACK = 2.0
# The leader lease of `gpufed serve` unless told otherwise (`--lease-ttl-s`).
DEFAULT_LEASE_TTL_S = 5
# What one takeover costs besides the dead leader's lease running out: election and the new
# leader's first pass.
ELECTION_S = 2.0
# How often a held-back submission goes while kills are still to come (`SoakPlan.held_back`).
HELD_BACK_EVERY_S = 0.5


@dataclass(frozen=True, slots=True)
class SoakPlan:
    jobs: int
    kills: int
    rate_per_s: float
    retain_s: float  # history.retainInEtcd: the compressed "hour"
    compaction_s: int  # etcd --auto-compaction-retention, seconds
    clusters: int = 4
    nodes_per_cluster: int = 16
    job_s: float = 1.0  # how long each job's pod runs on the simulated cluster
    submit_threads: int = 8
    archive_rate_per_s: float = 2000.0
    drain_timeout_s: float = 300.0
    record_pods: bool = False
    sample_s: float = 2.0
    # The servers' leader lease (`gpufed serve --lease-ttl-s`), which a takeover after a kill waits
    # out; None: the servers' default.
    lease_ttl_s: int | None = None
    # Least seconds between leader kills. None spreads the kills over the submissions (the bench's
    # long runs); 0 kills as soon as the last kill's successor has archived (the test, which then
    # waits on conditions rather than a schedule). Each kill waits for a live leader whose archiver
    # has moved jobs to SQL since the last kill, either way.
    kill_gap_s: float | None = None
    # The last `held_back` submissions wait for the kills: while a kill is still to come they go one
    # every HELD_BACK_EVERY_S, then at the plan's pace. Jobs keep coming in, and being archived,
    # whenever a kill lands, however long a loaded machine makes the kills take. 0: none.
    held_back: int = 0

    @property
    def submit_s(self) -> float:
        return self.jobs / self.rate_per_s

    @property
    def takeover_s(self) -> float:
        """What one takeover costs: the dead leader's lease running out plus election."""
        return (self.lease_ttl_s or DEFAULT_LEASE_TTL_S) + ELECTION_S

    @property
    def warmup_s(self) -> float:
        """Until etcd holds its steady state: a job's life plus retention, a compaction cycle (etcd
        compacts every retention, keeping one retention of history), and a takeover's backlog."""
        return self.job_s + 10.0 + self.retain_s * 1.25 + 2 * self.compaction_s + self.takeover_s

    @property
    def live_window_s(self) -> float:
        """How long a job stays in etcd at most: queued and dispatched (slack 10 s), running,
        retained, waiting for the archiver's next pass (a quarter of the retention, at least 1 s),
        and a takeover in which nothing is scheduled or archived while submissions go on."""
        return 10.0 + self.job_s + self.retain_s + max(self.retain_s / 4, 1.0) + self.takeover_s

    @property
    def bound_bytes(self) -> int:
        """The flat part of the bound on etcd's database size: it depends on the rate and the
        windows, never on how many jobs went through. (live jobs x their bytes + the history
        compaction keeps) x bbolt's slack, plus a base. Live jobs are rate x live window; compaction
        keeps up to two retentions of history (it runs every retention and keeps the last one)."""
        live = self.rate_per_s * self.live_window_s * LIVE_JOB_BYTES
        history = self.rate_per_s * REVISIONS_PER_JOB * REVISION_BYTES * 2 * self.compaction_s
        return int(BBOLT_SLACK * (live + history) + BASE_BYTES)


@dataclass(frozen=True, slots=True)
class Sample:
    t_s: float
    db_size_bytes: int
    db_in_use_bytes: int
    revision: int
    compact_revision: int
    etcd_jobs: int
    logs_keys: int
    # Kept-log keys in etcd of jobs no longer there (archived): the archiver moves them with their
    # job, so this stays 0 (a job's keys leave in one transaction).
    archived_logs_keys: int = 0


@dataclass(frozen=True, slots=True)
class Kill:
    t_s: float
    identity: str
    sql_jobs: int  # archived so far: rising from kill to kill shows archiving under way
    etcd_jobs: int


@dataclass
class SoakResult:
    plan: SoakPlan
    accepted: dict[str, str] = field(default_factory=dict)  # idempotency key -> job id
    submit_took_s: float = 0.0
    drain_took_s: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    sql_jobs: dict[str, str] = field(default_factory=dict)  # job id -> phase
    sql_intervals: list[tuple[str, str, int]] = field(default_factory=list)  # (interval id, job, attempt)
    etcd_jobs: set[str] = field(default_factory=set)
    etcd_intervals: list[tuple[str, int]] = field(default_factory=list)
    etcd_logs_keys: list[str] = field(default_factory=list)  # every /gpufed/logs/ key left at the end
    sql_tails: int = 0  # kept tails in history_kept_logs
    ran: set[tuple[str, int]] | None = None  # (job, attempt) with a pod that started, if recorded
    pod_errors: list[str] = field(default_factory=list)
    # Pods of the soak's jobs still on the clusters once every job is archived (by job id), as the
    # official client lists them: the collector must have removed every gang.
    left_pods: dict[str, int] = field(default_factory=dict)
    mean_job_value_bytes: float = 0.0
    submit_errors: int = 0

    @property
    def job_ids(self) -> set[str]:
        return set(self.accepted.values())

    @property
    def warm_samples(self) -> list[Sample]:
        return [s for s in self.samples if s.t_s >= self.plan.warmup_s]

    @property
    def db_max_bytes(self) -> int:
        return max((s.db_size_bytes for s in self.samples), default=0)

    @property
    def revisions_per_job(self) -> float:
        last = self.samples[-1].revision if self.samples else 0
        return last / max(len(self.accepted), 1)

    def totals(self) -> dict[str, int]:
        """What must not depend on the kills: every count equals what the submissions imply."""
        return {
            "jobs": len(self.sql_jobs) + len(self.etcd_jobs),
            "intervals": len(self.sql_intervals) + len(self.etcd_intervals),
            "succeeded": sum(1 for p in self.sql_jobs.values() if p == "SUCCEEDED"),
        }

    def lost(self) -> set[str]:
        return self.job_ids - set(self.sql_jobs) - self.etcd_jobs

    def doubled_jobs(self) -> set[str]:
        """In both stores, or not one of the accepted jobs (a retry that made a second job)."""
        both = set(self.sql_jobs) & self.etcd_jobs
        extra = (set(self.sql_jobs) | self.etcd_jobs) - self.job_ids
        return both | extra

    def doubled_intervals(self) -> set[tuple[str, int]]:
        """(job, attempt) charged more than once, across both stores."""
        seen: dict[tuple[str, int], int] = {}
        for _, job, attempt in self.sql_intervals:
            seen[(job, attempt)] = seen.get((job, attempt), 0) + 1
        for job, attempt in self.etcd_intervals:
            seen[(job, attempt)] = seen.get((job, attempt), 0) + 1
        return {k for k, n in seen.items() if n > 1}

    def charged(self) -> set[tuple[str, int]]:
        return {(j, a) for _, j, a in self.sql_intervals} | set(self.etcd_intervals)

    def problems(self) -> list[str]:
        """Every broken invariant, in words; empty when the soak held."""
        out: list[str] = []
        plan = self.plan
        if len(self.accepted) != plan.jobs:
            out.append(f"{len(self.accepted)} of {plan.jobs} submissions accepted")
        if len(self.job_ids) != len(self.accepted):
            out.append("two idempotency keys got the same job id")
        if lost := self.lost():
            out.append(f"{len(lost)} accepted jobs in neither store, e.g. {sorted(lost)[:3]}")
        if doubled := self.doubled_jobs():
            out.append(f"{len(doubled)} jobs doubled or unexpected, e.g. {sorted(doubled)[:3]}")
        if doubled_iv := self.doubled_intervals():
            out.append(f"{len(doubled_iv)} attempts charged twice, e.g. {sorted(doubled_iv)[:3]}")
        not_done = {j for j, p in self.sql_jobs.items() if p != "SUCCEEDED"} | self.etcd_jobs
        if not_done:
            out.append(f"{len(not_done)} jobs not archived as SUCCEEDED, e.g. {sorted(not_done)[:3]}")
        charged_jobs = {job for job, _ in self.charged()}
        uncharged = self.job_ids - charged_jobs
        if uncharged:
            out.append(f"{len(uncharged)} jobs ran without a ledger interval, e.g. {sorted(uncharged)[:3]}")
        if self.ran is not None and self.ran != self.charged():
            diff = self.ran ^ self.charged()
            out.append(f"ledger and pods disagree on {len(diff)} attempts, e.g. {sorted(diff)[:3]}")
        if self.pod_errors:
            out.append(f"pod watch failed: {self.pod_errors[:2]}")
        # Only archived jobs' pods count: a job the drain did not archive is reported above.
        if left := {job: n for job, n in self.left_pods.items() if job in self.sql_jobs}:
            out.append(
                f"{sum(left.values())} pods of {len(left)} archived jobs left on the clusters, "
                f"e.g. {sorted(left)[:3]}"
            )
        if len(self.kills) != plan.kills:
            out.append(f"{len(self.kills)} of {plan.kills} leader kills done")
        if idle := [k for k in self.kills if k.sql_jobs == 0 or k.etcd_jobs == 0]:
            out.append(f"{len(idle)} kills not during archiving, e.g. {idle[0]}")
        if over := [s for s in self.warm_samples if s.db_size_bytes > plan.bound_bytes]:
            first = over[0]
            out.append(
                f"etcd db {first.db_size_bytes / MiB:.1f} MiB over the bound "
                f"{plan.bound_bytes / MiB:.1f} MiB at {first.t_s:.0f} s"
            )
        if stale := [s for s in self.samples if s.archived_logs_keys]:
            out.append(
                f"{len(stale)} samples saw kept-log keys of archived jobs in etcd, "
                f"e.g. {stale[0].archived_logs_keys} at {stale[0].t_s:.0f} s"
            )
        if self.etcd_logs_keys:
            out.append(
                f"{len(self.etcd_logs_keys)} kept-log keys left in etcd after the drain, "
                f"e.g. {self.etcd_logs_keys[:3]}"
            )
        if self.sql_jobs and not self.sql_tails:
            out.append(f"no kept tails in SQL for {len(self.sql_jobs)} archived jobs")
        compactions = {s.compact_revision for s in self.samples}
        if len(compactions - {0}) < 2:
            out.append(f"etcd's compacted revision did not advance: {sorted(compactions)}")
        return out


def clusters(plan: SoakPlan) -> list[dict[str, Any]]:
    """Many small clusters rather than one big one: the sim's kubelets and the backends' watches
    share the work, as member clusters would."""
    return [
        {
            "name": f"c{i}",
            "provider": "private",
            "region": f"dc{i}",
            "pools": [
                {
                    "name": "a100",
                    "gpuType": "A100",
                    "kind": "private",
                    "usdPerGpuHour": 1.1,
                    "gpusPerNode": 8,
                    "nodes": plan.nodes_per_cluster,
                }
            ],
        }
        for i in range(plan.clusters)
    ]


def soak_manifest(i: int, job_s: float) -> str:
    """The smallest real job: one pod of one GPU, running `job_s` on the simulated cluster."""
    return (
        "apiVersion: gpufed.io/v1\nkind: TrainingJob\n"
        f'metadata: {{name: soak-{i}, annotations: {{sim.gpufed.io/duration: "{job_s}s"}}}}\n'
        "spec:\n  gpuTypes: [A100]\n  tasks:\n"
        '    - {name: worker, replicas: 1, image: "pytorch/pytorch:2.3", gpus: 1}\n'
    )


def _start(server: ServerProcess, attempts: int = 3) -> None:
    """Start a server, again if it did not serve within the harness's 30 s (a loaded machine), as an
    operator's supervisor would."""
    for attempt in range(attempts):
        try:
            server.start()
            return
        except Exception:
            if attempt == attempts - 1:
                raise
            time.sleep(1.0)


def _each(servers: list[ServerProcess], action: Any) -> None:
    """`action` on every server at once: starting or stopping one takes seconds, and they are
    independent."""
    threads = [threading.Thread(target=action, args=(s,), daemon=True) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def compact_revision(etcd: EtcdProcess) -> int:
    """etcd's own gauge of the revision it last compacted to (its /metrics, on loopback)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{etcd.client_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = re.search(r"^etcd_debugging_mvcc_compact_revision (\S+)$", text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


@dataclass
class SubmitTurns:
    """Where a soak's submitter sends one key: the servers up at each turn, in turn, with a client
    kept per (server, user)."""

    servers: Callable[[], list[ServerProcess]]
    clients: dict[tuple[str, str], GpufedClient]
    token: str
    user: str
    timeout_s: float
    pause_s: float


def submit_until_accepted(
    turns: SubmitTurns,
    key: str,
    text: str,
    *,
    first_turn: int,
    on_error: Callable[[], None],
    lock: threading.Lock,
) -> str:
    """Submit `text` under the idempotency key `key` until a server accepts it; its job id.

    A server that is down (or died mid-call) gets the same key again on the next: if the first had
    accepted it, the retry finds that job instead of making another. `on_error` is called (under
    `lock`) for each refused call."""
    for turn in itertools.count(first_turn):
        servers = turns.servers()
        server = servers[turn % len(servers)]
        client = turns.clients.get((server.target, turns.user))
        if client is None:
            client = turns.clients[(server.target, turns.user)] = GpufedClient(
                server.target, turns.token, timeout_s=turns.timeout_s
            )
        try:
            return client.submit(text, idempotency_key=key).job_id
        except grpc.RpcError:
            with lock:
                on_error()
            turns.clients.pop((server.target, turns.user)).close()
            time.sleep(turns.pause_s)
    raise AssertionError("unreachable")


class Soak:
    """One soak run under `work_dir`. `run()` returns the result; the processes are gone after."""

    def __init__(self, plan: SoakPlan, work_dir: Path, postgres: PostgresProcess, database: str) -> None:
        self.plan = plan
        self.work_dir = work_dir
        self.postgres = postgres
        self.dsn = postgres.create_database(database)
        self.result = SoakResult(plan)
        self.etcd = EtcdProcess(work_dir / "etcd", compaction_retention=f"{plan.compaction_s}s")
        self.sims = SimProcess(work_dir / "sim", clusters(plan))
        self.servers: list[ServerProcess] = []
        self.t0 = 0.0
        self._stop = threading.Event()
        self._restarts: list[Future[None]] = []
        self._kills_done = threading.Event()
        self._held_back_lock = threading.Lock()
        self._next_held_back_s = 0.0
        # Server starts, off the main thread: the standby's goes on while the run begins.
        self._starter = ThreadPoolExecutor(2, thread_name_prefix="soak-start")
        self._standby: Future[None] | None = None
        self._lock = threading.Lock()
        self._tokens: dict[str, str] = {}

    # -- the run ---------------------------------------------------------------------------------

    def run(self, log: Any = print) -> SoakResult:
        os.environ[DSN_ENV] = self.dsn  # the servers inherit it; the config names the variable only
        # Both from this thread, one after the other: each dies with the thread that started it
        # (`die_with_parent`), so a helper thread that ends would take it along.
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
        recorder = PodRecorder() if plan.record_pods else None
        try:
            config = write_config(
                self.work_dir / "federation.yaml",
                self.sims,
                clusters(plan),
                grace_s=60,
                tenants=[{"name": "platform"}] + [{"name": f"t{i}"} for i in range(4)],
                users=USERS,
                history={
                    "dsnEnv": DSN_ENV,
                    "retainInEtcd": f"{plan.retain_s}s",
                    "archiveRatePerS": plan.archive_rate_per_s,
                },
            )
            lease = () if plan.lease_ttl_s is None else ("--lease-ttl-s", str(plan.lease_ttl_s))
            self.servers = [
                ServerProcess(
                    self.etcd.endpoint,
                    self.work_dir / f"state-{n}",
                    config=config,
                    identity=n,
                    extra_args=lease,
                )
                for n in "ab"
            ]
            # The second (the standby) bootstraps only once the first has: both write the same config
            # into etcd, and on a loaded machine two at once took longer than the harness's 30 s to
            # serve. The run begins once the first serves: nothing needs the standby before the
            # first kill, which waits for it, so its start overlaps the first's and the submissions.
            first, second = self.servers
            starting = self._starter.submit(_start, first)
            wait_for(
                lambda: starting.done() or BOOTSTRAP_FINISHED in first.log_text(),
                timeout_s=120,
                interval_s=0.1,
            )
            if starting.done():
                starting.result()  # the first never bootstrapped: its error, now
            self._standby = self._starter.submit(_start, second)
            starting.result()
            self._tokens = {
                u["name"]: (self.servers[0].state_dir / "tokens" / f"{u['name']}.token").read_text().strip()
                for u in USERS
            }
            if recorder is not None:
                for c in clusters(plan):
                    recorder.follow(self.sims, c["name"])
            log(f"first server serving in {time.monotonic() - began:.0f} s")
            self.t0 = time.monotonic()
            threads = [
                threading.Thread(target=self._sample, daemon=True, name="soak-sampler"),
                threading.Thread(target=self._kill_leaders, daemon=True, name="soak-killer"),
            ]
            counter = itertools.count()
            submitters = [
                threading.Thread(target=self._submit, args=(counter,), daemon=True, name=f"soak-submit-{n}")
                for n in range(plan.submit_threads)
            ]
            for t in threads + submitters:
                t.start()
            for t in submitters:
                t.join()
            self.result.submit_took_s = time.monotonic() - self.t0
            log(f"submitted {len(self.result.accepted)} jobs in {self.result.submit_took_s:.0f} s")
            threads[1].join()  # the kills happen during the run, never after the drain
            drain_from = time.monotonic()
            with contextlib.suppress(AssertionError):
                wait_for(lambda: self._etcd_jobs() == 0, timeout_s=plan.drain_timeout_s, interval_s=0.5)
            self.result.drain_took_s = time.monotonic() - drain_from
            log(f"drained in {self.result.drain_took_s:.0f} s")
            self.result.mean_job_value_bytes = self._mean_job_value_bytes()
            # Every job is archived by now; the collector removes their gangs within a tick or two
            # (half of retainInEtcd, or the history store's word for the ones archived first).
            with contextlib.suppress(AssertionError):
                wait_for(lambda: not self._left_pods(), timeout_s=60, interval_s=0.5)
            self.result.left_pods = self._left_pods()
            log(f"pods left on the clusters: {sum(self.result.left_pods.values())}")
            self._stop.set()
            threads[0].join(timeout=30)
            for restart in self._restarts:
                restart.result()  # the victims serve again (or their error, now)
            self._sample_once()
            if recorder is not None:
                wait_for(
                    lambda: all(p.end_s is not None for p in recorder.pods.values() if p.start_s),
                    timeout_s=30,
                )
                self.result.ran = {
                    k for k, pods in recorder.lives_by_job().items() if any(p.start_s for p in pods)
                }
                self.result.pod_errors = list(recorder.errors)
        finally:
            self._stop.set()
            if recorder is not None:
                recorder.stop()
            self._starter.shutdown(wait=True)  # a server still starting would outlive the stop below
            stopping = time.monotonic()
            _each(self.servers, ServerProcess.stop)
            log(f"servers stopped in {time.monotonic() - stopping:.0f} s")
        # Counted with both servers stopped, so nothing moves while the stores are read.
        self._count()

    def _left_pods(self) -> dict[str, int]:
        ours = self.result.job_ids
        left: dict[str, int] = {}
        for c in clusters(self.plan):
            for job_id in gpufed_pod_jobs(self.sims, c["name"]):
                if job_id in ours:
                    left[job_id] = left.get(job_id, 0) + 1
        return left

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def _submit(self, counter: itertools.count[int]) -> None:
        plan = self.plan
        users = [u["name"] for u in USERS if u["name"] != "admin"]
        clients: dict[tuple[str, str], GpufedClient] = {}

        def servers() -> list[ServerProcess]:
            # The standby only once it serves.
            standby_up = self._standby is not None and self._standby.done()
            return self.servers if standby_up else self.servers[:1]

        try:
            while (i := next(counter)) < plan.jobs:
                # Paced: submission i is due at i / rate, so the load is the plan's, whatever the threads.
                delay = i / plan.rate_per_s - self._now()
                if delay > 0:
                    time.sleep(delay)
                if i >= plan.jobs - plan.held_back:
                    self._wait_for_kills_or_turn()
                key, user = f"soak-{i}", users[i % len(users)]
                text = soak_manifest(i, plan.job_s)
                job_id = submit_until_accepted(
                    SubmitTurns(servers, clients, self._tokens[user], user, timeout_s=5, pause_s=0.1),
                    key,
                    text,
                    first_turn=i,
                    on_error=self._count_submit_error,
                    lock=self._lock,
                )
                with self._lock:
                    self.result.accepted[key] = job_id
        finally:
            for client in clients.values():
                client.close()

    def _count_submit_error(self) -> None:
        self.result.submit_errors += 1

    def _wait_for_kills_or_turn(self) -> None:
        """A held-back submission goes once the kills are done, or before, at its turn of one every
        HELD_BACK_EVERY_S (across the submitters)."""
        with self._held_back_lock:
            while not self._kills_done.is_set():
                if self._now() >= self._next_held_back_s:
                    self._next_held_back_s = self._now() + HELD_BACK_EVERY_S
                    return
                self._kills_done.wait(self._next_held_back_s - self._now())

    def _leader(self) -> str:
        return etcdctl(self.etcd.endpoint, "get", LEADER_KEY, "--print-value-only").stdout.strip()

    def _server_of(self, identity: str) -> ServerProcess | None:
        for server in self.servers:
            if (
                identity == f"{server.identity}-{server.starts}"
                and server.proc
                and server.proc.poll() is None
            ):
                return server
        return None

    def _kill_leaders(self) -> None:
        """The kills, once the standby serves (to take over); then the held-back submissions go on
        at the plan's pace."""
        try:
            if self._standby is not None:
                self._standby.result()
            self._kill(self.plan)
        finally:
            self._kills_done.set()

    def _kill(self, plan: SoakPlan) -> None:
        """SIGKILL whoever leads, `kills` times, from when the first jobs are due for archiving, and
        each only once the archiver has moved jobs to SQL since the last kill (so each kill lands
        while it is at work, and the successor of the last went on archiving; `Kill.sql_jobs`
        rising from kill to kill shows it). `kill_gap_s` spaces them.

        Each victim but the last is started again, as an operator's supervisor would, while its
        successor takes over and archives (the start is seconds of CPU, which a loaded machine has
        least of); the next kill waits for it to serve, so that a standby is there to take over
        each time. The last victim stays down: the other server drains, and the restarts before it
        have shown a server rejoining during archiving."""
        # From when the first jobs are due for archiving: spread to the end of the submissions, or
        # `kill_gap_s` apart at least.
        if plan.kill_gap_s is None:
            start = plan.job_s + plan.retain_s + 5.0
            end = max(plan.submit_s, start + plan.kills * (plan.takeover_s + 3))
            step = (end - start) / max(plan.kills, 1)
        else:
            start, step = plan.job_s + plan.retain_s, plan.kill_gap_s
        archived_at_last_kill = 0
        for k in range(plan.kills):
            at = start + k * step
            while self._now() < at and not self._stop.is_set():
                time.sleep(0.2)
            for restart in self._restarts:
                restart.result()  # the last victim serves again: the standby of this kill
            # A leader that is alive (the last one's lease may not have run out yet), and archiving.
            # (Each poll is an etcdctl or a PostgreSQL connection: every half second is plenty.)
            with contextlib.suppress(AssertionError):
                wait_for(lambda: self._server_of(self._leader()) is not None, timeout_s=60, interval_s=0.5)
            with contextlib.suppress(AssertionError):
                wait_for(
                    lambda since=archived_at_last_kill: self._sql_job_count() > since,
                    timeout_s=60,
                    interval_s=0.5,
                )
            victim = self._server_of(self._leader())
            if victim is None:
                continue
            identity = f"{victim.identity}-{victim.starts}"
            sql_jobs, etcd_jobs = self._sql_job_count(), self._etcd_jobs()
            victim.kill()
            self.result.kills.append(Kill(self._now(), identity, sql_jobs, etcd_jobs))
            archived_at_last_kill = sql_jobs
            if k < plan.kills - 1:
                self._restarts.append(self._starter.submit(self._restart, victim))

    def _restart(self, victim: ServerProcess) -> None:
        time.sleep(0.5)
        _start(victim)

    def _sample(self) -> None:
        while not self._stop.wait(self.plan.sample_s):
            with contextlib.suppress(Exception):
                self._sample_once()

    def _sample_once(self) -> None:
        status = endpoint_status(self.etcd.endpoint)
        # Jobs and kept logs in one read, so one revision of etcd: the archiver deletes a job's
        # keys in one transaction, so a log key whose job is missing belongs to a job archived
        # before. (One etcdctl a sample rather than two: the soak's CPU is what stretches it.)
        found = keys(self.etcd.endpoint, GPUFED_PREFIX)
        live = {k.removeprefix(JOBS_PREFIX) for k in found if k.startswith(JOBS_PREFIX)}
        logs = [k for k in found if k.startswith(LOGS_PREFIX)]
        archived = sum(1 for k in logs if k.removeprefix(LOGS_PREFIX).rsplit("/", 2)[0] not in live)
        sample = Sample(
            self._now(),
            status.db_size_bytes,
            status.db_size_in_use_bytes,
            status.revision,
            compact_revision(self.etcd),
            len(live),
            len(logs),
            archived,
        )
        with self._lock:
            self.result.samples.append(sample)

    def _etcd_jobs(self) -> int:
        return count_keys(self.etcd.endpoint, JOBS_PREFIX)

    def _sql_job_count(self) -> int:
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute("SELECT count(*) FROM history_jobs").fetchone()
        return int(row[0]) if row else 0

    def _mean_job_value_bytes(self) -> float:
        """The mean size of a job record in etcd now, from a sample of archived jobs' SQL copies
        (etcd is drained by then): what the bound's REVISION_BYTES assumes at most."""
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute(
                "SELECT avg(length(record_json)) FROM (SELECT record_json FROM history_jobs LIMIT 1000) s"
            ).fetchone()
        return float(row[0]) if row and row[0] is not None else 0.0

    def _count(self) -> None:
        """The totals, from the stores themselves: SQL by query, etcd by etcdctl."""
        with psycopg.connect(self.dsn) as conn:
            self.result.sql_jobs = dict(conn.execute("SELECT job_id, phase FROM history_jobs").fetchall())
            self.result.sql_intervals = [
                (str(a), str(b), int(c))
                for a, b, c in conn.execute("SELECT interval_id, job_id, attempt FROM history_intervals")
            ]
            row = conn.execute("SELECT count(*) FROM history_kept_logs").fetchone()
            self.result.sql_tails = int(row[0]) if row else 0
        self.result.etcd_logs_keys = keys(self.etcd.endpoint, LOGS_PREFIX)
        self.result.etcd_jobs = {k.removeprefix(JOBS_PREFIX) for k in keys(self.etcd.endpoint, JOBS_PREFIX)}
        ledger = (
            k.removeprefix(LEDGER_PREFIX).rsplit("/", 1) for k in keys(self.etcd.endpoint, LEDGER_PREFIX)
        )
        self.result.etcd_intervals = [(job, int(attempt)) for job, attempt in ledger]
