"""A simulated cluster (clusters.sim) shaped like the contract suite's pools, with its kubeconfig."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from clusters.sim import SimCluster, SimClusterConfig, SimPoolConfig
from placement.model import ClusterName, PoolSpec


def sim_config(pools: Sequence[PoolSpec], *, name: str = "sim", **options: Any) -> SimClusterConfig:
    fields = {f.name for f in dataclasses.fields(SimClusterConfig)}
    return SimClusterConfig(
        name=ClusterName(name),
        pools=tuple(SimPoolConfig.from_pool_spec(p) for p in pools),
        **{k: v for k, v in options.items() if k in fields},
    )


@asynccontextmanager
async def running_sim(
    tmp_path: Path, pools: Sequence[PoolSpec], *, volcano: bool = True, **options: Any
) -> AsyncIterator[tuple[SimCluster, Path]]:
    """The cluster and a kubeconfig for it. `volcano=False` only where the simulator can turn it off;
    the backend is told to use Indexed Jobs either way (KubernetesSettings.use_volcano)."""
    config = sim_config(pools, volcano=volcano, **options)
    async with SimCluster(config) as sim:
        yield sim, sim.kubeconfig(tmp_path / f"kubeconfig-{config.name}.yaml")
