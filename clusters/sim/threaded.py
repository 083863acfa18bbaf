"""A simulated cluster on its own thread and event loop, for synchronous callers.

The official `kubernetes` client blocks, so a test (or a backend) that uses it from the thread that
runs the simulator's event loop would deadlock. `ThreadedSim` runs the cluster's loop on a daemon
thread; `call` runs a function there (faults, inspections) and returns its result.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from clusters.sim.clock import Clock
from clusters.sim.cluster import SimCluster
from clusters.sim.config import SimClusterConfig

T = TypeVar("T")


class ThreadedSim:
    def __init__(self, config: SimClusterConfig, *, clock: Clock | None = None) -> None:
        """`clock` as `SimCluster` takes it: a test's `ManualClock`; real time (scaled) without one."""
        self.config = config
        self._clock = clock
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"sim-{config.name}", daemon=True)
        self._cluster: SimCluster | None = None

    @property
    def cluster(self) -> SimCluster:
        if self._cluster is None:
            raise RuntimeError("the simulated cluster is not started")
        return self._cluster

    @property
    def url(self) -> str:
        return self.cluster.url

    def start(self) -> None:
        self._thread.start()

        async def start() -> SimCluster:
            cluster = SimCluster(self.config, clock=self._clock)
            await cluster.start()
            return cluster

        self._cluster = asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=30)

    def stop(self) -> None:
        if self._cluster is not None:
            asyncio.run_coroutine_threadsafe(self._cluster.stop(), self._loop).result(timeout=30)
            self._cluster = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """Run `fn(*args)` on the simulator's loop and return what it returned."""
        result: Future[T] = Future()

        def run() -> None:
            try:
                result.set_result(fn(*args))
            except BaseException as exc:
                result.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return result.result(timeout=30)

    def kubeconfig(self, path: str | Path) -> Path:
        return self.call(self.cluster.kubeconfig, path)

    def __enter__(self) -> ThreadedSim:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
