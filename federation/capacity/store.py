"""`CapacityStore`: plans, pending pool operations, idle clocks and provisioned intervals in etcd.

Over any `KeyValueStore` (etcd, or `MemoryKv` in unit tests), with the same transaction rules as
the job store: a plan is created only if its key is absent, cancelled only if nobody wrote it in
between, and every write of the capacity reconciler carries the leader's fence, so a deposed
leader cannot record an operation it no longer owns. Layout: `federation.capacity.records`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from federation.capacity.records import (
    OPS,
    PLAN_HELD,
    PLANS,
    POOLS,
    PROVISIONED,
    SETTINGS_KEY,
    CapacitySettings,
    PendingOp,
    PlanHeldRecord,
    PlanRecord,
    PoolRecord,
    held_from_dict,
    held_to_dict,
    interval_from_dict,
    interval_to_dict,
    op_from_dict,
    op_to_dict,
    plan_from_dict,
    plan_to_dict,
    pool_from_dict,
    pool_suffix,
    pool_to_dict,
    settings_from_dict,
    settings_to_dict,
)
from federation.errors import NotLeader
from federation.ledger.report.idle import ProvisionedInterval
from federation.store.job_store import Fence, Stored
from federation.store.kv import Compare, Delete, KeyValueStore, Op, Put
from federation.store.kv_pages import pages
from federation.store.schema_version import dumps, loads

T = TypeVar("T")


def _dumps(d: Any) -> bytes:
    return dumps(d, sort_keys=True)


class CapacityStore:
    def __init__(self, kv: KeyValueStore) -> None:
        self._kv = kv

    async def _list(self, prefix: bytes, decode: Callable[[dict[str, Any]], T]) -> list[tuple[T, int]]:
        out: list[tuple[T, int]] = []
        async with contextlib.aclosing(pages(self._kv, prefix)) as listing:
            async for page, _ in listing:
                out.extend((decode(loads(kv.value, kv.key)), kv.mod_revision) for kv in page)
        return out

    async def _write(self, ops: tuple[Op, ...], fence: Fence | None) -> None:
        compares = () if fence is None else (fence.compare(),)
        result = await self._kv.txn(compares, ops)
        if not result.succeeded:
            raise NotLeader("the leader key is no longer ours; the capacity change was not recorded")

    # ---- settings (written at bootstrap, read by the leader and the API)

    async def put_settings(self, settings: CapacitySettings) -> None:
        await self._kv.put(SETTINGS_KEY, _dumps(settings_to_dict(settings)))

    async def get_settings(self) -> CapacitySettings:
        kv = await self._kv.get(SETTINGS_KEY)
        return CapacitySettings() if kv is None else settings_from_dict(loads(kv.value, kv.key))

    # ---- plans (written by the API)

    async def create_plan(self, plan: PlanRecord) -> bool:
        key = PLANS + plan.plan_id.encode()
        result = await self._kv.txn((Compare.absent(key),), (Put(key, _dumps(plan_to_dict(plan))),))
        return result.succeeded

    async def get_plan(self, plan_id: str) -> Stored[PlanRecord] | None:
        kv = await self._kv.get(PLANS + plan_id.encode())
        return None if kv is None else Stored(plan_from_dict(loads(kv.value, kv.key)), kv.mod_revision)

    async def list_plans(self) -> list[PlanRecord]:
        return [p for p, _ in await self._list(PLANS, plan_from_dict)]

    async def update_plan(self, plan: PlanRecord, mod_revision: int) -> bool:
        key = PLANS + plan.plan_id.encode()
        result = await self._kv.txn(
            (Compare.mod_revision_is(key, mod_revision),), (Put(key, _dumps(plan_to_dict(plan))),)
        )
        return result.succeeded

    # ---- what each plan's nodes delivered (written by the leader's capacity reconciler)

    async def list_held(self) -> list[PlanHeldRecord]:
        return [h for h, _ in await self._list(PLAN_HELD, held_from_dict)]

    async def put_held(self, records: list[PlanHeldRecord], *, fence: Fence | None) -> None:
        if records:
            ops = tuple(Put(PLAN_HELD + h.plan_id.encode(), _dumps(held_to_dict(h))) for h in records)
            await self._write(ops, fence)

    # ---- pending operations and idle clocks (written by the leader's capacity reconciler)

    async def list_ops(self) -> list[PendingOp]:
        return [o for o, _ in await self._list(OPS, op_from_dict)]

    async def put_op(self, op: PendingOp, *, fence: Fence | None) -> None:
        await self._write((Put(OPS + pool_suffix(op.cluster, op.pool), _dumps(op_to_dict(op))),), fence)

    async def delete_op(self, cluster: str, pool: str, *, fence: Fence | None) -> None:
        await self._write((Delete(OPS + pool_suffix(cluster, pool)),), fence)

    async def list_pools(self) -> list[PoolRecord]:
        return [p for p, _ in await self._list(POOLS, pool_from_dict)]

    async def put_pool(self, record: PoolRecord, *, fence: Fence | None) -> None:
        key = POOLS + pool_suffix(record.cluster, record.pool)
        await self._write((Put(key, _dumps(pool_to_dict(record))),), fence)

    # ---- provisioned intervals (for the finance idle-cost report)

    async def list_intervals(self) -> list[ProvisionedInterval]:
        return list((await self.keyed_intervals()).values())

    async def keyed_intervals(self) -> dict[bytes, ProvisionedInterval]:
        out: dict[bytes, ProvisionedInterval] = {}
        async with contextlib.aclosing(pages(self._kv, PROVISIONED)) as listing:
            async for page, _ in listing:
                out.update((kv.key, interval_from_dict(loads(kv.value, kv.key))) for kv in page)
        return out

    async def put_intervals(
        self, intervals: dict[bytes, ProvisionedInterval], *, fence: Fence | None
    ) -> None:
        if intervals:
            ops = tuple(Put(key, _dumps(interval_to_dict(iv))) for key, iv in intervals.items())
            await self._write(ops, fence)
