"""Provisioners without a cloud: in memory for unit tests, and one that resizes simulated clusters.

`SimulatedProvisioner` stands in for Pulumi on the embedded default: a scale-up becomes real nodes in
a simulated cluster after the configured lead time (as a cloud takes minutes to boot GPU nodes), a
scale-down removes idle nodes at once. It reaches the cluster through a `PoolResizer`, so `iac` does
not depend on `clusters`; `HttpPoolResizer` uses the simulator's admin API over loopback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

import aiohttp

from iac.api import ChangePreview, ChangeResult, PermanentIacError, RetryableIacError, usd_per_hour
from iac.pools import PoolSpec, validate


class PoolResizer(Protocol):
    async def add_nodes(self, cluster: str, pool: str, count: int) -> None: ...

    async def remove_nodes(self, cluster: str, pool: str, count: int) -> None:
        """Remove `count` nodes, the emptiest first (the caller only removes idle ones)."""
        ...


class InMemoryProvisioner:
    """Records every operation and holds each pool's node count; for unit tests."""

    def __init__(self, *, lead_time_s: float = 0.0, clock: Callable[[], float] = time.time) -> None:
        self.nodes: dict[str, int] = {}
        self.operations: list[tuple[str, str, int]] = []
        self._lead_time_s = lead_time_s
        self._clock = clock

    async def preview(self, spec: PoolSpec, nodes: int) -> ChangePreview:
        spec = validate(spec)
        before = self.nodes.get(spec.pool_id, 0)
        self.operations.append(("preview", spec.pool_id, nodes))
        return ChangePreview(
            spec.pool_id, before, nodes, usd_per_hour(spec, before), usd_per_hour(spec, nodes)
        )

    async def apply(self, spec: PoolSpec, nodes: int) -> ChangeResult:
        spec = validate(spec)
        self.operations.append(("apply", spec.pool_id, nodes))
        self.nodes[spec.pool_id] = nodes
        return ChangeResult(spec.pool_id, nodes, self._clock() + self._lead_time_s)

    async def destroy(self, spec: PoolSpec) -> None:
        self.operations.append(("destroy", spec.pool_id, 0))
        self.nodes.pop(spec.pool_id, None)

    async def refresh(self, spec: PoolSpec) -> int:
        return self.nodes.get(spec.pool_id, 0)


class SimulatedProvisioner:
    """Scales simulated clusters' pools: up after the lead time, down at once."""

    def __init__(
        self,
        resizer: PoolResizer,
        *,
        lead_time_s: float,
        initial_nodes: dict[str, int] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._resizer = resizer
        self._lead_time_s = lead_time_s
        self._clock = clock
        # What the pool will have once pending scale-ups land (the target), and what it has now.
        self.target: dict[str, int] = dict(initial_nodes or {})
        self.ready: dict[str, int] = dict(initial_nodes or {})
        self._pending: set[asyncio.Task[None]] = set()
        self._locks: dict[str, asyncio.Lock] = {}

    async def preview(self, spec: PoolSpec, nodes: int) -> ChangePreview:
        spec = validate(spec)
        before = self.target.get(spec.pool_id, 0)
        return ChangePreview(
            spec.pool_id, before, nodes, usd_per_hour(spec, before), usd_per_hour(spec, nodes)
        )

    async def apply(self, spec: PoolSpec, nodes: int) -> ChangeResult:
        spec = validate(spec)
        lock = self._locks.setdefault(spec.pool_id, asyncio.Lock())
        async with lock:
            before = self.target.get(spec.pool_id, 0)
            self.target[spec.pool_id] = nodes
            if nodes < before:
                await self._resize(spec, nodes - before)
                return ChangeResult(spec.pool_id, nodes, self._clock())
            if nodes > before:
                task = asyncio.create_task(self._grow_later(spec, nodes - before))
                self._pending.add(task)
                task.add_done_callback(self._pending.discard)
            return ChangeResult(spec.pool_id, nodes, self._clock() + self._lead_time_s)

    async def _grow_later(self, spec: PoolSpec, count: int) -> None:
        await asyncio.sleep(self._lead_time_s)
        await self._resize(spec, count)

    async def _resize(self, spec: PoolSpec, delta: int) -> None:
        try:
            if delta > 0:
                await self._resizer.add_nodes(spec.cluster, spec.name, delta)
            elif delta < 0:
                await self._resizer.remove_nodes(spec.cluster, spec.name, -delta)
        except (aiohttp.ClientError, TimeoutError) as error:
            raise RetryableIacError(
                f"{spec.pool_id}: the simulated cluster did not answer: {error}"
            ) from error
        self.ready[spec.pool_id] = self.ready.get(spec.pool_id, 0) + delta

    async def destroy(self, spec: PoolSpec) -> None:
        await self.apply(spec, 0)

    async def refresh(self, spec: PoolSpec) -> int:
        return self.ready.get(spec.pool_id, 0)

    async def close(self) -> None:
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)


class HttpPoolResizer:
    """Adds and removes nodes of a simulated cluster through its `/sim/v1/` admin API (loopback)."""

    def __init__(self, admin_urls: dict[str, str], *, timeout_s: float = 10.0) -> None:
        self._urls = admin_urls
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    def _url(self, cluster: str, pool: str) -> str:
        base = self._urls.get(cluster)
        if base is None:
            raise PermanentIacError(f"no simulated cluster {cluster!r}")
        return f"{base.rstrip('/')}/sim/v1/pools/{pool}/nodes"

    async def add_nodes(self, cluster: str, pool: str, count: int) -> None:
        async with (
            aiohttp.ClientSession(timeout=self._timeout) as session,
            session.post(self._url(cluster, pool), json={"count": count}) as reply,
        ):
            if reply.status >= 400:
                raise PermanentIacError(f"{cluster}/{pool}: adding nodes answered {reply.status}")

    async def remove_nodes(self, cluster: str, pool: str, count: int) -> None:
        async with (
            aiohttp.ClientSession(timeout=self._timeout) as session,
            session.delete(self._url(cluster, pool), params={"count": str(count)}) as reply,
        ):
            if reply.status >= 400:
                raise PermanentIacError(f"{cluster}/{pool}: removing nodes answered {reply.status}")
