"""GPU-hours each tenant used, from the usage ledger, for budgets and fair share.

Two figures per tenant: GPU-hours this calendar month (UTC), against a monthly budget; and recent
GPU-hours per GPU type with exponential decay (a half-life), for fair share with history. Both are
read from the ledger's intervals (`federation.store.intervals`), which is what finance is charged from, so a
budget stops admissions at exactly the figure the report shows. An open interval counts up to now.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from federation.store.intervals import LedgerInterval
from placement.model import GpuType, TenantId


def month_start_s(now_s: float) -> float:
    now = datetime.fromtimestamp(now_s, UTC)
    return datetime(now.year, now.month, 1, tzinfo=UTC).timestamp()


def _decayed_hours(start_s: float, end_s: float, now_s: float, half_life_s: float) -> float:
    """Integral over [start, end] of 2^-(now - t)/half_life dt, in hours."""
    rate = math.log(2) / half_life_s
    return (math.exp(-rate * (now_s - end_s)) - math.exp(-rate * (now_s - start_s))) / rate / 3600.0


@dataclass(frozen=True, slots=True)
class TenantUsage:
    month_gpu_hours: float
    decayed_gpu_hours: tuple[tuple[GpuType, float], ...]


def tenant_usage(
    intervals: Iterable[LedgerInterval],
    *,
    now_s: float,
    half_life_h: float,
    parents: Mapping[TenantId, TenantId | None] | None = None,
) -> dict[TenantId, TenantUsage]:
    """Per tenant. This month's GPU-hours roll up the tenant tree (an organisation's budget is spent
    by its teams, as the finance report counts it); the decayed history stays per tenant, since fair
    share is computed among leaf tenants."""
    parents = parents or {}
    month_start = month_start_s(now_s)
    half_life_s = half_life_h * 3600.0
    month: dict[TenantId, float] = defaultdict(float)
    decayed: dict[TenantId, dict[GpuType, float]] = defaultdict(lambda: defaultdict(float))
    for iv in intervals:
        end = now_s if iv.end_s is None else min(iv.end_s, now_s)
        if end <= iv.start_s:
            continue
        if end > month_start:
            hours = iv.gpu_count * (end - max(iv.start_s, month_start)) / 3600.0
            month[iv.tenant] += hours
            # Up the tenant tree, if the tenant has a parent: most have none, and a new leader's
            # first cycle sums every interval in etcd (92,000 at 100,000 jobs) before it plans.
            tenant = parents.get(iv.tenant)
            if tenant is not None:
                seen: set[TenantId] = {iv.tenant}
                while tenant is not None and tenant not in seen:
                    month[tenant] += hours
                    seen.add(tenant)
                    tenant = parents.get(tenant)
        decayed[iv.tenant][iv.gpu_type] += iv.gpu_count * _decayed_hours(iv.start_s, end, now_s, half_life_s)
    return {
        tenant: TenantUsage(
            month_gpu_hours=month.get(tenant, 0.0),
            decayed_gpu_hours=tuple(sorted(decayed[tenant].items())) if tenant in decayed else (),
        )
        for tenant in set(month) | set(decayed)
    }
