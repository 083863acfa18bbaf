"""Quota accounting over the tenant tree: caps, borrowing limits, lending limits, guarantees, budgets.

Usage is GPUs held at once, per tenant and GPU type, where a tenant's usage includes its
descendants'. The rules, checked when a gang of `n` GPUs of one type is about to be admitted:

1. Cap: on the job's tenant and every ancestor, usage + n <= cap.
2. Borrowing limit: on the same nodes, usage + n <= guaranteed + borrowing limit.
3. Lending: a tenant that would go beyond its own guarantee borrows, and may borrow only idle GPUs
   that others lend. A tenant with a lending limit holds back max(0, guaranteed - usage - lending
   limit) of its unused guarantee; what the borrower takes must leave that much free (counted over
   the federation's free GPUs of the type). Held-back amounts are summed over leaf tenants only, so
   an organisation and its teams are not counted twice.
4. Budget: a tenant or ancestor whose monthly GPU-hour budget is spent admits nothing new.

Guarantees are what preemption honours: a tenant within its guarantee may reclaim GPUs from tenants
using more than theirs (see `preempt`). Guarantees are not checked against physical capacity; an
oversubscribed configuration simply cannot honour them all.

The book is the cycle's working state; `add` keeps it current as the cycle admits gangs.

GPU variants count against their family's quota (`Snapshot.gpu_families`): a cap on `A100` bounds
A100-40GB and A100-80GB together, unless a quota or cap names the variant itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from placement import explain
from placement.model import GpuType, RunningGang, TenantId, TenantQuota, WaitCode, WaitReason

# `limit_reason`'s mark of an answer not kept (None is an answer: no limit is broken). Final: the
# compiled form reads it as a static, where a module global is a dict lookup (twice an ask).
_NOT_KEPT: Final = WaitReason(WaitCode.INSUFFICIENT_CAPACITY, "(not kept)")
# A tenant with no entry in a per-tenant table below: read, never written.
_NONE: Final[dict[GpuType, int]] = {}


class QuotaBook:
    def __init__(
        self,
        tenants: Iterable[TenantQuota],
        running: Iterable[RunningGang],
        families: Sequence[tuple[GpuType, GpuType]] = (),
    ) -> None:
        tenants = tuple(tenants)
        named = {t for q in tenants for t, _ in q.gpu_caps} | {s.gpu_type for q in tenants for s in q.quotas}
        # Variant -> family, for variants no quota names whose family one does.
        self.account = {t: f for t, f in sorted(families) if t not in named and f in named and t != f}
        merged: dict[TenantId, TenantQuota] = {}
        # A tenant listed twice is a config mistake; merge the entries in a fixed order so that the outcome
        # does not depend on the snapshot's order (the lower cap wins, the first parent in order).
        # Sorted only when a tenant is listed twice: otherwise each tenant's entry is its own whatever
        # the order, and nothing reads the book's tenants in order (the sort's key is each entry's
        # `repr`, worked out by the dataclass's interpreted method: a tenth of the book's setup).
        listed = {quota.tenant for quota in tenants}
        for quota in tenants if len(listed) == len(tenants) else sorted(tenants, key=repr):
            known = merged.get(quota.tenant)
            if known is None:
                merged[quota.tenant] = quota
                continue
            merged[quota.tenant] = TenantQuota(
                tenant=known.tenant,
                gpu_caps=known.gpu_caps + quota.gpu_caps,
                parent=known.parent if known.parent is not None else quota.parent,
                quotas=known.quotas + quota.quotas,
                weight=known.weight,
                monthly_budget_gpu_hours=known.monthly_budget_gpu_hours,
                spent_gpu_hours=known.spent_gpu_hours,
                usage_history_gpu_hours=known.usage_history_gpu_hours,
                max_priority=known.max_priority,
            )
        self.tenants = merged
        self.path: dict[TenantId, tuple[TenantId, ...]] = {t: self._path_of(t) for t in merged}
        has_children = {parent for path in self.path.values() for parent in path[1:]}
        self._leaves = {t for t in merged if t not in has_children}
        # The tightest of cap and guarantee + borrowing limit, per (tenant, type) that has either.
        self._limits: dict[tuple[TenantId, GpuType], int] = {}
        for quota in merged.values():
            types = {gpu_type for gpu_type, _ in quota.gpu_caps} | {q.gpu_type for q in quota.quotas}
            for gpu_type in types:
                limits: list[int | None] = [quota.cap_for(gpu_type)]
                share = quota.quota_for(gpu_type)
                if share is not None and share.borrowing_limit_gpus is not None:
                    limits.append(share.guaranteed_gpus + share.borrowing_limit_gpus)
                bounds = [limit for limit in limits if limit is not None]
                if bounds:
                    self._limits[(quota.tenant, gpu_type)] = min(bounds)
        self._guaranteed: dict[tuple[TenantId, GpuType], int] = {}
        for quota in merged.values():
            for gpu_type in {q.gpu_type for q in quota.quotas}:
                share = quota.quota_for(gpu_type)
                if share is not None:
                    self._guaranteed[(quota.tenant, gpu_type)] = share.guaranteed_gpus
        self._limit_reasons: dict[tuple[TenantId, GpuType, int, int], WaitReason] = {}
        self._budget_reasons: dict[TenantId, WaitReason | None] = {}
        # `limit_reason`'s answers by tenant, type and GPUs, kept while `changes` is what it was when
        # they were worked out.
        self._limits_kept: dict[TenantId, dict[GpuType, dict[int, WaitReason | None]]] = {}
        self._limits_kept_at = 0
        self.usage: dict[tuple[TenantId, GpuType], int] = {}
        # The same figures per tenant, then type, for the questions asked per gang (limits, guarantees,
        # borrowing): two lookups by strings, whose hashes are kept, where a (tenant, type) key was a
        # pair made and hashed per ask. `_room_of` is the guarantee less usage (`add` keeps it).
        self._usage_of: dict[TenantId, dict[GpuType, int]] = {}
        self._limits_of: dict[TenantId, dict[GpuType, int]] = {}
        for (tenant, gpu_type), limit in self._limits.items():
            self._limits_of.setdefault(tenant, {})[gpu_type] = limit
        self._room_of: dict[TenantId, dict[GpuType, int]] = {}
        for (tenant, gpu_type), guaranteed in self._guaranteed.items():
            self._room_of.setdefault(tenant, {})[gpu_type] = guaranteed
        # How many times usage was added to in the cycle (`plan._Cycle._state`), and per tenant how many
        # times its own usage (its and its descendants' GPUs) was (`guarantee_headroom`).
        self.changes = 0
        self.tenant_changes: dict[TenantId, int] = {}
        # GPUs held back per type by lenders, summed over leaves, and each leaf's part.
        self.held_back: dict[GpuType, int] = {}
        self._held_back_by: dict[tuple[TenantId, GpuType], int] = {}
        for quota in merged.values():
            for q in quota.quotas:
                self._update_held_back(quota.tenant, q.gpu_type)
        # The running gangs' GPUs summed per (tenant, type) first, then added once each: usage is a
        # sum and what lenders hold back follows usage, so the book is the one adding gang by gang
        # makes (`changes` counts within a cycle only: it is compared, never read as a number).
        held: dict[tuple[TenantId, GpuType], int] = {}
        for gang in running:
            key = (gang.tenant, gang.gpu_type)
            held[key] = held.get(key, 0) + gang.gpu_count
        for (tenant, gpu_type), gpus in held.items():
            self.add(tenant, gpu_type, gpus)
        # The running gangs' GPUs per (tenant, type as the gangs name it), for fair shares
        # (`plan._Cycle`), which summed them again.
        self.running_gpus = held

    def _path_of(self, tenant: TenantId) -> tuple[TenantId, ...]:
        """The tenant and its ancestors, nearest first; a parent cycle or unknown parent ends the path."""
        path = [tenant]
        parent = self.tenants[tenant].parent if tenant in self.tenants else None
        while parent is not None and parent in self.tenants and parent not in path:
            path.append(parent)
            parent = self.tenants[parent].parent
        return tuple(path)

    def known(self, tenant: TenantId) -> bool:
        return tenant in self.tenants

    def held(self, tenant: TenantId, gpu_type: GpuType) -> int:
        gpu_type = self.account.get(gpu_type, gpu_type)
        return self.usage.get((tenant, gpu_type), 0)

    def guaranteed(self, tenant: TenantId, gpu_type: GpuType) -> int:
        gpu_type = self.account.get(gpu_type, gpu_type)
        return self._guaranteed.get((tenant, gpu_type), 0)

    def within_guarantee(self, tenant: TenantId, gpu_type: GpuType, need: int) -> bool:
        # `held` and `guaranteed` written out: asked for every type of most gangs a cycle makes room
        # for, where the two calls looked the family up thrice and made the key twice.
        return need <= self._room_of.get(tenant, _NONE).get(self.account.get(gpu_type, gpu_type), 0)

    def within_any_guarantee(self, tenant: TenantId, gpu_types: Iterable[GpuType], need: int) -> bool:
        """Whether `need` more GPUs of one of these types stay within the tenant's guarantee."""
        rooms, account = self._room_of.get(tenant, _NONE), self.account
        return any(need <= rooms.get(account.get(gpu_type, gpu_type), 0) for gpu_type in gpu_types)

    def guarantee_headroom(self, tenant: TenantId, gpu_types: Iterable[GpuType]) -> int | None:
        """The most GPUs the tenant could take of one of these types and stay within its guarantee of
        that type (negative when it is past every one), None for no types: `within_any_guarantee`
        answers `need <= headroom`. It reads the tenant's own usage and nothing else that changes, so
        it holds while `tenant_changes[tenant]` is unchanged."""
        rooms, account = self._room_of.get(tenant, _NONE), self.account
        most: int | None = None
        for gpu_type in gpu_types:
            room = rooms.get(account.get(gpu_type, gpu_type), 0)
            if most is None or room > most:
                most = room
        return most

    def borrowing(self, tenant: TenantId, gpu_type: GpuType, minus: int = 0) -> bool:
        """Whether the tenant holds more than its guarantee, after giving back `minus` GPUs."""
        # usage - minus > guaranteed, as guaranteed - usage < -minus
        return self._room_of.get(tenant, _NONE).get(self.account.get(gpu_type, gpu_type), 0) < -minus

    def add(self, tenant: TenantId, gpu_type: GpuType, gpus: int) -> None:
        gpu_type = self.account.get(gpu_type, gpu_type)
        self.changes += 1
        tenant_changes = self.tenant_changes
        for node in self.path.get(tenant, (tenant,)):
            key = (node, gpu_type)
            self.usage[key] = self.usage.get(key, 0) + gpus
            used = self._usage_of.get(node)
            if used is None:
                used = self._usage_of[node] = {}
            used[gpu_type] = used.get(gpu_type, 0) + gpus
            rooms = self._room_of.get(node)
            if rooms is None:
                rooms = self._room_of[node] = {}
            rooms[gpu_type] = rooms.get(gpu_type, 0) - gpus
            tenant_changes[node] = tenant_changes.get(node, 0) + 1
        self._update_held_back(tenant, gpu_type)

    def _update_held_back(self, tenant: TenantId, gpu_type: GpuType) -> None:
        if tenant not in self._leaves:
            return
        quota = self.tenants[tenant].quota_for(gpu_type)
        held_back = 0
        if quota is not None and quota.lending_limit_gpus is not None:
            unused = quota.guaranteed_gpus - self.held(tenant, gpu_type)
            held_back = max(0, unused - quota.lending_limit_gpus)
        key = (tenant, gpu_type)
        before = self._held_back_by.get(key, 0)
        if held_back != before:
            self._held_back_by[key] = held_back
            self.held_back[gpu_type] = self.held_back.get(gpu_type, 0) + held_back - before

    def excess(self, tenant: TenantId, gpu_type: GpuType, need: int) -> int:
        """How many GPUs of the type the tenant must give back so that `need` more pass every cap and
        borrowing limit from it up the tree (0: they pass now)."""
        gpu_type = self.account.get(gpu_type, gpu_type)
        usage, limits = self.usage, self._limits
        over = 0
        for node in self.path[tenant]:
            limit = limits.get((node, gpu_type))
            if limit is not None:
                over = max(over, usage.get((node, gpu_type), 0) + need - limit)
        return over

    def limit_reason(self, tenant: TenantId, gpu_type: GpuType, need: int) -> WaitReason | None:
        """The first cap or borrowing limit, from the tenant up, that admitting `need` GPUs would break.

        Asked for every type of every gang a cycle decides; the answer depends only on usage, so it
        is kept per (tenant, type, GPUs) while usage is unchanged (`changes`): three asks in four of a
        steady cycle find it kept."""
        if self.changes != self._limits_kept_at:
            self._limits_kept.clear()
            self._limits_kept_at = self.changes
        by_type = self._limits_kept.get(tenant)
        if by_type is None:
            by_type = self._limits_kept[tenant] = {}
        by_need = by_type.get(gpu_type)
        if by_need is None:
            by_need = by_type[gpu_type] = {}
        kept = by_need.get(need, _NOT_KEPT)
        if kept is _NOT_KEPT:
            kept = by_need[need] = self.limit_reason_now(tenant, gpu_type, need)
        return kept

    def limit_reason_now(self, tenant: TenantId, gpu_type: GpuType, need: int) -> WaitReason | None:
        """`limit_reason` worked out from usage as it is, without the kept answers."""
        gpu_type = self.account.get(gpu_type, gpu_type)
        usage, limits = self._usage_of, self._limits_of
        for node in self.path[tenant]:
            limit = limits.get(node, _NONE).get(gpu_type)
            if limit is None:
                continue
            held = usage.get(node, _NONE).get(gpu_type, 0)
            if held + need > limit:
                # A tenant at its limit stays there for many gangs of a long queue: one reason each.
                key = (node, gpu_type, held, need)
                reason = self._limit_reasons.get(key)
                if reason is None:
                    reason = self._limit_reasons[key] = self._limit_reason(node, gpu_type, need)
                return reason
        return None

    def _limit_reason(self, node: TenantId, gpu_type: GpuType, need: int) -> WaitReason:
        quota, held = self.tenants[node], self.held(node, gpu_type)
        cap = quota.cap_for(gpu_type)
        if cap is not None and held + need > cap:
            return explain.cap_reached(node, gpu_type, cap, held, need)
        share = quota.quota_for(gpu_type)
        assert share is not None
        assert share.borrowing_limit_gpus is not None
        return explain.borrowing_limit(
            node, gpu_type, share.guaranteed_gpus, share.borrowing_limit_gpus, held, need
        )

    def lending_reason(self, tenant: TenantId, gpu_type: GpuType, need: int, free: int) -> WaitReason | None:
        """Why borrowing `need` GPUs would eat into capacity other tenants hold back, if it would."""
        gpu_type = self.account.get(gpu_type, gpu_type)
        held_back = self.held_back.get(gpu_type, 0)
        if not held_back or self.within_guarantee(tenant, gpu_type, need):
            return None
        others = held_back - self._held_back_by.get((tenant, gpu_type), 0)
        if others <= 0 or free - need >= others:
            return None
        return explain.quota_exhausted(
            tenant,
            gpu_type,
            self.guaranteed(tenant, gpu_type),
            self.held(tenant, gpu_type),
            need,
            free,
            others,
        )

    def budget_reason(self, tenant: TenantId) -> WaitReason | None:
        """The first spent budget from the tenant up. Asked of every queued gang; budgets and what is
        spent are the snapshot's and do not change in a cycle, so each tenant's answer is kept."""
        if tenant in self._budget_reasons:
            return self._budget_reasons[tenant]
        reason = None
        for node in self.path[tenant]:
            quota = self.tenants[node]
            budget = quota.monthly_budget_gpu_hours
            if budget is not None and quota.spent_gpu_hours >= budget:
                reason = explain.budget_spent(node, budget, quota.spent_gpu_hours)
                break
        self._budget_reasons[tenant] = reason
        return reason
