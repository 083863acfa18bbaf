"""Idle cost: node-pool time that gpufed provisioned and no job used.

A pool that gpufed scaled up is paid for whether or not gangs run on it. For each provisioned
interval of a pool (GPUs it held, from when to when, at what price), the idle GPU-hours are its
GPU-hours minus what ledger intervals on the same cluster and GPU type used within it, never below
zero; idle cost is that at the pool's price. Pools with several intervals (scaled up, down, up)
are summed per pool and per cluster.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from federation.ledger import LedgerInterval


@dataclass(frozen=True, slots=True)
class ProvisionedInterval:
    cluster: str
    pool: str
    gpu_type: str
    gpu_count: int
    usd_per_gpu_hour: float
    start_s: float
    # None: still provisioned.
    end_s: float | None


@dataclass(frozen=True, slots=True)
class IdleCost:
    cluster: str
    pool: str
    gpu_type: str
    provisioned_gpu_hours: float
    used_gpu_hours: float
    idle_gpu_hours: float
    idle_cost_usd: float


def idle_cost(
    provisioned: Iterable[ProvisionedInterval],
    intervals: Iterable[LedgerInterval],
    *,
    start_s: float,
    end_s: float,
) -> list[IdleCost]:
    by_site: dict[tuple[str, str], list[LedgerInterval]] = defaultdict(list)
    for iv in intervals:
        by_site[(iv.cluster, iv.gpu_type)].append(iv)
    totals: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for p in provisioned:
        a = max(p.start_s, start_s)
        b = min(end_s if p.end_s is None else p.end_s, end_s)
        if b <= a:
            continue
        have = p.gpu_count * (b - a) / 3600.0
        used = sum(
            iv.gpu_count
            * max(0.0, min(b, end_s if iv.end_s is None else iv.end_s) - max(a, iv.start_s))
            / 3600.0
            for iv in by_site.get((p.cluster, p.gpu_type), ())
        )
        # Jobs may have run on capacity gpufed did not provision in the same cluster and type: what
        # they used cannot make this pool's idle time negative.
        idle = max(0.0, have - used)
        acc = totals[(p.cluster, p.pool, p.gpu_type)]
        acc[0] += have
        acc[1] += min(used, have)
        acc[2] += idle
        acc[3] += idle * p.usd_per_gpu_hour
    return [
        IdleCost(cluster, pool, gpu_type, v[0], v[1], v[2], v[3])
        for (cluster, pool, gpu_type), v in sorted(totals.items())
    ]
