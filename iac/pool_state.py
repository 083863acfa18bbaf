"""A scalable pool as the capacity decisions see it: size, busy and idle nodes, bounds and price.

Federation fills it from the cluster's inventory (busy nodes, when each idle node was last used)
and the provisioner's status (the count asked for, scale-ups still booting); `iac.plans` and
`iac.decide` read it. A plain value, so decisions are pure functions of their arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

from placement.model import CapacityKind, ClusterName, GpuType, Provider

PoolKey = tuple[ClusterName, str]


@dataclass(frozen=True, slots=True)
class PoolState:
    cluster: ClusterName
    pool: str
    provider: Provider
    gpu_type: GpuType
    kind: CapacityKind
    gpus_per_node: int
    usd_per_gpu_hour: float
    # The count asked for, including nodes still booting.
    nodes: int
    # Nodes running a job now: never removed.
    busy_nodes: int
    max_nodes: int
    min_nodes: int = 0
    # For each ready node that runs nothing: when it last ran a job, or joined the pool.
    idle_since_s: tuple[float, ...] = ()

    @property
    def key(self) -> PoolKey:
        return (self.cluster, self.pool)

    @property
    def usd_per_node_hour(self) -> float:
        return self.gpus_per_node * self.usd_per_gpu_hour

    def usd_per_hour(self, nodes: int) -> float:
        return nodes * self.usd_per_node_hour
