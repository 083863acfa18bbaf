"""The member clusters' shared pool of threads and each cluster's lane on it (clusters.kubernetes.threads).

One pool serves every cluster's blocking calls (a pool per cluster gave the server about 2,800
threads at 100 clusters), so what a pool per cluster guaranteed must hold lane by lane:
- a cluster has at most its bound of calls on threads, the rest wait without a thread;
- a hung cluster holds its bound of threads and no more, and another cluster's calls still run;
- a caller that gives up does not free its slot while its call still holds a thread;
- close waits for the calls on threads and refuses new ones;
- the threads are shared: calls of many clusters one after another reuse one thread;
- results that end while the loop is busy reach it with one wake-up, not one each.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from clusters.kubernetes import threads
from clusters.kubernetes.threads import MAX_THREADS, Lane, shared_pool
from tests.waits import until


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    # A pool like the shared one (its ceiling far above the lanes'), of this test's own, so that the
    # threads counted are this test's.
    executor = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="lane-test")
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


class Gate:
    """A blocking call that holds its thread until the test opens the gate (a hung API)."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.entered = 0
        self.most_at_once = 0
        self._in = 0
        self._lock = threading.Lock()

    def call(self, value: int) -> int:
        with self._lock:
            self.entered += 1
            self._in += 1
            self.most_at_once = max(self.most_at_once, self._in)
        try:
            if not self.opened.wait(timeout=30.0):
                raise TimeoutError("the test never opened the gate")
            return value
        finally:
            with self._lock:
                self._in -= 1


async def test_a_lane_has_at_most_its_bound_of_calls_on_threads(pool: ThreadPoolExecutor) -> None:
    lane = Lane("slow api", 3, pool)
    gate = Gate()
    calls = [asyncio.create_task(lane.run(gate.call, i)) for i in range(10)]
    await until(lambda: gate.entered == 3, "three calls on threads")
    await asyncio.sleep(0)  # the other seven had their turn on the loop: they wait for a slot
    assert gate.entered == 3
    assert lane.busy == 3
    gate.opened.set()
    assert await asyncio.gather(*calls) == list(range(10))
    assert gate.most_at_once == 3
    assert lane.busy == 0


async def test_a_hung_cluster_holds_its_bound_of_threads_and_another_clusters_calls_still_run(
    pool: ThreadPoolExecutor,
) -> None:
    hung, other = Lane("hung api", 4, pool), Lane("other api", 4, pool)
    gate = Gate()
    stuck = [asyncio.create_task(hung.run(gate.call, i)) for i in range(50)]
    await until(lambda: gate.entered == 4, "the hung cluster's calls on threads")
    # The other cluster's calls are not queued behind the hung one's 46 waiting calls.
    assert await asyncio.gather(*(other.run(lambda i=i: i * 2) for i in range(20))) == [
        i * 2 for i in range(20)
    ]
    assert gate.entered == 4
    # Threads: the hung calls' four, and those the other cluster's calls took, never the 50 of a
    # thread each that a pool with room for them would have started.
    assert len(pool._threads) <= 4 + 20
    gate.opened.set()
    assert await asyncio.gather(*stuck) == list(range(50))


async def test_a_caller_that_gives_up_keeps_its_slot_until_its_thread_is_done(
    pool: ThreadPoolExecutor,
) -> None:
    lane = Lane("hung api", 2, pool)
    gate = Gate()
    first = [asyncio.create_task(lane.run(gate.call, i)) for i in range(2)]
    await until(lambda: gate.entered == 2, "two calls on threads")
    for task in first:
        task.cancel()
    for task in first:
        with pytest.raises(asyncio.CancelledError):
            await task
    # Callers that timed out and called again: their first calls still hold the two threads.
    again = [asyncio.create_task(lane.run(gate.call, i)) for i in range(2)]
    await asyncio.sleep(0)
    assert gate.entered == 2
    assert lane.busy == 2
    gate.opened.set()
    assert await asyncio.gather(*again) == [0, 1]
    await until(lambda: lane.busy == 0, "every slot freed")


async def test_a_waiting_call_cancelled_before_it_had_a_thread_frees_nothing_twice(
    pool: ThreadPoolExecutor,
) -> None:
    lane = Lane("api", 1, pool)
    gate = Gate()
    running = asyncio.create_task(lane.run(gate.call, 1))
    await until(lambda: gate.entered == 1, "the first call on its thread")
    waiting = asyncio.create_task(lane.run(gate.call, 2))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    gate.opened.set()
    assert await running == 1
    # One slot, still one: two calls now run one after the other, never together.
    gate.most_at_once = 0
    assert list(await asyncio.gather(lane.run(gate.call, 3), lane.run(gate.call, 4))) == [3, 4]
    assert gate.most_at_once == 1


async def test_an_error_in_the_call_reaches_its_caller_and_frees_the_slot(pool: ThreadPoolExecutor) -> None:
    lane = Lane("api", 1, pool)

    def refused() -> None:
        raise ConnectionRefusedError("no answer")

    with pytest.raises(ConnectionRefusedError):
        await lane.run(refused)
    assert lane.busy == 0
    assert await lane.run(lambda: "next") == "next"


async def test_close_waits_for_the_calls_on_threads_and_refuses_new_ones(pool: ThreadPoolExecutor) -> None:
    lane = Lane("api", 1, pool)
    gate = Gate()
    running = asyncio.create_task(lane.run(gate.call, 1))
    await until(lambda: gate.entered == 1, "the call on its thread")
    waiting = asyncio.create_task(lane.run(gate.call, 2))
    closing = asyncio.create_task(lane.close())
    await asyncio.sleep(0)
    assert not closing.done()
    gate.opened.set()
    assert await closing is True
    assert await running == 1
    with pytest.raises(RuntimeError, match="closed"):
        await waiting
    with pytest.raises(RuntimeError, match="closed"):
        await lane.run(gate.call, 3)
    assert gate.entered == 1


async def test_calls_of_many_clusters_one_after_another_reuse_the_pools_threads(
    pool: ThreadPoolExecutor,
) -> None:
    lanes = [Lane(f"cluster-{i} api", 16, pool) for i in range(100)]
    for lane in lanes:
        assert await lane.run(threading.get_ident) is not None
    # A pool per cluster started a thread for each of the 100; here the calls found one idle (a
    # worker counts itself idle just after its call's result is out, so a call may start a second
    # thread, or a few on a loaded machine).
    assert len(pool._threads) <= 4


def test_a_lane_bound_below_one_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="lane cluster-a api: the bound must be at least 1, not 0"):
        Lane("cluster-a api", 0)


async def test_the_shared_pool_is_one_for_the_process_and_its_threads_are_not_a_backends() -> None:
    assert shared_pool() is shared_pool()
    name = await Lane("api", 1).run(lambda: threading.current_thread().name)
    assert not name.startswith("gpufed-")


def hold_the_loop_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Block the calling thread (the event loop's) until `condition` holds: a loop busy meanwhile."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.001)


async def test_results_that_end_while_the_loop_is_busy_reach_it_with_one_wake_up(
    pool: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each wake-up of the loop from a call's thread is a write to its wake-up socket, which gives the
    # GIL up and takes it back from a busy loop; the results of calls that end while the loop is busy
    # go with one.
    loop = asyncio.get_running_loop()
    wake_ups = 0
    wake = loop.call_soon_threadsafe

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal wake_ups
        wake_ups += 1
        return wake(*args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    lane = Lane("api", 8, pool)
    gate = Gate()

    def fails() -> None:
        gate.call(0)
        raise ConnectionRefusedError("no answer")

    calls = [asyncio.create_task(lane.run(gate.call, i)) for i in range(7)]
    failing = asyncio.create_task(lane.run(fails))
    await until(lambda: gate.entered == 8, "eight calls on threads")
    inbox = threads._inbox(loop)
    # The loop is busy (this callback holds it) while every call ends on its thread.
    gate.opened.set()
    hold_the_loop_until(lambda: len(inbox._filed) == 8)
    assert await asyncio.gather(*calls) == list(range(7))
    with pytest.raises(ConnectionRefusedError):
        await failing
    assert wake_ups == 1
    assert lane.busy == 0
    # The next call, ending alone, wakes the loop again.
    assert await lane.run(lambda: "next") == "next"
    assert wake_ups == 2


def test_a_loops_inbox_does_not_keep_the_loop() -> None:
    # The inbox is the loop's value in a weak map: a strong reference back would keep every loop.
    loop = asyncio.new_event_loop()
    try:
        threads._inbox(loop)
        gone = weakref.ref(loop)
    finally:
        loop.close()
    del loop
    gc.collect()
    assert gone() is None
