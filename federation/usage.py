"""GPU-hours each tenant used, from the jobs' own phase history, for budgets and fair share.

Until the usage ledger exists (issue 7) the job records are the record of what ran: an attempt
holds GPUs from its RUNNING event until the next event of the job (requeue, success, failure or
cancel), or until now while it still runs. Attempts that never started cost nothing.

Two figures per tenant: GPU-hours this calendar month (UTC), against a monthly budget; and recent
GPU-hours per GPU type with exponential decay (a half-life), for fair share with history.
Finished jobs never change, so their intervals are computed once and kept by record identity.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from federation.jobs import JobRecord
from placement.model import GpuType, JobPhase, TenantId


@dataclass(frozen=True, slots=True)
class Interval:
    tenant: TenantId
    gpu_type: GpuType
    gpus: int
    start_s: float
    # None: still holding its GPUs.
    end_s: float | None


def intervals(job: JobRecord) -> list[Interval]:
    """Each started attempt's time on GPUs, from the job's events."""
    found = []
    events = job.events
    for i, event in enumerate(events):
        if event.phase is not JobPhase.RUNNING:
            continue
        end = next((e.at_s for e in events[i + 1 :]), None)
        gpu_type = _gpu_type_at(job, event.attempt)
        if gpu_type is not None:
            found.append(Interval(job.tenant, gpu_type, job.spec.gpu_count, event.at_s, end))
    return found


def _gpu_type_at(job: JobRecord, attempt: int) -> GpuType | None:
    # Only the current attempt's placement is kept; earlier attempts ran on one of the job's types,
    # and the first acceptable type is the best guess without a ledger.
    if job.placement is not None and attempt == job.attempt:
        return job.placement.gpu_type
    return job.spec.gpu_types[0] if job.spec.gpu_types else None


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


class UsageBook:
    """Tenants' usage over every job the cache holds; intervals of finished jobs are kept."""

    def __init__(self) -> None:
        self._finished: dict[str, tuple[JobRecord, list[Interval]]] = {}

    def _intervals(self, job: JobRecord) -> list[Interval]:
        if not job.phase.is_terminal:
            return intervals(job)
        hit = self._finished.get(job.job_id)
        if hit is not None and hit[0] is job:
            return hit[1]
        found = intervals(job)
        self._finished[job.job_id] = (job, found)
        return found

    def usage(
        self, jobs: Iterable[JobRecord], *, now_s: float, half_life_h: float
    ) -> dict[TenantId, TenantUsage]:
        month_start = month_start_s(now_s)
        half_life_s = half_life_h * 3600.0
        month: dict[TenantId, float] = defaultdict(float)
        decayed: dict[TenantId, dict[GpuType, float]] = defaultdict(lambda: defaultdict(float))
        for job in jobs:
            for iv in self._intervals(job):
                end = now_s if iv.end_s is None else min(iv.end_s, now_s)
                if end <= iv.start_s:
                    continue
                if end > month_start:
                    month[iv.tenant] += iv.gpus * (end - max(iv.start_s, month_start)) / 3600.0
                decayed[iv.tenant][iv.gpu_type] += iv.gpus * _decayed_hours(
                    iv.start_s, end, now_s, half_life_s
                )
        return {
            tenant: TenantUsage(
                month_gpu_hours=month.get(tenant, 0.0),
                decayed_gpu_hours=tuple(sorted(decayed[tenant].items())) if tenant in decayed else (),
            )
            for tenant in set(month) | set(decayed)
        }
