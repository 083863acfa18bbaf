"""Fair share among tenants of equal priority: weighted dominant-resource fairness (DRF).

Each GPU type is a resource. A tenant's share of a type is the GPUs it holds divided by the
federation's reachable GPUs of that type; its dominant share is the largest of these, divided by its
weight. Within one priority, the tenant with the lowest dominant share goes next, so a tenant with
twice the weight may hold twice as much before it yields.

With `PolicyConfig.fair_share_history` on, recent usage counts too: the tenant's decayed GPU-hours
of history (from the ledger, per type) spread over `history_horizon_h` are added to what it holds,
so a tenant that hogged a type yesterday waits behind one that did not.

Shares change only when the tenant itself is admitted something, which is what lets the cycle keep
one heap of tenants per priority and update a single entry per admission.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from operator import attrgetter
from typing import Final, cast

from placement.model import GangRequest, GpuType, PolicyConfig, TenantId, TenantQuota

# Final: the compiled form reads them as statics, where a module global is a dict lookup.
_QUEUE_ORDER: Final = attrgetter("queued_at_s", "job_id")
_QUEUED_AT: Final = attrgetter("queued_at_s")
_JOB_ID: Final = attrgetter("job_id")
_PRIORITY: Final = attrgetter("priority")


def _sort_by_queue_order(gangs: list[GangRequest]) -> bool:
    """Sort the gangs in place by queue time, then job id: on the times alone (floats, which the sort
    compares fastest, where each pair of a (time, id) key was a tuple made and compared), then each
    run of equal times by id. The sorts are stable, so the order is the pair's. Times that are not
    numbers sort by the pair, as before (the order a sort leaves them in then depends on the order it
    is given); whether every time is a number."""
    if any(gang.queued_at_s != gang.queued_at_s for gang in gangs):
        gangs.sort(key=_QUEUE_ORDER)
        return False
    gangs.sort(key=_QUEUED_AT)
    count = len(gangs)
    start = 0
    while start < count:
        at = gangs[start].queued_at_s
        end = start + 1
        while end < count and gangs[end].queued_at_s == at:
            end += 1
        if end - start > 1:
            gangs[start:end] = sorted(gangs[start:end], key=_JOB_ID)
        start = end
    return True


def tenant_lists(queued: Iterable[GangRequest]) -> tuple[dict[TenantId, list[GangRequest]], bool]:
    """Each tenant's gangs in its own order: priority first (highest first), then queue time and id;
    and whether every time is a number (`queue_carry` edits the lists only then)."""
    by_tenant: dict[TenantId, list[GangRequest]] = {}
    for gang in queued:
        by_tenant.setdefault(gang.tenant, []).append(gang)
    numbers = True
    for gangs in by_tenant.values():
        # Two sorts on C-level keys, the second stable (also when reversed), cost a third of one sort
        # on a tuple-making lambda.
        numbers = _sort_by_queue_order(gangs) and numbers
        gangs.sort(key=_PRIORITY, reverse=True)
    return by_tenant, numbers


class FairShare:
    def __init__(
        self,
        tenants: Mapping[TenantId, TenantQuota],
        held: Mapping[tuple[TenantId, GpuType], int],
        capacity_by_type: Mapping[GpuType, int],
        policy: PolicyConfig,
    ) -> None:
        self._capacity = {t: gpus for t, gpus in capacity_by_type.items() if gpus > 0}
        self._weight = {t: q.weight if q.weight > 0 else 1.0 for t, q in tenants.items()}
        # GPUs counted per (tenant, type): held now plus, if on, history spread over the horizon.
        self._load: dict[TenantId, dict[GpuType, float]] = {}
        for (tenant, gpu_type), gpus in held.items():
            self._load.setdefault(tenant, {})[gpu_type] = float(gpus)
        if policy.fair_share_history and policy.history_horizon_h > 0:
            for tenant, quota in tenants.items():
                load = self._load.setdefault(tenant, {})
                for gpu_type, gpu_hours in quota.usage_history_gpu_hours:
                    load[gpu_type] = load.get(gpu_type, 0.0) + gpu_hours / policy.history_horizon_h
        self._shares: dict[TenantId, float] = {}
        # Grows with every `add`: what was worked out from the shares holds while it is unchanged.
        self.changes = 0

    def share(self, tenant: TenantId) -> float:
        share = self._shares.get(tenant)
        if share is None:
            load = self._load.get(tenant, {})
            dominant = max(
                (gpus / self._capacity[t] for t, gpus in load.items() if t in self._capacity), default=0.0
            )
            share = self._shares[tenant] = dominant / self._weight.get(tenant, 1.0)
        return share

    def add(self, tenant: TenantId, gpu_type: GpuType, gpus: int) -> None:
        load = self._load.setdefault(tenant, {})
        load[gpu_type] = load.get(gpu_type, 0.0) + gpus
        self._shares.pop(tenant, None)
        self.changes += 1


Entry = tuple[bool, int, float, float, str, TenantId, int]


def fair_order(
    queued: Iterable[GangRequest],
    fair: FairShare,
    within_guarantee: Callable[[GangRequest], bool] = lambda gang: True,
) -> Iterator[GangRequest]:
    """The queue in decision order (`FairOrder`)."""
    return iter(FairOrder(queued, fair, within_guarantee))


class FairOrder:
    """The queue in decision order.

    Tenants take turns by their next gang: first a gang its tenant can run within its guarantee,
    before one that would borrow; then the higher priority; then the tenant with the lowest dominant
    share; then the earlier queue time and job id. Each tenant's own gangs go by priority, then first
    in, first out.

    Guaranteed work goes first whatever its priority because guarantees are reclaimed from borrowers
    whatever theirs: if a borrower went first it would take the GPUs back each time it was requeued,
    be evicted again, and neither job would ever finish (Kueue orders its heads the same way).

    Iterated once, lazily: the caller decides each gang (and updates `fair` and what
    `within_guarantee` reads) before asking for the next, so a tenant's standing is read after its
    previous admission. `heads` tells the caller, between two gangs, what is left and how it stands.
    """

    def __init__(
        self,
        queued: Iterable[GangRequest],
        fair: FairShare,
        within_guarantee: Callable[[GangRequest], bool] = lambda gang: True,
        by_tenant: dict[TenantId, list[GangRequest]] | None = None,
    ) -> None:
        """`by_tenant`, if given, is `tenant_lists(queued)`'s lists (`queue_carry` keeps them from
        the last plan): read, never changed."""
        self.fair = fair
        self.within_guarantee = within_guarantee
        self.by_tenant = tenant_lists(queued)[0] if by_tenant is None else by_tenant
        self.heap: list[Entry] = []
        for tenant in self.by_tenant:
            self.heap.append(self.entry(tenant, 0))
        heapq.heapify(self.heap)
        # Whether the walk has handed out a gang (`heads` reads the heap as the walk leaves it).
        self.started = False

    def entry(self, tenant: TenantId, position: int) -> Entry:
        """How the tenant stands with its gang at `position` next, read now."""
        head = self.by_tenant[tenant][position]
        borrows = not self.within_guarantee(head)
        share = self.fair.share(tenant)
        return (borrows, -head.priority, share, head.queued_at_s, head.job_id, tenant, position)

    def heads(self) -> list[tuple[Entry, list[GangRequest], int]] | None:
        """Right after a gang was handed out (before the next is asked for): each tenant with gangs
        left, as the entry its next gang goes by, its gangs in order and that gang's position (the
        tenant just served is read now, as the walk would read it next). None while the walk is on
        its last tenant, or has not begun."""
        heap = self.heap
        if not self.started or len(heap) < 2:
            return None
        out = []
        for index, entry in enumerate(heap):
            tenant, position = entry[5], entry[6]
            gangs = self.by_tenant[tenant]
            if index == 0:  # the tenant just served: its gang at `position` is handed out
                position += 1
                if position == len(gangs):
                    continue
                entry = self.entry(tenant, position)
            out.append((entry, gangs, position))
        return out

    def advance(self, positions: Mapping[TenantId, int]) -> None:
        """Right after a gang was handed out: the tenants named have had their gangs before the
        positions given handed out too (the caller decided them). A new iteration goes on from there."""
        heads = self.heads()
        assert heads is not None
        heap = []
        for entry, gangs, position in heads:
            tenant = entry[5]
            if tenant in positions:
                position = positions[tenant]
                if position == len(gangs):
                    continue
                entry = self.entry(tenant, position)
            heap.append(entry)
        heapq.heapify(heap)
        self.heap[:] = heap

    def __iter__(self) -> Iterator[GangRequest]:
        # The heap read as a list of plain tuples: typed `Entry`, a fixed-length tuple, the compiled
        # form took each entry read from it apart into its fields and built a new tuple (boxing its
        # numbers) for each comparison, several a gang. The entries are the same tuples.
        heap = cast(list[tuple[object, ...]], self.heap)
        by_tenant = self.by_tenant
        # The fair shares asked of the native class itself: a bound method held as a local is called
        # through its generic Python entry.
        within_guarantee, fair = self.within_guarantee, self.fair
        # The loop runs once per queued gang: names bound locally, the top read by index (a starred
        # unpacking made a list per gang), the entry made inline rather than by a call.
        heapreplace, heappop = heapq.heapreplace, heapq.heappop
        self.started = True
        while heap:
            top = heap[0]
            tenant, position = cast(TenantId, top[5]), cast(int, top[6])
            gangs = by_tenant[tenant]
            if len(heap) == 1:
                # The last tenant with gangs left goes first whatever its standing: the rest of its
                # queue in order, without weighing each gang (a deep queue of one tenant is mostly this).
                yield from islice(gangs, position, None)
                return
            yield gangs[position]
            position += 1
            # Entries are unique (tenant, position), so replacing the top in one sift pops in the same
            # order as a pop and a push.
            if position < len(gangs):
                head = gangs[position]
                entry: tuple[object, ...] = (
                    not within_guarantee(head),
                    -head.priority,
                    fair.share(tenant),
                    head.queued_at_s,
                    head.job_id,
                    tenant,
                    position,
                )
                # A tenant whose next gang still goes before both children of the top keeps the top:
                # the heap stays a heap with two comparisons, where a replace sifts through every
                # level (a tenant is served many times in a row between two changes of its standing).
                # Entries are unique, so the gangs come out in the same order either way.
                size = len(heap)
                if (size < 2 or entry < heap[1]) and (size < 3 or entry < heap[2]):
                    heap[0] = entry
                else:
                    heapreplace(heap, entry)
            else:
                heappop(heap)
