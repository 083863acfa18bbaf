"""The leader's plan, made in a process of its own so that it never holds the API's GIL.

`placement.plan` over a long queue is seconds of pure CPU. On a thread of the server's process it
competed with the event loop, and every API call, for the GIL: with 20,000 of one tenant's jobs
queued, another tenant's ListJobs p99 rose by half (bench/listjobs_queue.py). Here one long-lived
worker process plans; the server's side only sends and receives.

Pickling is not free either: the whole snapshot at 20,000 queued gangs took 240 ms to pickle and the
whole plan 340 ms to unpickle, in the server's process, each cycle. So both ends keep the last
cycle's values and only what changed crosses the pipe: queued gangs whose `GangRequest` is not the
very object sent before (the scheduler rebuilds one only when its job or the inputs change), and
waits whose `Waiting.key` changed. The order of each (job ids) is sent in full, which is cheap.

Any failure (the worker died, missed the deadline, or the pipe broke) kills the worker and forgets
both ends' state: that cycle fails with `PlanWorkerFailed` (logged, retried next cycle like an etcd
hiccup), and the next call starts a fresh worker and sends everything again. A worker that hangs is
given up on at the deadline, never waited for.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
from collections.abc import Hashable
from dataclasses import dataclass, replace
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from typing import Literal, Protocol

import structlog

from federation.errors import GpufedError
from placement.model import GangRequest, JobId, Plan, Snapshot, Waiting
from placement.plan import plan

log = structlog.get_logger("gpufed.plan_worker")

# Far above a real plan (about 1 s at 20,000 queued gangs, and a fresh worker's imports), well below
# forever: a hung worker costs the leader one cycle of this, then it is replaced.
PLAN_DEADLINE_S = 60.0
# After a kill the process is reaped within this; a worker that will not go is left to init.
_JOIN_S = 2.0


class PlanFunction(Protocol):
    def __call__(self, snapshot: Snapshot, *, now: float) -> Plan: ...


class PlanWorkerFailed(GpufedError):
    """The plan worker died, hung past its deadline, or the pipe to it broke: this cycle planned nothing."""

    retryable = True


@dataclass(frozen=True, slots=True)
class _Request:
    # Queued gangs new or changed since the last request, and every queued job's id in order.
    changed: tuple[GangRequest, ...]
    queued_order: tuple[JobId, ...]
    # The snapshot without its queue.
    rest: Snapshot
    now: float


@dataclass(frozen=True, slots=True)
class _Reply:
    # The plan without its waits; the waits whose key changed, worded; every waiting job's id in order.
    plan: Plan
    changed: tuple[Waiting, ...]
    waiting_order: tuple[JobId, ...]


def _serve(conn: multiprocessing.connection.Connection, plan_function: PlanFunction) -> None:
    """The worker's loop: the last cycle's queue and wait keys, updated by each request."""
    queued: dict[JobId, GangRequest] = {}
    keys: dict[JobId, Hashable] = {}
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return  # the server closed its end (or died): nothing left to plan for
        if request is None:
            return
        assert isinstance(request, _Request)
        try:
            for gang in request.changed:
                queued[gang.job_id] = gang
            snapshot = replace(request.rest, queued=tuple(queued[j] for j in request.queued_order))
            queued = {g.job_id: g for g in snapshot.queued}
            result = plan_function(snapshot, now=request.now)
            changed = tuple(w for w in result.waiting if keys.get(w.job_id, _NONE) != w.key)
            keys = {w.job_id: w.key for w in result.waiting}
            reply: _Reply | BaseException = _Reply(
                plan=replace(result, waiting=()),
                changed=changed,
                waiting_order=tuple(w.job_id for w in result.waiting),
            )
        except Exception as error:  # a bug in the plan: the server raises it as it would in-thread
            reply = error
            queued, keys = {}, {}
        conn.send(reply)


_NONE = object()


class PlanWorker:
    """One worker process that plans; started on first use, stopped with the leader's term."""

    def __init__(
        self,
        *,
        deadline_s: float = PLAN_DEADLINE_S,
        plan_function: PlanFunction = plan,
        # spawn: a fresh interpreter (never a fork of a process with gRPC's threads), and the
        # server's direct child.
        start_method: Literal["spawn", "forkserver"] = "spawn",
    ) -> None:
        self._deadline_s = deadline_s
        self._plan_function = plan_function
        self._context: SpawnContext | ForkServerContext = (
            multiprocessing.get_context("spawn")
            if start_method == "spawn"
            else multiprocessing.get_context("forkserver")
        )
        self._process: BaseProcess | None = None
        self._conn: multiprocessing.connection.Connection | None = None
        # What the worker holds: the queued gangs last sent (compared by identity), the waits last
        # received.
        self._sent: dict[JobId, GangRequest] = {}
        self._waiting: dict[JobId, Waiting] = {}

    @property
    def pid(self) -> int | None:
        """The worker's process id (None: not running)."""
        return None if self._process is None else self._process.pid

    def _start(self) -> multiprocessing.connection.Connection:
        ours, theirs = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=_serve, args=(theirs, self._plan_function), name="gpufed-plan-worker", daemon=True
        )
        process.start()
        theirs.close()
        self._process, self._conn = process, ours
        self._sent, self._waiting = {}, {}
        log.info("plan_worker_started", pid=process.pid)
        return ours

    def stop(self) -> None:
        """Kill the worker (it holds nothing worth saving) and forget what it held."""
        process, conn = self._process, self._conn
        self._process, self._conn = None, None
        self._sent, self._waiting = {}, {}
        if conn is not None:
            conn.close()
        if process is not None:
            if process.is_alive():
                process.kill()
            process.join(_JOIN_S)
            log.info("plan_worker_stopped", pid=process.pid, exitcode=process.exitcode)

    async def plan(self, snapshot: Snapshot, now: float) -> Plan:
        try:
            return await asyncio.wait_for(self._plan(snapshot, now), timeout=self._deadline_s)
        except TimeoutError:
            pid = self.pid
            self.stop()
            log.error("plan_worker_timed_out", pid=pid, deadline_s=self._deadline_s)
            raise PlanWorkerFailed(f"the plan worker did not answer within {self._deadline_s} s") from None
        except (EOFError, OSError) as error:
            pid = self.pid
            self.stop()
            log.error("plan_worker_failed", pid=pid, error=repr(error))
            raise PlanWorkerFailed(f"the plan worker failed: {error!r}") from error
        except BaseException:
            # Cancelled mid-call (or the plan raised): the worker's state may be ahead of ours.
            self.stop()
            raise

    async def _plan(self, snapshot: Snapshot, now: float) -> Plan:
        conn = self._conn
        if conn is None or self._process is None or not self._process.is_alive():
            if self._process is not None:
                log.warning("plan_worker_died", pid=self._process.pid, exitcode=self._process.exitcode)
                self.stop()
            conn = self._start()
        sent = self._sent
        changed = tuple(q for q in snapshot.queued if sent.get(q.job_id) is not q)
        request = _Request(
            changed=changed,
            queued_order=tuple(q.job_id for q in snapshot.queued),
            rest=replace(snapshot, queued=()),
            now=now,
        )
        # Pickled and unpickled on worker threads: the event loop runs meanwhile.
        await asyncio.to_thread(conn.send, request)
        self._sent = {q.job_id: q for q in snapshot.queued}
        reply = await asyncio.to_thread(_receive, conn)
        if isinstance(reply, BaseException):
            raise reply
        assert isinstance(reply, _Reply)
        waiting = self._waiting
        for w in reply.changed:
            waiting[w.job_id] = w
        ordered = tuple(waiting[j] for j in reply.waiting_order)
        self._waiting = {w.job_id: w for w in ordered}
        return replace(reply.plan, waiting=ordered)


def _receive(conn: multiprocessing.connection.Connection) -> object:
    """The reply, polled in steps so that a thread never blocks past a kill of the worker."""
    while not conn.poll(0.5):
        pass
    return conn.recv()
