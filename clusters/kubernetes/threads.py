"""One pool of threads for the blocking calls of every member cluster, each cluster bounded by a lane.

The official client's calls block, so each runs on a thread. A pool per cluster (16 API threads, 4
for reads, 8 for log tails) gave the server about 2,800 threads at 100 clusters, each started on
demand during a burst (a non-daemon thread's start walks the lock of every other one) and most of
them idle, waiting to be woken for one call in a hundred. Calls in flight across the whole
federation are far fewer (the reconciler's lanes allow 128), so one shared pool serves them with the
threads that are busy at once, started once and reused by every cluster.

A cluster is still bounded as its own pool bounded it: a `Lane` lets at most `bound` of its calls
hold threads, and the rest wait on the event loop, not on threads. The shared pool starts a thread
whenever every thread is busy (its own ceiling, `MAX_THREADS`, is far above what the lanes allow
together), so a hung or slow cluster holds its lane's threads and no more, and never takes a thread
another cluster's call needs. A call whose caller gave up (cancelled) keeps its slot until its thread
is done with it: a hung API cannot make its cluster hold more threads than its bound by callers that
time out and call again.

Results go back to the event loop in batches (`_Inbox`). Handed back one by one
(`asyncio.wrap_future`), each call's thread ended with `call_soon_threadsafe`, whose write to the
loop's wake-up socket gives the GIL up and takes it back from the busy loop: three or four context
switches a call, and a wake-up of the loop for each. Now a call's thread files its result in its
loop's inbox and wakes the loop only if no wake-up is pending already; the loop takes every result
filed meanwhile in one callback. bench/scale.py at 100 clusters, six pairs in turns with the lane
before (load 4.5-9.9): the server's context switches a job 76.2 against 80.8 (medians; fewer in five
pairs of six), its CPU a job 4.42 ms against 4.45 (within the noise).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

R = TypeVar("R")

# The shared pool's own ceiling: far above the lanes' bounds summed over any federation this server
# runs (28 a cluster), so that it is the lanes that bound, and a thread is started for any call a
# lane lets through. Threads are started only when every one is busy, never in advance.
MAX_THREADS = 8192

SHARED_THREAD_NAME = "k8s-calls"

_shared: ThreadPoolExecutor | None = None
_shared_lock = threading.Lock()


def shared_pool() -> ThreadPoolExecutor:
    """The process's pool for member clusters' blocking calls, made on first use; it lives as long
    as the process (its threads are joined at exit, as every `ThreadPoolExecutor`'s are)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            # Not named "gpufed-...": those are a backend's own threads, which its close() ends
            # (tests/contract's no_leaked_threads); these are the process's, idle between calls.
            _shared = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix=SHARED_THREAD_NAME)
        return _shared


class _Inbox:
    """Calls' results on their way from the pool's threads to one event loop, taken in batches.

    A thread that files a result wakes the loop (`call_soon_threadsafe`) only when no wake-up is
    pending: the results filed before the loop gets to `_deliver` go with the first one's wake-up.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weakly: the inbox is the loop's value in `_inboxes`, which a strong reference back to its
        # key would keep for ever (every test's loop, one after another).
        self._loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._filed: list[tuple[asyncio.Future[Any], Future[Any]]] = []
        self._woken = False

    def file(self, waiter: asyncio.Future[Any], done: Future[Any]) -> None:
        """From the thread that completed `done` (or cancelled it): `waiter` gets its outcome."""
        with self._lock:
            self._filed.append((waiter, done))
            if self._woken:
                return
            self._woken = True
        loop = self._loop()
        try:
            if loop is None:
                raise RuntimeError("the event loop is gone")
            loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:
            # The loop is closed (or gone): nobody is left to await the result.
            with self._lock:
                self._woken = False

    def _deliver(self) -> None:
        with self._lock:
            filed, self._filed = self._filed, []
            self._woken = False
        for waiter, done in filed:
            if waiter.done():  # its caller gave up (cancelled)
                continue
            if done.cancelled():
                waiter.cancel()
                continue
            error = done.exception()
            if error is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(done.result())


# One inbox per event loop (the server runs one; tests run many, one after another).
_inboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Inbox] = weakref.WeakKeyDictionary()


def _inbox(loop: asyncio.AbstractEventLoop) -> _Inbox:
    inbox = _inboxes.get(loop)
    if inbox is None:
        inbox = _inboxes[loop] = _Inbox(loop)
    return inbox


async def _outcome(future: Future[R]) -> R:
    """The result of `future`, a call on a pool's thread, delivered through the loop's inbox."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[R] = loop.create_future()
    inbox = _inbox(loop)
    future.add_done_callback(lambda done: inbox.file(waiter, done))
    try:
        return await waiter
    except asyncio.CancelledError:
        # As `asyncio.wrap_future`: the call is taken back if it has not started.
        future.cancel()
        raise


class Lane:
    """At most `bound` of one cluster's calls (of one kind) on the shared pool's threads at once.

    Used from one event loop. `close` waits for the calls on threads to end (their connection
    pool is closed after it) and refuses new ones.
    """

    def __init__(self, name: str, bound: int, pool: ThreadPoolExecutor | None = None) -> None:
        if bound < 1:
            raise ValueError(f"lane {name}: the bound must be at least 1, not {bound}")
        self.name = name
        self.bound = bound
        self._pool = pool
        self._slots: asyncio.Semaphore | None = None
        self._running: set[Future[Any]] = set()
        self._closed = False

    @property
    def busy(self) -> int:
        """Calls of this lane on threads now (a cancelled one counts until its thread is done)."""
        return len(self._running)

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        """`fn(*args)` on a thread of the shared pool, once the lane has a free slot."""
        if self._closed:
            raise RuntimeError(f"lane {self.name} is closed")
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.bound)
        slots = self._slots
        await slots.acquire()
        try:
            if self._closed:
                raise RuntimeError(f"lane {self.name} is closed")
            pool = self._pool if self._pool is not None else shared_pool()
            future: Future[R] = pool.submit(fn, *args)
        except BaseException:
            slots.release()
            raise
        self._running.add(future)
        try:
            result = await _outcome(future)
        except asyncio.CancelledError:
            # The caller gave up; the call may still hold its thread. Its slot is freed when the
            # thread is done with it (at once if it had not started: the cancel takes it back).
            if future.cancel() or future.done():
                self._done(future)
            else:
                loop = asyncio.get_running_loop()
                future.add_done_callback(lambda f: _call_soon(loop, self._done, f))
            raise
        except BaseException:
            self._done(future)
            raise
        self._done(future)
        return result

    def _done(self, future: Future[Any]) -> None:
        if future in self._running:
            self._running.discard(future)
            assert self._slots is not None
            self._slots.release()

    def refuse(self) -> None:
        """Refuse new calls (and those waiting for a slot); those on threads go on."""
        self._closed = True

    async def close(self, timeout_s: float | None = None) -> bool:
        """Refuse new calls and wait for those on threads to end; False if some outlast `timeout_s`."""
        self.refuse()
        running = [asyncio.wrap_future(f) for f in self._running if not f.done()]
        if not running:
            return True
        done, _ = await asyncio.wait(running, timeout=timeout_s)
        for waited in done:
            if not waited.cancelled():
                waited.exception()  # retrieved: the call's own caller saw it
        return len(done) == len(running)


def _call_soon(
    loop: asyncio.AbstractEventLoop, fn: Callable[[Future[Any]], None], future: Future[Any]
) -> None:
    # From the pool's thread; a loop closed meanwhile has no lane left to free a slot of.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, future)
