"""In-memory twins for unit tests: a provisioner that needs no cloud and a resizer that needs no cluster.

`InMemoryProvisioner` keeps each pool's count, records every call, and shows a scale-up as pending
until its lead time has passed on an injected clock, so a test of the capacity reconciler can step
time by hand. `InMemoryPoolResizer` is the `PoolResizer` the simulated provisioner is tested with.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from iac.api import (
    ChangePreview,
    ChangeResult,
    Operation,
    PendingOperation,
    PoolStatus,
    check_not_below_busy,
    usd_per_hour,
)
from iac.pools import PoolSpec, validate
from iac.resize import PoolNodes


@dataclass(frozen=True, slots=True)
class _Scale:
    nodes_from: int
    nodes_to: int
    started_at_s: float
    ready_at_s: float


class InMemoryProvisioner:
    """Holds each pool's count; a scale-up is ready `lead_time_s` after it was applied."""

    def __init__(self, *, lead_time_s: float = 0.0, clock: Callable[[], float] = time.time) -> None:
        self.operations: list[tuple[Operation, str, int]] = []
        self._lead_time_s = lead_time_s
        self._clock = clock
        self._scales: dict[str, _Scale] = {}

    def nodes(self, pool_id: str) -> int:
        scale = self._scales.get(pool_id)
        return scale.nodes_to if scale else 0

    async def preview(self, spec: PoolSpec, nodes: int) -> ChangePreview:
        spec = validate(spec)
        before = self.nodes(spec.pool_id)
        self.operations.append((Operation.PREVIEW, spec.pool_id, nodes))
        return ChangePreview(
            spec.pool_id, before, nodes, usd_per_hour(spec, before), usd_per_hour(spec, nodes)
        )

    async def apply(self, spec: PoolSpec, nodes: int, *, busy_nodes: int = 0) -> ChangeResult:
        spec = validate(spec)
        check_not_below_busy(spec, nodes, busy_nodes)
        before = self.nodes(spec.pool_id)
        now = self._clock()
        ready = now + self._lead_time_s if nodes > before else now
        self.operations.append(
            (Operation.SCALE_UP if nodes >= before else Operation.SCALE_DOWN, spec.pool_id, nodes)
        )
        self._scales[spec.pool_id] = _Scale(before, nodes, now, ready)
        return ChangeResult(
            spec.pool_id, before, nodes, ready, usd_per_hour(spec, before), usd_per_hour(spec, nodes)
        )

    async def destroy(self, spec: PoolSpec, *, busy_nodes: int = 0) -> ChangeResult:
        check_not_below_busy(spec, 0, busy_nodes)
        before = self.nodes(spec.pool_id)
        self.operations.append((Operation.DESTROY, spec.pool_id, 0))
        self._scales.pop(spec.pool_id, None)
        return ChangeResult(spec.pool_id, before, 0, self._clock(), usd_per_hour(spec, before), 0.0)

    async def refresh(self, spec: PoolSpec) -> PoolStatus:
        self.operations.append((Operation.REFRESH, spec.pool_id, self.nodes(spec.pool_id)))
        return await self.status(spec)

    async def status(self, spec: PoolSpec) -> PoolStatus:
        scale = self._scales.get(spec.pool_id)
        if scale is None:
            return PoolStatus(spec.pool_id, False, 0, 0, 0.0)
        booting = scale.ready_at_s > self._clock()
        pending = (
            (
                PendingOperation(
                    spec.pool_id,
                    Operation.SCALE_UP,
                    scale.nodes_from,
                    scale.nodes_to,
                    scale.started_at_s,
                    scale.ready_at_s,
                ),
            )
            if booting
            else ()
        )
        ready = scale.nodes_from if booting else scale.nodes_to
        return PoolStatus(
            spec.pool_id, True, scale.nodes_to, ready, usd_per_hour(spec, scale.nodes_to), pending
        )


class InMemoryPoolResizer:
    """Pools of named nodes, some of them busy; removes only nodes that are idle when asked."""

    def __init__(self, pools: dict[tuple[str, str], int] | None = None) -> None:
        self.pools: dict[tuple[str, str], list[str]] = {}
        self.busy: set[str] = set()
        self.calls: list[tuple[str, str, str, int]] = []
        self._next: dict[tuple[str, str], int] = {}
        for (cluster, pool), count in (pools or {}).items():
            self._add(cluster, pool, count)

    def _add(self, cluster: str, pool: str, count: int) -> tuple[str, ...]:
        key = (cluster, pool)
        start = self._next.get(key, 0)
        names = tuple(f"{cluster}-{pool}-{i}" for i in range(start, start + count))
        self._next[key] = start + count
        self.pools.setdefault(key, []).extend(names)
        return names

    async def pool_nodes(self, cluster: str, pool: str) -> PoolNodes:
        names = tuple(self.pools.get((cluster, pool), ()))
        return PoolNodes(names, frozenset(n for n in names if n in self.busy))

    async def add_nodes(self, cluster: str, pool: str, count: int) -> tuple[str, ...]:
        self.calls.append(("add", cluster, pool, count))
        return self._add(cluster, pool, count)

    async def remove_idle_nodes(self, cluster: str, pool: str, names: Sequence[str]) -> tuple[str, ...]:
        self.calls.append(("remove", cluster, pool, len(names)))
        nodes = self.pools.get((cluster, pool), [])
        removed = tuple(n for n in names if n in nodes and n not in self.busy)
        for name in removed:
            nodes.remove(name)
        return removed
