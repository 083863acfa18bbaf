"""The discrete-event simulator: a federation driven by `placement.plan`, one cycle at a time.

Events are job arrivals (at `submit_time_s`), completions (start + duration / speed of the GPU type
it runs on), victims leaving at the end of their grace period, spot reclaims, and wake-ups at the end
of a job's wait for private GPUs. A cycle runs when something happened, like a control plane whose
loop runs every `cycle_s` seconds: events are batched up to the next multiple of `cycle_s` (with
`cycle_s = 0`, a cycle runs at every distinct event time, which the tests use for exact answers).

Each cycle builds a `Snapshot` (queued gangs, running gangs with their nodes and run-time limits,
clusters with each node's free GPUs, the teams) and carries out the `Plan` exactly:

- an admission starts the gang on the cluster and type the plan chose, on nodes picked best fit (the
  placer's own rule); on a public cluster it starts after the provisioning lead time, and the GPUs
  are held from the admission;
- a preemption marks the victim as leaving; after its grace period its GPUs are free and it is
  requeued at its original queue time, to restart from scratch (the work done is lost);
- a spot reclaim ends the run (billed until then) and requeues the job at its original queue time:
  from scratch, or, for a job that checkpoints (`TraceJob.resumable`), with its progress kept but
  the work since its last checkpoint, taken as `spot_lost_work_h` or the time since it started,
  whichever is less (the same under every policy: checkpoints are the job's doing);
- waiting reasons with an end time (the wait for private GPUs) schedule a wake-up then;
- a job whose deadline the placer finds it can no longer meet (`deadline_unmeetable`: no placement
  free now finishes in time by its run-time limit) keeps its place in the queue without the
  deadline, as its owner would rather it ran late than never; it counts as missed if it ends late;
- a move (`PolicyConfig.repatriate`) stops the cloud gang at once (billed until then) and restarts
  it on the private nodes the plan chose, best fit, with its progress minus `move_overhead_s`.

Public capacity is elastic: every offer has up to the configured GPUs as empty nodes, and a gang there
is billed per GPU for the time it runs (not while it waits for the lead time).
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum

from federation.replay.config import ReplayConfig
from federation.replay.policies import PolicySpec
from federation.replay.trace import TraceJob
from federation.replay.world import FIFO_TENANT, PoolDef, World, gang_request
from placement.model import (
    CapacityKind,
    ClusterName,
    ClusterState,
    GangRequest,
    JobId,
    Move,
    NodePool,
    NodeShare,
    Plan,
    PolicyConfig,
    RunningGang,
    Snapshot,
    TenantQuota,
    WaitCode,
)
from placement.model_policy import CostPolicy
from placement.plan import plan


class Ev(IntEnum):
    # Order within one instant: capacity frees before new work arrives.
    FINISH = 0
    GONE = 1
    RECLAIM = 2
    ARRIVAL = 3
    WAKE = 4


@dataclass(frozen=True, slots=True)
class Interval:
    """One attempt's run on one pool: GPU time and, for cloud pools, what it cost."""

    job_id: JobId
    tenant: str
    cluster: str
    gpu_type: str
    private: bool
    gpus: int
    start_s: float
    end_s: float
    usd_per_gpu_hour: float
    completed: bool

    @property
    def cost_usd(self) -> float:
        return (
            0.0 if self.private else self.gpus * (self.end_s - self.start_s) / 3600.0 * self.usd_per_gpu_hour
        )


@dataclass(slots=True)
class JobOutcome:
    job: TraceJob
    # Start of the attempt that completed, and its end (None while unfinished).
    start_s: float | None = None
    finish_s: float | None = None
    attempts: int = 0
    preemptions: int = 0
    cluster: str = ""
    gpu_type: str = ""
    private: bool = True


@dataclass(slots=True)
class _Run:
    pool: PoolDef
    shares: list[tuple[int, int]]
    admitted_s: float
    start_s: float
    finish_s: float
    attempt: int
    gang: RunningGang
    leaving: bool = False


@dataclass(slots=True)
class Result:
    policy: str
    private_gpus: int
    outcomes: dict[JobId, JobOutcome]
    intervals: list[Interval]
    cycles: int = 0
    plan_s: float = 0.0
    placement_mismatches: int = 0
    # Running cloud gangs moved back to private GPUs (`PolicyConfig.repatriate`), and the placer's
    # estimate of what they saved, summed.
    moves: int = 0
    move_saving_usd: float = 0.0
    # Spot runs reclaimed (each requeued; its run so far is billed, and lost unless it checkpoints),
    # and of those, the runs of resumable jobs, which kept their progress to the last checkpoint.
    reclaims: int = 0
    reclaims_resumed: int = 0
    # Jobs whose deadline the placer gave up on (it could no longer be met) and that ran without it.
    deadlines_dropped: int = 0
    admissions_by_cycle: list[tuple[float, tuple[JobId, ...]]] = field(default_factory=list)


def best_fit(nodes: list[int], replica_gpus: Sequence[int]) -> list[tuple[int, int]] | None:
    """Take GPUs for every replica from `nodes` (free GPUs per node, changed in place), largest
    replica first, each on the node it fills best; the (node, GPUs) taken, or None, with `nodes` as
    it was, when one replica fits nowhere."""
    shares: list[tuple[int, int]] = []
    for gpus in sorted(replica_gpus, reverse=True):
        best = -1
        for index, free in enumerate(nodes):
            if free >= gpus and (best < 0 or free < nodes[best]):
                best = index
        if best < 0:
            for node, taken in shares:
                nodes[node] += taken
            return None
        nodes[best] -= gpus
        shares.append((best, gpus))
    return shares


class Simulator:
    def __init__(
        self,
        config: ReplayConfig,
        world: World,
        policy: PolicySpec,
        jobs: Sequence[TraceJob],
        *,
        record_admissions: bool = False,
    ) -> None:
        self.config = config
        self.policy = policy
        self.fifo = policy.fifo
        self.policy_config: PolicyConfig = policy.policy_config(config)
        self.allow_spot = policy.allows_spot(config)
        self.sees_resumable = policy.sees_resumable(config)
        self.pools = [
            p
            for p in world.pools
            if p.is_private or (policy.uses_cloud and (self.allow_spot or p.kind is not CapacityKind.SPOT))
        ]
        self.by_offer = {(p.cluster, p.name): p for p in self.pools}
        self.free: dict[tuple[str, str], list[int]] = {
            (p.cluster, p.name): [p.gpus_per_node] * p.nodes for p in self.pools if p.is_private
        }
        self.cloud_used: dict[tuple[str, str], int] = {
            (p.cluster, p.name): 0 for p in self.pools if not p.is_private
        }
        self.teams = world.teams if not self.fifo else ()
        if policy.cost_policy is not CostPolicy.BALANCED:
            self.teams = tuple(replace(team, cost_policy=policy.cost_policy) for team in self.teams)
        self.jobs = {j.job_id: j for j in jobs}
        self.queue: dict[JobId, GangRequest] = {}
        self.running: dict[JobId, _Run] = {}
        self.events: list[tuple[float, int, int, JobId, int]] = []
        self.seq = 0
        self.woken: set[tuple[JobId, float]] = set()
        # Jobs whose deadline is no longer given to the placer (it found the deadline unmeetable).
        self.deadline_dropped: set[JobId] = set()
        self.result = Result(policy.name, world.private_gpus, {j.job_id: JobOutcome(j) for j in jobs}, [])
        self.record = record_admissions
        self.speeds = tuple(sorted(config.gpu_speeds))
        for job in jobs:
            self._push(job.submit_time_s, Ev.ARRIVAL, job.job_id)

    def _request(self, job: TraceJob, queued_at_s: float) -> GangRequest:
        return gang_request(
            job,
            self.config,
            fifo=self.fifo,
            queued_at_s=queued_at_s,
            allow_spot=self.allow_spot,
            deadline=self.policy.sees_deadlines and job.job_id not in self.deadline_dropped,
            resumable=self.sees_resumable,
        )

    def _push(self, at_s: float, kind: Ev, job_id: JobId, attempt: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at_s, int(kind), self.seq, job_id, attempt))

    # -- the loop

    def run(self) -> Result:
        cycle_s = self.config.cycle_s
        last = -math.inf
        while self.events:
            first = self.events[0][0]
            now = math.ceil(first / cycle_s) * cycle_s if cycle_s > 0 else first
            now = max(now, last + cycle_s) if cycle_s > 0 else max(now, last)
            changed = False
            while self.events and self.events[0][0] <= now:
                at, kind, _, job_id, attempt = heapq.heappop(self.events)
                changed = self._apply(Ev(kind), job_id, attempt, at) or changed
            # With repatriation on, a cycle also runs on an empty queue: freed private GPUs may take a
            # cloud gang.
            if changed and (self.queue or self._may_move()):
                started = time.perf_counter()
                decided = plan(self._snapshot(), now=now)
                self.result.plan_s += time.perf_counter() - started
                self.result.cycles += 1
                last = now
                self._carry_out(decided, now)
            self._after_step(now)
        return self.result

    def _after_step(self, now: float) -> None:
        """Called once the events up to `now` are applied and its cycle (if any) carried out: a
        hook for measurements over the replay (bench/repatriate_potential.py); nothing here."""

    def _apply(self, kind: Ev, job_id: JobId, attempt: int, at: float) -> bool:
        if kind is Ev.ARRIVAL:
            job = self.jobs[job_id]
            self.queue[job_id] = self._request(job, job.submit_time_s)
            return True
        if kind is Ev.WAKE:
            return job_id in self.queue
        run = self.running.get(job_id)
        if run is None or run.attempt != attempt:
            return False
        if kind is Ev.FINISH:
            self._end(job_id, run, at, completed=True)
            return True
        # GONE (a victim's grace is over) or RECLAIM (a spot node was taken back): requeue, from scratch
        # unless a reclaimed job checkpoints.
        if kind is Ev.RECLAIM and run.start_s > at:
            return False
        self._end(job_id, run, at, completed=False)
        job = self.jobs[job_id]
        if kind is Ev.RECLAIM:
            self.result.reclaims += 1
            if job.resumable:
                self.result.reclaims_resumed += 1
                job = self.jobs[job_id] = self._from_checkpoint(job, run, at)
        self.queue[job_id] = self._request(job, run.gang.queued_at_s)
        return True

    def _from_checkpoint(self, job: TraceJob, run: _Run, at: float) -> TraceJob:
        """What is left of a resumable job reclaimed at `at`: its work less what it did up to its last
        checkpoint, `spot_lost_work_h` of run time before the reclaim (none if it ran less than that)."""
        ran_s = at - run.start_s
        kept_s = max(0.0, ran_s - self.policy_config.spot_lost_work_h * 3600.0)
        done = kept_s * self.config.speed(run.pool.gpu_type)
        return replace(job, duration_s=max(1.0, job.duration_s - done))

    def _end(self, job_id: JobId, run: _Run, at: float, *, completed: bool) -> None:
        del self.running[job_id]
        pool, key = run.pool, (run.pool.cluster, run.pool.name)
        if pool.is_private:
            nodes = self.free[key]
            for node, gpus in run.shares:
                nodes[node] += gpus
        else:
            self.cloud_used[key] -= sum(gpus for _, gpus in run.shares)
        outcome = self.result.outcomes[job_id]
        if run.start_s < at:
            self.result.intervals.append(
                Interval(
                    job_id,
                    outcome.job.tenant,
                    pool.cluster,
                    pool.gpu_type,
                    pool.is_private,
                    outcome.job.num_gpus,
                    run.start_s,
                    at,
                    pool.usd_per_gpu_hour,
                    completed,
                )
            )
        if completed:
            outcome.start_s, outcome.finish_s = run.start_s, at
            outcome.cluster, outcome.gpu_type, outcome.private = pool.cluster, pool.gpu_type, pool.is_private

    # -- snapshot and plan

    def _snapshot(self) -> Snapshot:
        clusters: dict[ClusterName, list[NodePool]] = {}
        meta: dict[ClusterName, PoolDef] = {}
        for pool in self.pools:
            key = (pool.cluster, pool.name)
            if pool.is_private:
                free = tuple(self.free[key])
            else:
                # Elastic: the GPUs not yet bought, as whole nodes and one partial node.
                whole, rest = divmod(
                    max(0, pool.nodes * pool.gpus_per_node - self.cloud_used[key]), pool.gpus_per_node
                )
                free = (pool.gpus_per_node,) * whole + ((rest,) if rest else ())
            clusters.setdefault(pool.cluster, []).append(
                NodePool(
                    pool.name,
                    pool.gpu_type,
                    pool.kind,
                    pool.usd_per_gpu_hour,
                    pool.gpus_per_node,
                    free,
                    pool.restart_risk_per_hour,
                )
            )
            meta.setdefault(pool.cluster, pool)
        return Snapshot(
            queued=tuple(self.queue.values()),
            running=tuple(run.gang for run in self.running.values()),
            tenants=self.teams or (TenantQuota(FIFO_TENANT),),
            clusters=tuple(
                ClusterState(name, meta[name].provider, meta[name].region, tuple(pools))
                for name, pools in clusters.items()
            ),
            gpu_speeds=self.speeds,
            policy=self.policy_config,
        )

    def _carry_out(self, decided: Plan, now: float) -> None:
        for preemption in decided.preemptions:
            run = self.running.get(preemption.victim)
            if run is None or run.leaving:
                continue
            run.leaving = True
            run.gang = replace(run.gang, terminating=True)
            self.result.outcomes[preemption.victim].preemptions += 1
            self._push(now + preemption.grace_period_s, Ev.GONE, preemption.victim, run.attempt)
        admitted = []
        for admission in decided.admissions:
            pool = self._pool_for(
                admission.cluster, admission.gpu_type, admission.kind, admission.usd_per_gpu_hour
            )
            request = self.queue.get(admission.job_id)
            if pool is None or request is None or not self._start(request, pool, now):
                self.result.placement_mismatches += 1
                continue
            admitted.append(admission.job_id)
        if self.record and admitted:
            self.result.admissions_by_cycle.append((now, tuple(admitted)))
        for move in decided.moves:
            if not self._move(move, now):
                self.result.placement_mismatches += 1
        for waiting in decided.waiting:
            for reason in waiting.reasons:
                if reason.code is WaitCode.DEADLINE_UNMEETABLE:
                    self._drop_deadline(waiting.job_id, now)
                elif reason.code is WaitCode.WAITING_FOR_PRIVATE_CAPACITY and reason.at_s is not None:
                    key = (waiting.job_id, reason.at_s)
                    if key not in self.woken:
                        self.woken.add(key)
                        self._push(reason.at_s, Ev.WAKE, waiting.job_id)

    def _drop_deadline(self, job_id: JobId, now: float) -> None:
        """The job runs without its deadline from the next cycle on (see the module's docstring)."""
        request = self.queue.get(job_id)
        if request is None or request.deadline_at_s is None:
            return
        self.deadline_dropped.add(job_id)
        self.result.deadlines_dropped += 1
        self.queue[job_id] = replace(request, deadline_at_s=None)
        self._push(now, Ev.WAKE, job_id)

    def _move(self, move: Move, now: float) -> bool:
        """Stop a cloud gang now (billed until now) and restart the rest of its work on private GPUs.

        The job keeps its progress minus the move's overhead (`move_overhead_s`: checkpoint write,
        restart and restore, as work done again on the new GPUs). Its run-time limit is what the
        placer counted on: the limit left plus the overhead.
        """
        run = self.running.get(move.job_id)
        pool = self._pool_for(move.to_cluster, move.to_gpu_type, move.to_kind, move.to_usd_per_gpu_hour)
        if run is None or run.leaving or run.pool.is_private or run.start_s > now or pool is None:
            return False
        if not pool.is_private:
            return False
        job = self.jobs[move.job_id]
        done = (now - run.start_s) * self.config.speed(run.pool.gpu_type)
        overhead_work = self.policy_config.move_overhead_s * self.config.speed(pool.gpu_type)
        rest = replace(job, duration_s=max(0.0, job.duration_s - done) + overhead_work)
        self._end(move.job_id, run, now, completed=False)
        self.jobs[move.job_id] = rest
        request = self._request(rest, run.gang.queued_at_s)
        if move.max_runtime_s > 0:
            request = replace(request, max_runtime_s=math.ceil(move.max_runtime_s))
        self.queue[move.job_id] = request
        if not self._start(request, pool, now):
            # The placer's room was not there: the job waits in the queue with its progress kept.
            return False
        self.result.moves += 1
        self.result.move_saving_usd += move.saving_usd
        return True

    def _may_move(self) -> bool:
        return self.policy_config.repatriate and any(run.gang.movable for run in self.running.values())

    def _movable(self, job_id: JobId) -> bool:
        """Whether the job may be moved: as the server marks it (`snapshot`: the manifest says
        `resumable: true`), the job is one the replay drew resumable (`jobs.resumable`), and its
        run-time limit is at least `jobs.movable_min_runtime_h`. Before, every job was taken to be
        movable whatever its draw, so the replay moved jobs the leader would never move."""
        if not self.policy_config.repatriate:
            return False
        original = self.result.outcomes[job_id].job
        if not original.resumable:
            return False
        limit_h = original.duration_s * self.config.runtime_limit_factor / 3600.0
        return limit_h >= self.config.movable_min_runtime_h

    def _pool_for(self, cluster: str, gpu_type: str, kind: object, price: float) -> PoolDef | None:
        for pool in self.pools:
            if pool.cluster == cluster and pool.gpu_type == gpu_type and pool.kind == kind:
                return pool
        return None

    def _start(self, request: GangRequest, pool: PoolDef, now: float) -> bool:
        key = (pool.cluster, pool.name)
        shares: list[tuple[int, int]] = []
        if pool.is_private:
            fitted = best_fit(self.free[key], request.replica_gpus)
            if fitted is None:
                return False
            shares = fitted
            start = now
        else:
            if self.cloud_used[key] + request.gpu_count > pool.nodes * pool.gpus_per_node:
                return False
            self.cloud_used[key] += request.gpu_count
            shares = [(-1, gpus) for gpus in sorted(request.replica_gpus, reverse=True)]
            start = now + self.config.lead_time_s
        job_id = request.job_id
        job = self.jobs[job_id]
        outcome = self.result.outcomes[job_id]
        outcome.attempts += 1
        speed = self.config.speed(pool.gpu_type)
        finish = start + job.duration_s / speed
        gang = RunningGang(
            job_id=job_id,
            tenant=request.tenant,
            priority=request.priority,
            cluster=pool.cluster,
            gpu_type=pool.gpu_type,
            gpu_count=request.gpu_count,
            queued_at_s=request.queued_at_s,
            ends_at_s=start + request.max_runtime_s,
            nodes=tuple(NodeShare(pool.name, n, g) for n, g in shares) if pool.is_private else (),
            kind=pool.kind,
            usd_per_gpu_hour=pool.usd_per_gpu_hour,
            replica_gpus=request.replica_gpus,
            gpu_types=request.gpu_types,
            started_at_s=start,
            expected_runtime_s=request.expected_runtime_s,
            movable=not pool.is_private and self._movable(job_id),
        )
        del self.queue[job_id]
        self.running[job_id] = _Run(pool, shares, now, start, finish, outcome.attempts, gang)
        self._push(finish, Ev.FINISH, job_id, outcome.attempts)
        if pool.restart_risk_per_hour > 0:
            rng = random.Random(f"{self.config.seed}:{job_id}:{outcome.attempts}")
            reclaim = start + rng.expovariate(pool.restart_risk_per_hour * len(shares) / 3600.0)
            if reclaim < finish:
                self._push(reclaim, Ev.RECLAIM, job_id, outcome.attempts)
        return True


def simulate(
    config: ReplayConfig, world: World, policy: PolicySpec, jobs: Sequence[TraceJob], *, record: bool = False
) -> Result:
    return Simulator(config, world, policy, jobs, record_admissions=record).run()
