"""`PoolResizer`: how the simulated provisioner reaches a simulated cluster's nodes.

`iac` may not import `clusters`, so the simulated provisioner asks through this small protocol.
Removal names the nodes to remove, and an implementation removes only those still idle when it gets
to them (cordon, check, delete), so a node that picked up a job in the meantime stays: gpufed never
removes a node that runs a job. Implementations: `HttpPoolResizer` (the simulator's Kubernetes and
`/sim/v1/` APIs over loopback, `iac/sim_http.py`) and `InMemoryPoolResizer` (`iac/memory.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class PoolNodes:
    # The pool's nodes, oldest first, and those of them running a job (a pod not yet finished).
    names: tuple[str, ...]
    busy: frozenset[str]

    @property
    def idle(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n not in self.busy)


class PoolResizer(Protocol):
    async def pool_nodes(self, cluster: str, pool: str) -> PoolNodes: ...

    async def add_nodes(self, cluster: str, pool: str, count: int) -> tuple[str, ...]:
        """Add `count` ready nodes; returns their names."""
        ...

    async def remove_idle_nodes(self, cluster: str, pool: str, names: Sequence[str]) -> tuple[str, ...]:
        """Remove those of `names` that are idle when reached; returns the names removed."""
        ...
