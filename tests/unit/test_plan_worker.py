"""The leader's plan is made in a worker process, not the server's (issue 30, item 15).

A plan over a long queue on a thread of the server's process held the GIL the API's event loop
needs: another tenant's reads slowed down. The worker must plan what the in-thread plan plans, be
replaced when it dies (that cycle fails once, the next plans), and be given up on at its deadline
when it hangs, never waited for.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing.connection import Connection

import pytest

from bench.placer_scenario import NOW, build
from federation.scheduling.plan_worker import PlanWorker, PlanWorkerFailed
from placement.model import Plan, Snapshot
from placement.plan import plan


def hangs(snapshot: Snapshot, *, now: float) -> Plan:
    """A plan that never returns (in the worker process)."""
    while True:
        time.sleep(1)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def snapshot() -> Snapshot:
    return build(gangs=300)


@pytest.fixture
def worker() -> Iterator[PlanWorker]:
    w = PlanWorker(deadline_s=20.0)
    yield w
    w.stop()


def same(a: Plan, b: Plan) -> None:
    assert a.admissions == b.admissions
    assert a.preemptions == b.preemptions
    assert a.moves == b.moves
    assert [w.job_id for w in a.waiting] == [w.job_id for w in b.waiting]
    assert [w.reasons for w in a.waiting] == [w.reasons for w in b.waiting]


async def test_plans_in_another_process_what_the_thread_plans(worker: PlanWorker, snapshot: Snapshot) -> None:
    first = await worker.plan(snapshot, NOW)
    assert worker.pid is not None
    assert worker.pid != os.getpid()
    same(first, plan(snapshot, now=NOW))
    # Again, with only what changed sent: a queue without its first half, and later.
    later = replace(snapshot, queued=snapshot.queued[len(snapshot.queued) // 2 :])
    same(await worker.plan(later, NOW + 60), plan(later, now=NOW + 60))
    same(await worker.plan(snapshot, NOW + 120), plan(snapshot, now=NOW + 120))


async def test_a_killed_worker_is_replaced_and_the_next_cycle_plans(
    worker: PlanWorker, snapshot: Snapshot
) -> None:
    await worker.plan(snapshot, NOW)
    killed = worker.pid
    assert killed is not None
    os.kill(killed, signal.SIGKILL)
    # The cycle that finds it dead fails at most once, with the error the leader retries after.
    with contextlib.suppress(PlanWorkerFailed):
        await worker.plan(snapshot, NOW + 1)
    same(await worker.plan(snapshot, NOW + 2), plan(snapshot, now=NOW + 2))
    assert worker.pid not in (None, killed, os.getpid())


async def test_a_hung_worker_is_given_up_on_at_the_deadline(snapshot: Snapshot) -> None:
    worker = PlanWorker(deadline_s=3.0, plan_function=hangs)
    try:
        started = time.monotonic()
        with pytest.raises(PlanWorkerFailed, match=r"did not answer within 3\.0 s"):
            await worker.plan(snapshot, NOW)
        assert time.monotonic() - started < 8.0
        assert worker.pid is None
    finally:
        worker.stop()


async def test_the_hung_worker_is_killed(snapshot: Snapshot) -> None:
    worker = PlanWorker(deadline_s=3.0, plan_function=hangs)
    pids: list[int] = []
    real_start = worker._start

    def start() -> Connection:
        conn = real_start()
        assert worker.pid is not None
        pids.append(worker.pid)
        return conn

    worker._start = start  # type: ignore[method-assign]  # to see the pid of each worker started
    with pytest.raises(PlanWorkerFailed):
        await worker.plan(snapshot, NOW)
    assert pids
    assert not alive(pids[0])
