"""The first placement policy: greedy admission in priority order, each gang to its cheapest fit.

`plan` is one scheduling cycle's decision. It is written as numbered steps over a small working state
so that later policies (reservations and backfill, borrowing quotas, preemption, fair share) become
steps of their own rather than a rewrite:

1. Order the queue: priority (highest first), then queue time, then job id.
2. Build the working state: free GPUs of every pool group (see `_Offer`) and GPUs each tenant holds
   by GPU type (from `snapshot.running`).
3. For each gang in that order, choose among feasible placements: lowest price, then capacity kind
   (private, then on demand, then spot, which carries restart risk), then the tightest packing (fewest
   GPUs stranded on the nodes it touches, then fewest nodes), then cluster name, then GPU type. With
   `GpuTypePolicy.ORDERED` a later GPU type is tried only when no earlier type has any placement.
   Admit the gang and deduct its GPUs from the working state.
4. A gang with no placement waits, with every reason that blocks it, and does not hold up later
   gangs (greedy: there are no reservations yet).

Every input tuple is read through a sort on stable keys or folded into order-free counts, so equal
snapshots give equal plans whatever the order of their tuples.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Final

from placement.fit import FreeHistogram, HistogramFit, gang_shape
from placement.model import (
    Admission,
    CapacityKind,
    ClusterName,
    ClusterState,
    GangRequest,
    GpuType,
    GpuTypePolicy,
    NodePool,
    Plan,
    RunningGang,
    Snapshot,
    TenantId,
    TenantQuota,
    Waiting,
    WaitReason,
)
from placement.model import WaitCode as Code

_KIND_RANK: Final = {CapacityKind.PRIVATE: 0, CapacityKind.ON_DEMAND: 1, CapacityKind.SPOT: 2}
# The order in which a waiting job's reasons are listed: what the user must fix first comes first.
_CODE_RANK: Final = {
    code: rank
    for rank, code in enumerate(
        (
            Code.UNKNOWN_TENANT,
            Code.NO_CLUSTER_HAS_GPU_TYPE,
            Code.SPOT_NOT_ALLOWED,
            Code.CLUSTER_UNREACHABLE,
            Code.TENANT_CAP_REACHED,
            Code.GANG_LARGER_THAN_CLUSTER,
            Code.INSUFFICIENT_CAPACITY,
        )
    )
}
# A list of reasons split by code, in `_CODE_RANK` order.
_ByCode = tuple[tuple[WaitReason, ...], ...]


def plan(snapshot: Snapshot, *, now: float) -> Plan:
    """Decide which queued gangs to admit where, and why the others wait.

    `now` is the cycle's time; this first policy does not read it (queue order uses `queued_at_s`),
    but later steps (reservations, aging) will.
    """
    cycle = _Cycle(snapshot)
    for gang in sorted(snapshot.queued, key=_queue_key):
        cycle.decide(gang)
    return Plan(admissions=tuple(cycle.admissions), waiting=tuple(cycle.waiting))


def _queue_key(gang: GangRequest) -> tuple[int, float, str]:
    return (-gang.priority, gang.queued_at_s, gang.job_id)


class _Offer:
    """The pools of one cluster that one gang may span: same GPU type, capacity kind and price."""

    __slots__ = (
        "_fits",
        "_fits_empty",
        "capacity",
        "free",
        "kind",
        "rank",
        "search_key",
        "usd_per_gpu_hour",
        "version",
        "view",
    )

    def __init__(
        self, view: _View, kind: CapacityKind, usd_per_gpu_hour: float, pools: Sequence[NodePool]
    ) -> None:
        self.view = view
        self.kind = kind
        self.usd_per_gpu_hour = usd_per_gpu_hour
        nodes = [(free, max(free, pool.gpus_per_node)) for pool in pools for free in pool.free_gpus_per_node]
        self.free = FreeHistogram(free for free, _ in nodes)
        # The same nodes with nothing running: decides whether a gang could ever fit here.
        self.capacity = FreeHistogram(size for _, size in nodes)
        self.rank = (usd_per_gpu_hour, _KIND_RANK[kind])
        self.search_key = (*self.rank, view.cluster, view.gpu_type)
        self._fits_empty: dict[tuple[int, ...], bool] = {}
        # Bumped by every admission here. Most offers are unchanged between two gangs of a queue, and
        # a queue repeats few shapes, so fits are cached by shape for the current version.
        self.version = 0
        self._fits: dict[tuple[int, ...], tuple[int, HistogramFit | None]] = {}

    def fit(self, shape: tuple[int, ...]) -> HistogramFit | None:
        cached = self._fits.get(shape)
        if cached is not None and cached[0] == self.version:
            return cached[1]
        placed = self.free.fit(shape)
        self._fits[shape] = (self.version, placed)
        return placed

    def fits_when_empty(self, shape: tuple[int, ...]) -> bool:
        fits = self._fits_empty.get(shape)
        if fits is None:
            fits = self._fits_empty[shape] = self.capacity.fit(shape) is not None
        return fits


class _View:
    """One cluster's pool groups of one GPU type: what a wait reason speaks about.

    Thousands of waiting gangs ask the same views the same question between two admissions, so
    reasons are cached by gang shape and invalidated by `version`, which each admission here bumps.
    """

    __slots__ = ("_blockers", "_by_shape", "_usable", "cluster", "gpu_type", "offers", "reachable", "version")

    def __init__(self, cluster: ClusterName, gpu_type: GpuType, reachable: bool) -> None:
        self.cluster = cluster
        self.gpu_type = gpu_type
        self.reachable = reachable
        self.offers: list[_Offer] = []
        self.version = 0
        # (shape, allow_spot) -> (version the reason holds for, or None for always; reason)
        self._by_shape: dict[tuple[tuple[int, ...], bool], tuple[int | None, WaitReason]] = {}
        # Filled on first use, once `offers` is complete.
        self._usable: dict[bool, list[_Offer]] = {}
        self._blockers: dict[bool, WaitReason | None] = {}

    def usable(self, allow_spot: bool) -> list[_Offer]:
        usable = self._usable.get(allow_spot)
        if usable is None:
            usable = [offer for offer in self.offers if allow_spot or offer.kind is not CapacityKind.SPOT]
            self._usable[allow_spot] = usable
        return usable

    def blocker(self, allow_spot: bool) -> WaitReason | None:
        """A reason that rules this view out for the gang whatever its size, if there is one."""
        if allow_spot not in self._blockers:
            self._blockers[allow_spot] = self._find_blocker(allow_spot)
        return self._blockers[allow_spot]

    def _find_blocker(self, allow_spot: bool) -> WaitReason | None:
        cluster, gpu_type = self.cluster, self.gpu_type
        if not self.reachable:
            message = f"cluster {cluster} has GPUs of {gpu_type} but is unreachable"
            return WaitReason(Code.CLUSTER_UNREACHABLE, message, cluster, gpu_type)
        if not self.usable(allow_spot):
            message = (
                f"cluster {cluster} has GPUs of {gpu_type} only as spot capacity; the job does not allow spot"
            )
            return WaitReason(Code.SPOT_NOT_ALLOWED, message, cluster, gpu_type)
        return None

    def capacity_reason(self, shape: tuple[int, ...], allow_spot: bool) -> WaitReason:
        """Why a gang of this shape, known not to fit any usable offer here now, does not fit."""
        cached = self._by_shape.get((shape, allow_spot))
        if cached is not None and cached[0] in (None, self.version):
            return cached[1]
        cluster, gpu_type, usable = self.cluster, self.gpu_type, self.usable(allow_spot)
        valid_for: int | None = self.version
        if not any(offer.fits_when_empty(shape) for offer in usable):
            valid_for = None
            size = max(usable, key=lambda o: o.capacity.total_free).capacity
            message = (
                f"needs {_describe(shape)} of {gpu_type}; cluster {cluster} has only {size.total_free} GPUs "
                f"of {gpu_type} on {size.node_count} nodes, at most {size.max_free} on one node"
            )
            if len(usable) > 1:
                message += " (pools of different kind or price cannot be combined; largest shown)"
            reason = WaitReason(Code.GANG_LARGER_THAN_CLUSTER, message, cluster, gpu_type)
        else:
            free = sum(offer.free.total_free for offer in usable)
            per_node = max(offer.free.max_free for offer in usable)
            message = (
                f"needs {_describe(shape)} of {gpu_type}; cluster {cluster} has {free} free, "
                f"at most {per_node} on one node"
            )
            reason = WaitReason(Code.INSUFFICIENT_CAPACITY, message, cluster, gpu_type)
        self._by_shape[(shape, allow_spot)] = (valid_for, reason)
        return reason


class _Inventory:
    """Every pool group of the snapshot, indexed for the two questions the cycle asks."""

    def __init__(self, clusters: Iterable[ClusterState]) -> None:
        groups: dict[tuple[ClusterName, GpuType, CapacityKind, float], list[NodePool]] = {}
        reachable: dict[ClusterName, bool] = {}
        for cluster in clusters:
            reachable[cluster.name] = reachable.get(cluster.name, True) and cluster.reachable
            for pool in cluster.pools:
                key = (cluster.name, pool.gpu_type, pool.kind, pool.usd_per_gpu_hour)
                groups.setdefault(key, []).append(pool)
        views: dict[tuple[ClusterName, GpuType], _View] = {}
        for (cluster_name, gpu_type, kind, price), pools in sorted(groups.items(), key=lambda item: item[0]):
            view = views.get((cluster_name, gpu_type))
            if view is None:
                view = views[(cluster_name, gpu_type)] = _View(
                    cluster_name, gpu_type, reachable[cluster_name]
                )
            view.offers.append(_Offer(view, kind, price, pools))
        # For reasons: each type's views in cluster name order.
        self.by_type: dict[GpuType, list[_View]] = {}
        for (_, gpu_type), view in sorted(views.items()):
            self.by_type.setdefault(gpu_type, []).append(view)
        self._search: dict[tuple[tuple[GpuType, ...], bool], list[_Offer]] = {}
        self._type_version = dict.fromkeys(self.by_type, 0)
        self._reasons: dict[tuple[GpuType, tuple[int, ...], bool, bool], tuple[int, _ByCode]] = {}

    def take(self, offer: _Offer, placed: HistogramFit) -> None:
        offer.free.take(placed)
        offer.version += 1
        offer.view.version += 1
        self._type_version[offer.view.gpu_type] += 1

    def cluster_reasons(
        self, gpu_type: GpuType, shape: tuple[int, ...], allow_spot: bool, capped: bool
    ) -> _ByCode:
        """Why each cluster with this type cannot take a gang of this shape that fits none of them now.

        Cached per type until the next admission of that type: a long queue repeats few shapes.
        """
        key = (gpu_type, shape, allow_spot, capped)
        version = self._type_version.get(gpu_type, 0)
        cached = self._reasons.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        reasons = []
        for view in self.by_type.get(gpu_type, ()):
            reason = view.blocker(allow_spot)
            if reason is None and not capped:
                reason = view.capacity_reason(shape, allow_spot)
            if reason is not None:
                reasons.append(reason)
        by_code = _by_code(reasons)
        self._reasons[key] = (version, by_code)
        return by_code

    def search_order(self, gpu_types: Iterable[GpuType], allow_spot: bool) -> list[_Offer]:
        """Reachable offers of these types that the gang may use, cheapest first (cached)."""
        types = tuple(sorted(set(gpu_types)))
        found = self._search.get((types, allow_spot))
        if found is None:
            found = sorted(
                (
                    offer
                    for gpu_type in types
                    for view in self.by_type.get(gpu_type, ())
                    if view.reachable
                    for offer in view.usable(allow_spot)
                ),
                key=lambda o: o.search_key,
            )
            self._search[(types, allow_spot)] = found
        return found


class _Cycle:
    """The working state of one `plan` call and the decision for one gang at a time."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.inventory = _Inventory(snapshot.clusters)
        self.caps = _caps_by_tenant(snapshot.tenants)
        self.usage = _usage_by_tenant_and_type(snapshot.running)
        self.admissions: list[Admission] = []
        self.waiting: list[Waiting] = []

    def decide(self, gang: GangRequest) -> None:
        if gang.tenant not in self.caps:
            reason = WaitReason(Code.UNKNOWN_TENANT, f"tenant {gang.tenant} is not known to the federation")
            self.waiting.append(Waiting(gang.job_id, (reason,)))
            return
        shape = gang_shape(gang.replica_gpus)
        types = tuple(dict.fromkeys(gang.gpu_types))
        chosen = self._choose(gang, shape, types)
        if chosen is None:
            self.waiting.append(Waiting(gang.job_id, _explain(self, gang, shape, types)))
            return
        offer, placed = chosen
        self.inventory.take(offer, placed)
        cluster, gpu_type = offer.view.cluster, offer.view.gpu_type
        key = (gang.tenant, gpu_type)
        self.usage[key] = self.usage.get(key, 0) + gang.gpu_count
        self.admissions.append(Admission(gang.job_id, cluster, gpu_type, offer.kind, offer.usd_per_gpu_hour))

    def cap_left(self, tenant: TenantId, gpu_type: GpuType) -> int | None:
        """GPUs of this type the tenant may still take, or None when uncapped."""
        cap = self.caps[tenant].get(gpu_type)
        return None if cap is None else cap - self.usage.get((tenant, gpu_type), 0)

    def _choose(
        self, gang: GangRequest, shape: tuple[int, ...], types: tuple[GpuType, ...]
    ) -> tuple[_Offer, HistogramFit] | None:
        need = gang.gpu_count
        allowed = []
        for gpu_type in types:
            left = self.cap_left(gang.tenant, gpu_type)
            if left is None or need <= left:
                allowed.append(gpu_type)
        if gang.gpu_type_policy is GpuTypePolicy.ANY:
            return _cheapest_fit(self.inventory.search_order(allowed, gang.allow_spot), shape)
        for gpu_type in allowed:
            chosen = _cheapest_fit(self.inventory.search_order((gpu_type,), gang.allow_spot), shape)
            if chosen is not None:
                return chosen
        return None


def _cheapest_fit(offers: Sequence[_Offer], shape: tuple[int, ...]) -> tuple[_Offer, HistogramFit] | None:
    """The best placement among `offers` (sorted by `search_key`), or None.

    Price and kind come first, so only offers tied with the first feasible one on both are compared
    on packing; ties after that go to the earlier offer, i.e. by cluster name, then GPU type.
    """
    need = sum(shape)
    largest = shape[0] if shape else 0
    best: tuple[_Offer, HistogramFit] | None = None
    best_packing = (0, 0)
    for offer in offers:
        if best is not None and offer.rank != best[0].rank:
            break
        free = offer.free
        if free.total_free < need or free.max_free < largest:
            continue
        # A gang touches at least ceil(need / max_free) nodes here; skip offers that cannot beat the best.
        if best is not None and best_packing <= (0, -(-need // max(free.max_free, 1))):
            continue
        placed = offer.fit(shape)
        if placed is None:
            continue
        if best is None or placed.packing_key < best_packing:
            best, best_packing = (offer, placed), placed.packing_key
    return best


def _caps_by_tenant(tenants: Iterable[TenantQuota]) -> dict[TenantId, dict[GpuType, int]]:
    """Each known tenant's caps by GPU type; if a tenant or a type is listed twice, the lower cap wins."""
    caps: dict[TenantId, dict[GpuType, int]] = {}
    for quota in tenants:
        tenant_caps = caps.setdefault(quota.tenant, {})
        for gpu_type, cap in quota.gpu_caps:
            tenant_caps[gpu_type] = min(cap, tenant_caps.get(gpu_type, cap))
    return caps


def _usage_by_tenant_and_type(running: Iterable[RunningGang]) -> dict[tuple[TenantId, GpuType], int]:
    usage: dict[tuple[TenantId, GpuType], int] = {}
    for gang in running:
        key = (gang.tenant, gang.gpu_type)
        usage[key] = usage.get(key, 0) + gang.gpu_count
    return usage


def _explain(
    cycle: _Cycle, gang: GangRequest, shape: tuple[int, ...], types: tuple[GpuType, ...]
) -> tuple[WaitReason, ...]:
    """Every reason that keeps `gang` from every placement it accepts, most fundamental first.

    Reasons are listed by code (see `_CODE_RANK`), then in the order of the job's GPU types, then by
    cluster name. Where the tenant's cap already rules a GPU type out, that type's cluster capacity is
    not reported: the cap is what must change first.
    """
    tables: list[_ByCode] = []
    missing = [gpu_type for gpu_type in types if gpu_type not in cycle.inventory.by_type]
    if missing or not types:
        names = ", ".join(missing) or "(none listed)"
        only = missing[0] if len(missing) == 1 else None
        message = f"no cluster has GPUs of type {names}"
        tables.append(_by_code([WaitReason(Code.NO_CLUSTER_HAS_GPU_TYPE, message, None, only)]))
    need = gang.gpu_count
    for gpu_type in types:
        left = cycle.cap_left(gang.tenant, gpu_type)
        capped = left is not None and need > left
        if capped:
            cap = cycle.caps[gang.tenant][gpu_type]
            held = cycle.usage.get((gang.tenant, gpu_type), 0)
            message = (
                f"tenant {gang.tenant} may hold {cap} GPUs of {gpu_type}, holds {held}, job needs {need}"
            )
            tables.append(_by_code([WaitReason(Code.TENANT_CAP_REACHED, message, None, gpu_type)]))
        # `_choose` found no fit on this type, so the gang fits no usable offer of it now.
        tables.append(cycle.inventory.cluster_reasons(gpu_type, shape, gang.allow_spot, capped))
    return tuple(reason for code in range(len(_CODE_RANK)) for table in tables for reason in table[code])


def _by_code(reasons: Iterable[WaitReason]) -> _ByCode:
    slots: list[list[WaitReason]] = [[] for _ in _CODE_RANK]
    for reason in reasons:
        slots[_CODE_RANK[reason.code]].append(reason)
    return tuple(tuple(slot) for slot in slots)


def _describe(shape: tuple[int, ...]) -> str:
    """'4 x 8 GPUs', or '1 x 8 + 2 x 4 GPUs' for mixed replicas."""
    if not shape:
        return "0 GPUs"
    counts = sorted(Counter(shape).items(), reverse=True)
    return " + ".join(f"{n} x {gpus}" for gpus, n in counts) + " GPUs"
