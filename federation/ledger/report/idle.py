"""Idle cost: node-pool time that gpufed provisioned and no job used.

A pool that gpufed scaled up is paid for whether or not gangs run on it. The capacity reconciler
(`federation.capacity.reconciler`) records each stretch of nodes it added as a `ProvisionedInterval`; this
module sets them against the ledger. At every moment, on one cluster and GPU type, the idle GPUs
are the provisioned GPUs minus the GPUs ledger intervals held there, never below zero; idle
GPU-hours are that integrated over time, and idle cost is it at the pool's price.

The ledger does not say which pool a gang ran on, so when several pools of the same cluster and
type are up at once, the GPUs in use are shared out among them in proportion to their sizes. Usage
beyond what gpufed provisioned (a gang on the cluster's own fixed nodes) makes no pool's idle time
negative, and it is counted moment by moment: a busy hour does not cancel an idle one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from federation.store.intervals import LedgerInterval
from placement.model import CapacityKind


@dataclass(frozen=True, slots=True)
class ProvisionedInterval:
    cluster: str
    pool: str
    gpu_type: str
    gpu_count: int
    usd_per_gpu_hour: float
    start_s: float
    # None: still provisioned (counts up to the end of the period asked about).
    end_s: float | None
    kind: CapacityKind = CapacityKind.ON_DEMAND


@dataclass(frozen=True, slots=True)
class IdleCost:
    """One pool's provisioned, used and idle GPU-time over the period asked about."""

    cluster: str
    pool: str
    gpu_type: str
    provisioned_gpu_hours: float
    used_gpu_hours: float
    idle_gpu_hours: float
    idle_cost_usd: float
    kind: CapacityKind = CapacityKind.ON_DEMAND
    provisioned_cost_usd: float = 0.0


@dataclass(frozen=True, slots=True)
class ClusterIdleCost:
    cluster: str
    provisioned_gpu_hours: float
    used_gpu_hours: float
    idle_gpu_hours: float
    idle_cost_usd: float
    provisioned_cost_usd: float


# Per (cluster, GPU type): at each instant, how the GPUs ledger intervals hold there change. Summed
# per instant, and an instant whose changes cancel is left out: so the same usage gives the same
# sweep whether it comes from whole intervals here or from SQL's day rows (`HistoryStore.read_report`).
UsedEdges = dict[tuple[str, str], dict[float, int]]


def _site_sweep(
    pools: list[tuple[int, float, float, int]], used: Mapping[float, int]
) -> dict[int, list[float]]:
    """Per provisioned interval (by index): [provisioned GPU-h, used GPU-h, idle GPU-h].

    `pools` is (index, start, end, gpus), already clipped; `used` is the change in GPUs in use at
    each instant (`UsedEdges` of one site).
    """
    events: list[tuple[float, int, int]] = []
    for index, a, b, gpus in pools:
        events.append((a, index, gpus))
        events.append((b, index, -gpus))
    for at, delta in used.items():
        if delta:
            events.append((at, -1, delta))
    events.sort()
    held: dict[int, int] = defaultdict(int)
    in_use = 0
    out: dict[int, list[float]] = {index: [0.0, 0.0, 0.0] for index, *_ in pools}
    last = events[0][0] if events else 0.0
    for at, index, delta in events:
        if at > last:
            provisioned = sum(held.values())
            if provisioned > 0:
                hours = (at - last) / 3600.0
                busy = min(in_use, provisioned)
                for i, gpus in held.items():
                    if gpus:
                        acc = out[i]
                        acc[0] += gpus * hours
                        acc[1] += busy * gpus / provisioned * hours
                        acc[2] += (provisioned - busy) * gpus / provisioned * hours
            last = at
        if index < 0:
            in_use += delta
        else:
            held[index] += delta
    return out


def provisioned_sites(
    provisioned: Iterable[ProvisionedInterval], *, start_s: float, end_s: float
) -> frozenset[tuple[str, str]]:
    """The (cluster, GPU type) sites with a pool up within [start_s, end_s): the only usage idle
    cost reads."""
    return frozenset(
        (p.cluster, p.gpu_type)
        for p in provisioned
        if p.gpu_count > 0 and min(end_s if p.end_s is None else p.end_s, end_s) > max(p.start_s, start_s)
    )


def used_edges(
    intervals: Iterable[LedgerInterval],
    *,
    start_s: float,
    end_s: float,
    sites: frozenset[tuple[str, str]] | None = None,
) -> UsedEdges:
    """The intervals' GPUs in use over [start_s, end_s) as changes per instant, per site (only
    `sites` if given). An open interval counts up to `end_s`."""
    out: UsedEdges = {}
    for iv in intervals:
        site = (str(iv.cluster), str(iv.gpu_type))
        if sites is not None and site not in sites:
            continue
        a, b = max(iv.start_s, start_s), min(end_s if iv.end_s is None else iv.end_s, end_s)
        if b > a:
            moves = out.setdefault(site, {})
            moves[a] = moves.get(a, 0) + iv.gpu_count
            moves[b] = moves.get(b, 0) - iv.gpu_count
    return out


def add_edges(into: UsedEdges, site: tuple[str, str], at_s: float, delta: int) -> None:
    moves = into.setdefault(site, {})
    moves[at_s] = moves.get(at_s, 0) + delta


def idle_cost(
    provisioned: Iterable[ProvisionedInterval],
    intervals: Iterable[LedgerInterval],
    *,
    start_s: float,
    end_s: float,
) -> list[IdleCost]:
    """Idle GPU-time and cost per pool over [start_s, end_s), sorted by cluster, pool and type.

    Pass `end_s` no later than now: open intervals, provisioned or used, count up to it.
    """
    listed = list(provisioned)
    sites = provisioned_sites(listed, start_s=start_s, end_s=end_s)
    used = used_edges(intervals, start_s=start_s, end_s=end_s, sites=sites)
    return idle_cost_from_edges(listed, used, start_s=start_s, end_s=end_s)


def idle_cost_from_edges(
    provisioned: Iterable[ProvisionedInterval], used: UsedEdges, *, start_s: float, end_s: float
) -> list[IdleCost]:
    """`idle_cost` from the usage as changes per instant (`used_edges`, plus SQL's for archived
    intervals)."""
    sites: dict[tuple[str, str], list[tuple[int, float, float, int]]] = defaultdict(list)
    listed = list(provisioned)
    for index, p in enumerate(listed):
        a, b = max(p.start_s, start_s), min(end_s if p.end_s is None else p.end_s, end_s)
        if b > a and p.gpu_count > 0:
            sites[(p.cluster, p.gpu_type)].append((index, a, b, p.gpu_count))
    totals: dict[tuple[str, str, str, CapacityKind], list[float]] = defaultdict(lambda: [0.0] * 5)
    for site, pools in sites.items():
        for index, (have, busy, idle) in _site_sweep(pools, used.get(site, {})).items():
            p = listed[index]
            acc = totals[(p.cluster, p.pool, p.gpu_type, p.kind)]
            acc[0] += have
            acc[1] += busy
            acc[2] += idle
            acc[3] += idle * p.usd_per_gpu_hour
            acc[4] += have * p.usd_per_gpu_hour
    return [
        IdleCost(cluster, pool, gpu_type, v[0], v[1], v[2], v[3], kind, v[4])
        for (cluster, pool, gpu_type, kind), v in sorted(totals.items())
    ]


def idle_by_cluster(pools: Iterable[IdleCost]) -> list[ClusterIdleCost]:
    """The per-pool figures summed per cluster, sorted by cluster."""
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0] * 5)
    for p in pools:
        acc = sums[p.cluster]
        acc[0] += p.provisioned_gpu_hours
        acc[1] += p.used_gpu_hours
        acc[2] += p.idle_gpu_hours
        acc[3] += p.idle_cost_usd
        acc[4] += p.provisioned_cost_usd
    return [ClusterIdleCost(c, *v) for c, v in sorted(sums.items())]
