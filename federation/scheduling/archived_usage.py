"""The GPU-hours of archived intervals, for budgets and fair share.

Why: the scheduler reads each tenant's usage (this month's GPU-hours against its budget, and the
decayed history for fair share) from the ledger cache, which holds etcd's intervals. Once the
archiver moves a closed interval to the history store, etcd and the cache forget it; without this
term a tenant's budget would forget everything it spent more than `retainInEtcd` ago.

So the leader also asks SQL, on a worker thread and at most every `REFRESH_S`, for the archived
GPU-hours per tenant, GPU type and UTC day since the month began (or since eight half-lives ago, if
earlier), and adds them to what the cache gives. Month figures are exact (SQL clips to the month);
the decayed history weighs each day's hours at the day's middle, which for a half-life of a day or
more is within a few per cent of the exact integral. An interval in both stores (the moment between
the archiver's SQL commit and its etcd delete, or until the next pass after a crash there) counts
twice for that moment: a budget errs towards stopping early, never towards overspending.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime

import structlog

from federation.history.model import GroupBy, Period, UsageQuery, UsageRow
from federation.history.protocol import HistoryStore
from federation.ledger.usage import TenantUsage, month_start_s
from placement.model import GpuType, TenantId

log = structlog.get_logger("gpufed.archiver")

REFRESH_S = 60.0
_HALF_LIVES = 8.0
_DAY_S = 86_400.0


def _day_start_s(day: str) -> float:
    return datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()


class ArchivedUsage:
    def __init__(self, history: HistoryStore, *, refresh_s: float = REFRESH_S) -> None:
        self._history = history
        self._refresh_s = refresh_s
        # Per (tenant, gpu type, day start): GPU-hours; and when it was read.
        self._rows: list[tuple[TenantId, GpuType, float, float]] = []
        self._read_at_s = float("-inf")
        # The half-life the rows were read for: their first day is eight half-lives back.
        self._read_half_life_h: float | None = None
        self._task: asyncio.Task[None] | None = None

    def refresh_if_due(self, now_s: float, half_life_h: float) -> None:
        """Start a refresh in the background when the last one is older than `refresh_s`."""
        if now_s - self._read_at_s < self._refresh_s or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.create_task(self.refresh(now_s, half_life_h), name="archived-usage")

    async def read_once(self, now_s: float, half_life_h: float) -> None:
        """Have the rows read, as a new leader's first cycle needs them: wait for a read in flight
        (the one the server starts with `refresh_if_due` while it lists etcd), then read now if none
        has been done or it was for another half-life."""
        task = self._task
        if task is not None and not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)
        if self.never_read or self._read_half_life_h != half_life_h:
            await self.refresh(now_s, half_life_h)

    async def refresh(self, now_s: float, half_life_h: float) -> None:
        since = min(month_start_s(now_s), now_s - _HALF_LIVES * half_life_h * 3600.0)
        since = math.floor(since / _DAY_S) * _DAY_S
        query = UsageQuery(
            since_s=since, until_s=now_s, group_by=(GroupBy.TENANT, GroupBy.GPU_TYPE), period=Period.DAY
        )
        try:
            rows: list[UsageRow] = await asyncio.to_thread(self._history.usage, query)
        except Exception:
            # The database is away: keep the last figures and try again at the next refresh.
            log.exception("archived_usage_not_read")
            self._read_at_s = now_s
            return
        self._rows = [
            (TenantId(r.keys[0]), GpuType(r.keys[1]), _day_start_s(r.period or ""), r.gpu_hours) for r in rows
        ]
        self._read_at_s = now_s
        self._read_half_life_h = half_life_h

    @property
    def never_read(self) -> bool:
        return self._read_at_s == float("-inf")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def add_to(
        self,
        usage: Mapping[TenantId, TenantUsage],
        *,
        now_s: float,
        half_life_h: float,
        parents: Mapping[TenantId, TenantId | None],
    ) -> dict[TenantId, TenantUsage]:
        """`usage` (etcd's intervals) plus the archived hours: this month's rolled up the tenant
        tree as `tenant_usage` does, the decayed history per leaf tenant."""
        if not self._rows:
            return dict(usage)
        month_start = month_start_s(now_s)
        half_life_s = half_life_h * 3600.0
        month: dict[TenantId, float] = defaultdict(float)
        decayed: dict[TenantId, dict[GpuType, float]] = defaultdict(lambda: defaultdict(float))
        for tenant_id, gpu, day_start, hours in self._rows:
            if day_start >= month_start:
                tenant: TenantId | None = tenant_id
                seen: set[TenantId] = set()
                while tenant is not None and tenant not in seen:
                    month[tenant] += hours
                    seen.add(tenant)
                    tenant = parents.get(tenant)
            middle = min(day_start + _DAY_S / 2, now_s)
            decayed[tenant_id][gpu] += hours * 2.0 ** (-(now_s - middle) / half_life_s)
        out = dict(usage)
        for tenant in set(month) | set(decayed):
            live = out.get(tenant, TenantUsage(0.0, ()))
            by_type = defaultdict(float, dict(live.decayed_gpu_hours))
            for gpu, hours in decayed.get(tenant, {}).items():
                by_type[gpu] += hours
            out[tenant] = TenantUsage(
                month_gpu_hours=live.month_gpu_hours + month.get(tenant, 0.0),
                decayed_gpu_hours=tuple(sorted(by_type.items())),
            )
        return out
