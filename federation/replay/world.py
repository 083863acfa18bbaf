"""The simulated federation one policy runs on: clusters, prices, teams and their quotas, and gangs.

Built from the config, the (typed) trace and one private size. Private clusters hold whole nodes of
`gpus_per_node` GPUs, split by type as the config says; each type's GPUs are rounded to whole nodes.
Public clusters are elastic: every (cloud, type) offers up to `cloud_max_gpus_per_type` GPUs at the
price read from the price table, and capacity bought there starts after the provisioning lead time.

Teams are the trace's tenants. Each team is guaranteed, per GPU type, `guarantee_fraction` of the
private GPUs of that type in proportion to its share of the week's demand for the type (GPU-hours of
the jobs whose first accepted type it is); it may borrow idle capacity beyond that without limit.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from federation.replay.config import ReplayConfig
from federation.replay.errors import ReplayError
from federation.replay.prices import PriceTable
from federation.replay.trace import TraceJob
from placement.model import (
    CapacityKind,
    ClusterName,
    GangRequest,
    GpuQuota,
    GpuType,
    Provider,
    TenantId,
    TenantQuota,
)

# Every job's tenant under the first-come-first-served tenancy: one queue, no quotas.
FIFO_TENANT = TenantId("everyone")


@dataclass(frozen=True, slots=True)
class PoolDef:
    """One pool of the simulated federation: private nodes, or an elastic cloud offer."""

    cluster: ClusterName
    provider: Provider
    region: str
    name: str
    gpu_type: GpuType
    kind: CapacityKind
    usd_per_gpu_hour: float
    gpus_per_node: int
    nodes: int
    restart_risk_per_hour: float = 0.0
    # Where the price came from (cloud pools): instance type in the price table.
    instance_type: str = ""

    @property
    def is_private(self) -> bool:
        return self.kind is CapacityKind.PRIVATE


@dataclass(frozen=True, slots=True)
class World:
    private_gpus: int
    pools: tuple[PoolDef, ...]
    teams: tuple[TenantQuota, ...]


def _provider(cloud: str) -> Provider:
    try:
        return Provider(cloud.lower())
    except ValueError as error:
        raise ReplayError(
            f"public cluster cloud {cloud!r} is not one of {[p.value for p in Provider]}"
        ) from error


def private_pools(config: ReplayConfig, private_gpus_target: float) -> list[PoolDef]:
    gpn = config.gpus_per_node
    pools = []
    for cluster in config.private_clusters:
        prices = dict(cluster.usd_per_gpu_hour)
        for gpu_type, fraction in cluster.type_fractions:
            nodes = max(1, round(private_gpus_target * fraction / gpn))
            if gpu_type not in prices:
                raise ReplayError(f"private cluster {cluster.name}: no usd_per_gpu_hour for {gpu_type}")
            pools.append(
                PoolDef(
                    ClusterName(cluster.name),
                    Provider.PRIVATE,
                    cluster.region,
                    f"{gpu_type.lower()}",
                    gpu_type,
                    CapacityKind.PRIVATE,
                    prices[gpu_type],
                    gpn,
                    nodes,
                )
            )
    return pools


def cloud_pools(config: ReplayConfig, prices: PriceTable) -> list[PoolDef]:
    gpn = config.gpus_per_node
    nodes = max(1, config.cloud_max_gpus_per_type // gpn)
    # Spot pools are always built (where the table prices spot); the simulator keeps them only for a
    # policy that lets jobs use spot (`public.spot`, or gpufed's `spot` setting).
    kinds = [(CapacityKind.ON_DEMAND, False), (CapacityKind.SPOT, True)]
    pools = []
    for cluster in config.public_clusters:
        for gpu_type, accelerator in cluster.accelerators:
            for kind, spot in kinds:
                row = prices.gpu_price(cluster.cloud, cluster.region, accelerator, spot=spot)
                if row is None:
                    if spot:
                        continue
                    raise ReplayError(
                        f"public cluster {cluster.name}: no usable {accelerator} price in "
                        f"{cluster.cloud}/{cluster.region}"
                    )
                price = row.per_gpu(spot)
                assert price is not None
                pools.append(
                    PoolDef(
                        ClusterName(cluster.name),
                        _provider(cluster.cloud),
                        cluster.region,
                        f"{gpu_type.lower()}-{kind.value}",
                        gpu_type,
                        kind,
                        round(price, 6),
                        gpn,
                        nodes,
                        config.spot_restart_risk_per_hour if spot else 0.0,
                        row.instance_type,
                    )
                )
    return pools


def demand_by_team(jobs: Sequence[TraceJob]) -> dict[GpuType, dict[TenantId, float]]:
    """GPU-seconds of work per first accepted type and team."""
    demand: dict[GpuType, dict[TenantId, float]] = defaultdict(lambda: defaultdict(float))
    for job in jobs:
        demand[job.gpu_types[0]][job.tenant] += job.num_gpus * job.duration_s
    return demand


def team_quotas(
    jobs: Sequence[TraceJob], private: Sequence[PoolDef], guarantee_fraction: float
) -> tuple[TenantQuota, ...]:
    capacity: dict[GpuType, int] = defaultdict(int)
    for pool in private:
        capacity[pool.gpu_type] += pool.nodes * pool.gpus_per_node
    demand = demand_by_team(jobs)
    teams = sorted({job.tenant for job in jobs})
    quotas: dict[TenantId, list[GpuQuota]] = {team: [] for team in teams}
    for gpu_type in sorted(capacity):
        by_team = demand.get(gpu_type, {})
        total = sum(by_team.values())
        for team in teams:
            share = by_team.get(team, 0.0) / total if total > 0 else 0.0
            guaranteed = math.floor(capacity[gpu_type] * guarantee_fraction * share)
            quotas[team].append(GpuQuota(gpu_type, guaranteed_gpus=guaranteed))
    return tuple(TenantQuota(team, quotas=tuple(quotas[team])) for team in teams)


def build_world(
    config: ReplayConfig, prices: PriceTable, jobs: Sequence[TraceJob], private_gpus_target: float
) -> World:
    private = private_pools(config, private_gpus_target)
    pools = (*private, *cloud_pools(config, prices))
    total = sum(p.nodes * p.gpus_per_node for p in private)
    return World(total, pools, team_quotas(jobs, private, config.guarantee_fraction))


def gang_request(
    job: TraceJob,
    config: ReplayConfig,
    *,
    fifo: bool,
    queued_at_s: float,
    allow_spot: bool,
    deadline: bool = False,
    resumable: bool = False,
) -> GangRequest:
    """The job as the placer sees it: its run-time limit is its duration times the configured factor.
    `allow_spot`: the policy lets every job use spot (the placer may still bound which do);
    `deadline`: the placer is told the job's deadline, if it has one;
    `resumable`: the placer is told whether the job checkpoints."""
    limit_s = math.ceil(job.duration_s * config.runtime_limit_factor)
    return GangRequest(
        job_id=job.job_id,
        tenant=FIFO_TENANT if fifo else job.tenant,
        priority=0,
        queued_at_s=queued_at_s,
        replica_gpus=job.replica_gpus(config.gpus_per_node),
        gpu_types=job.gpu_types,
        gpu_type_policy=job.gpu_type_policy,
        allow_spot=allow_spot,
        max_runtime_s=limit_s,
        expected_runtime_s=job.duration_s if config.expected_runtime == "exact" else 0.0,
        deadline_at_s=job.deadline_s if deadline else None,
        resumable=resumable and job.resumable,
    )
