"""`SimulatedProvisioner`: node pools of simulated clusters, grown after a lead time like a cloud's.

It stands in for Pulumi on the embedded default and in tests: a scale-up becomes real nodes in a
simulated cluster after the configured lead time (a cloud takes minutes to boot GPU nodes), and is
reported as pending until then; a scale-down first cancels scale-ups that have not landed, then
removes idle nodes at once, newest first. It never removes a node that runs a job: it asks the
resizer which nodes are busy, refuses to go below them (`BusyNodesProtected`), and the resizer
removes a node only if it is still idle when reached.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

import aiohttp
import structlog

from iac.api import (
    ChangePreview,
    ChangeResult,
    Operation,
    PendingOperation,
    PoolStatus,
    check_not_below_busy,
    usd_per_hour,
)
from iac.errors import NetworkError
from iac.pools import PoolSpec, validate
from iac.resize import PoolNodes, PoolResizer

log = structlog.get_logger("gpufed.iac")


@dataclass(slots=True)
class _Growth:
    op: PendingOperation
    count: int
    task: asyncio.Task[None] | None = field(default=None)


class SimulatedProvisioner:
    def __init__(
        self,
        resizer: PoolResizer,
        *,
        lead_time_s: float,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._resizer = resizer
        self._lead_time_s = lead_time_s
        self._clock = clock
        self._sleep = sleep
        self._growths: dict[str, list[_Growth]] = {}
        self._ready: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def _nodes(self, spec: PoolSpec) -> PoolNodes:
        try:
            nodes = await self._resizer.pool_nodes(spec.cluster, spec.name)
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            raise NetworkError(f"{spec.pool_id}: the simulated cluster did not answer: {error}") from error
        self._ready[spec.pool_id] = len(nodes.names)
        return nodes

    def _booting(self, pool_id: str) -> int:
        return sum(g.count for g in self._growths.get(pool_id, ()))

    async def preview(self, spec: PoolSpec, nodes: int) -> ChangePreview:
        spec = validate(spec)
        before = len((await self._nodes(spec)).names) + self._booting(spec.pool_id)
        return ChangePreview(
            spec.pool_id, before, nodes, usd_per_hour(spec, before), usd_per_hour(spec, nodes)
        )

    async def apply(self, spec: PoolSpec, nodes: int, *, busy_nodes: int = 0) -> ChangeResult:
        spec = validate(spec)
        check_not_below_busy(spec, nodes, busy_nodes)
        async with self._locks.setdefault(spec.pool_id, asyncio.Lock()):
            current = await self._nodes(spec)
            check_not_below_busy(spec, nodes, len(current.busy))
            growths = self._growths.setdefault(spec.pool_id, [])
            before = len(current.names) + self._booting(spec.pool_id)
            now = self._clock()
            ready_at = now
            if nodes > before:
                ready_at = now + self._lead_time_s
                op = PendingOperation(spec.pool_id, Operation.SCALE_UP, before, nodes, now, ready_at)
                growth = _Growth(op, nodes - before)
                growth.task = asyncio.create_task(self._grow_later(spec, growth))
                growths.append(growth)
                log.info("sim_pool_scale_up_started", pool=spec.pool_id, nodes_from=before, nodes_to=nodes)
            elif nodes < before:
                excess = before - nodes
                # Scale-ups not yet landed are the cheapest to give back: newest first.
                while excess and growths:
                    last = growths[-1]
                    take = min(excess, last.count)
                    last.count -= take
                    last.op = replace(last.op, nodes_to=last.op.nodes_to - take)
                    excess -= take
                    if last.count == 0 and last.task is not None:
                        last.task.cancel()
                        growths.pop()
                if excess:
                    victims = list(reversed(current.idle))[:excess]
                    try:
                        removed = await self._resizer.remove_idle_nodes(spec.cluster, spec.name, victims)
                    except (aiohttp.ClientError, OSError, TimeoutError) as error:
                        raise NetworkError(f"{spec.pool_id}: removing nodes failed: {error}") from error
                    self._ready[spec.pool_id] = len(current.names) - len(removed)
                    # Nodes the resizer found busy when it reached them stay in the pool.
                    nodes += excess - len(removed)
                log.info("sim_pool_scaled_down", pool=spec.pool_id, nodes_from=before, nodes_to=nodes)
            return ChangeResult(
                spec.pool_id, before, nodes, ready_at, usd_per_hour(spec, before), usd_per_hour(spec, nodes)
            )

    async def _grow_later(self, spec: PoolSpec, growth: _Growth) -> None:
        await self._sleep(max(0.0, (growth.op.ready_at_s or 0.0) - self._clock()))
        async with self._locks[spec.pool_id]:
            growths = self._growths.get(spec.pool_id, [])
            if growth not in growths:
                return
            growths.remove(growth)
            try:
                added = await self._resizer.add_nodes(spec.cluster, spec.name, growth.count)
            except Exception as error:
                # The reconciler sees the shortfall in status and inventory and asks again.
                log.warning("sim_pool_scale_up_failed", pool=spec.pool_id, error=str(error))
                return
            self._ready[spec.pool_id] = self._ready.get(spec.pool_id, 0) + len(added)
            log.info("sim_pool_scaled_up", pool=spec.pool_id, added=len(added))

    async def destroy(self, spec: PoolSpec, *, busy_nodes: int = 0) -> ChangeResult:
        return await self.apply(spec, 0, busy_nodes=busy_nodes)

    async def refresh(self, spec: PoolSpec) -> PoolStatus:
        await self._nodes(spec)
        return await self.status(spec)

    async def status(self, spec: PoolSpec) -> PoolStatus:
        ready = self._ready.get(spec.pool_id, 0)
        growths = self._growths.get(spec.pool_id, [])
        nodes = ready + self._booting(spec.pool_id)
        pending = tuple(g.op for g in growths if g.count)
        return PoolStatus(spec.pool_id, nodes > 0, nodes, ready, usd_per_hour(spec, nodes), pending)

    async def close(self) -> None:
        """Cancel scale-ups that have not landed (the embedded default is shutting down)."""
        tasks = [g.task for gs in self._growths.values() for g in gs if g.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._growths.clear()
