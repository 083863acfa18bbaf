"""The cycle's view of capacity: pool groups ("offers") per cluster and GPU type, and what is left.

An offer is the pools of one cluster that one gang may span: same GPU type, capacity kind, price and
restart risk. Its free GPUs are kept as a `FreeHistogram` (fast to fit many gangs into) and, for the
rare questions that need node identity (what evicting a gang frees, what frees when running gangs
end), as the snapshot's node list plus the shapes admitted since, replayed with the same best-fit
rule.

Thousands of waiting gangs ask the same offers the same question between two admissions, so fits
and reasons are cached by gang shape and invalidated by a version that each change bumps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Final

from placement import explain
from placement.cost import CostModel
from placement.explain import describe
from placement.fit import FreeHistogram, HistogramFit, fit_replicas
from placement.model import (
    CapacityKind,
    ClusterName,
    ClusterState,
    GangRequest,
    GpuType,
    NodePool,
    Pinning,
    PolicyConfig,
    ScalablePool,
    WaitReason,
)
from placement.model import WaitCode as Code

KIND_RANK: Final = {CapacityKind.PRIVATE: 0, CapacityKind.ON_DEMAND: 1, CapacityKind.SPOT: 2}


def price_factor(
    kind: CapacityKind, usd_per_gpu_hour: float, risk_per_hour: float, policy: PolicyConfig
) -> float:
    """USD per GPU-hour of useful work: spot pays again for the work lost at each reclaim."""
    if kind is CapacityKind.SPOT:
        return usd_per_gpu_hour * (1.0 + risk_per_hour * policy.spot_lost_work_h)
    return usd_per_gpu_hour


_WORK_RANK: Final = attrgetter("work_rank")
# `eligible`'s mark for rules not asked about yet in the cycle (None is an answer: every cluster).
_UNASKED: Final[frozenset[ClusterName]] = frozenset({ClusterName("(not asked)")})


def private_tier(offer: Offer, policy: PolicyConfig) -> int:
    """0 for offers taken before others (private ones, with `prefer_private`), else 1."""
    return 0 if policy.prefer_private and offer.kind is CapacityKind.PRIVATE else 1


class Offer:
    """The pools of one cluster that one gang may span, and their free GPUs during the cycle."""

    __slots__ = (
        "_base_nodes",
        "_fits",
        "_fits_empty",
        "_placed",
        "capacity",
        "free",
        "kind",
        "kind_rank",
        "node_sizes",
        "pool_offsets",
        "price_factor",
        "risk_per_hour",
        "search_key",
        "usd_per_gpu_hour",
        "version",
        "view",
        "work_rank",
    )

    def __init__(
        self,
        view: View,
        kind: CapacityKind,
        usd_per_gpu_hour: float,
        risk_per_hour: float,
        pools: Sequence[NodePool],
        policy: PolicyConfig,
    ) -> None:
        self.view = view
        self.kind = kind
        self.kind_rank = KIND_RANK[kind]
        self.usd_per_gpu_hour = usd_per_gpu_hour
        self.price_factor = price_factor(kind, usd_per_gpu_hour, risk_per_hour, policy)
        self.risk_per_hour = risk_per_hour
        self.pool_offsets: dict[str, int] = {}
        nodes: list[int] = []
        sizes: list[int] = []
        for pool in pools:
            self.pool_offsets.setdefault(pool.name, len(nodes))
            free_per_node, per_node = pool.free_gpus_per_node, pool.gpus_per_node
            nodes.extend(free_per_node)
            if max(free_per_node, default=0) <= per_node:
                # The usual case, and a replay's elastic cloud pools of hundreds of nodes every cycle.
                sizes.extend([per_node] * len(free_per_node))
            else:
                sizes.extend(max(free, per_node) for free in free_per_node)
        self._base_nodes = nodes
        self._placed: list[tuple[int, ...]] = []
        self.node_sizes = tuple(sizes)
        self.free = FreeHistogram(nodes)
        # The same nodes with nothing running: decides whether a gang could ever fit here.
        self.capacity = FreeHistogram(sizes)
        self.search_key = (view.cluster, view.gpu_type, self.kind_rank, usd_per_gpu_hour, risk_per_hour)
        self._fits_empty: dict[tuple[int, ...], bool] = {}
        self.version = 0
        self._fits: dict[tuple[int, ...], tuple[int, HistogramFit | None]] = {}
        # Place in the inventory's order of every offer by price per unit of work (`by_work_price`).
        self.work_rank = 0

    @property
    def is_private(self) -> bool:
        return self.kind is CapacityKind.PRIVATE

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

    def nodes(self) -> list[int]:
        """Free GPUs per node now: the snapshot's nodes with this cycle's admissions replayed."""
        nodes = list(self._base_nodes)
        for shape in self._placed:
            taken = fit_replicas(shape, nodes)
            if taken is None:  # pragma: no cover - the histogram admitted it, and both follow one rule
                raise AssertionError("node list and histogram disagree")
            nodes = [free - t for free, t in zip(nodes, taken, strict=True)]
        self._base_nodes, self._placed = nodes, []
        return list(nodes)

    def node_index(self, pool: str, index: int) -> int | None:
        offset = self.pool_offsets.get(pool)
        return None if offset is None else offset + index


class View:
    """One cluster's offers of one GPU type: what a wait reason speaks about."""

    __slots__ = (
        "_blockers",
        "_by_shape",
        "_described",
        "_usable",
        "cluster",
        "gpu_type",
        "index",
        "offers",
        "reachable",
        "store",
        "version",
    )

    def __init__(
        self,
        cluster: ClusterName,
        gpu_type: GpuType,
        reachable: bool,
        store: str | None,
        described: dict[tuple[int, ...], str],
    ) -> None:
        self.cluster = cluster
        # Shape descriptions, shared by every view of the cycle: reasons repeat few shapes.
        self._described = described
        self.gpu_type = gpu_type
        self.reachable = reachable
        self.store = store
        self.offers: list[Offer] = []
        self.version = 0
        # Position among the views of its GPU type (cluster name order).
        self.index = 0
        # (shape, allow_spot) -> (figures the reason holds for, or None for always; reason)
        self._by_shape: dict[tuple[tuple[int, ...], bool], tuple[tuple[int, int] | None, WaitReason]] = {}
        self._usable: dict[bool, list[Offer]] = {}
        self._blockers: dict[bool, WaitReason | None] = {}

    def usable(self, allow_spot: bool) -> list[Offer]:
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

    def capacity_reason(
        self, shape: tuple[int, ...], allow_spot: bool, figures: tuple[int, int]
    ) -> WaitReason:
        """Why a gang of this shape does not fit, given the usable offers' free GPUs and largest block.

        Worded once per (shape, spot) and figures: most gangs read a view that did not change.
        """
        key = (shape, allow_spot)
        cached = self._by_shape.get(key)
        if cached is not None and cached[0] in (None, figures):
            return cached[1]
        cluster, gpu_type, usable = self.cluster, self.gpu_type, self.usable(allow_spot)
        valid_for: tuple[int, int] | None = figures
        need = sum(shape)
        text = self._described.get(shape)
        if text is None:
            text = self._described[shape] = describe(shape)
        if not any(offer.fits_when_empty(shape) for offer in usable):
            valid_for = None
            size = max(usable, key=lambda o: o.capacity.total_free).capacity
            message = (
                f"needs {text} of {gpu_type}; cluster {cluster} has only {size.total_free} GPUs "
                f"of {gpu_type} on {size.node_count} nodes, at most {size.max_free} on one node"
            )
            if len(usable) > 1:
                message += " (pools of different kind or price cannot be combined; largest shown)"
            code = Code.GANG_LARGER_THAN_CLUSTER
            free, per_node = size.total_free, size.max_free
        else:
            free, per_node = figures
            message = (
                f"needs {text} of {gpu_type}; cluster {cluster} has {free} free, "
                f"at most {per_node} on one node"
            )
            code = Code.INSUFFICIENT_CAPACITY
        reason = explain.capacity(code, message, cluster, gpu_type, free, per_node, need)
        self._by_shape[key] = (valid_for, reason)
        return reason


class Inventory:
    """Every offer of the snapshot, indexed for the questions the cycle asks."""

    def __init__(self, clusters: Iterable[ClusterState], policy: PolicyConfig) -> None:
        groups: dict[tuple[ClusterName, GpuType, CapacityKind, float, float], list[NodePool]] = {}
        reachable: dict[ClusterName, bool] = {}
        stores: dict[ClusterName, str | None] = {}
        scalable: list[tuple[ClusterName, ScalablePool]] = []
        # What a gang's placement rules and shape ask of a cluster (`eligible`).
        self.sites: dict[ClusterName, tuple[str, str, bool]] = {}
        for cluster in clusters:
            mixed = cluster.runs_mixed_gangs and self.sites.get(cluster.name, ("", "", True))[2]
            self.sites[cluster.name] = (cluster.region, cluster.provider.value, mixed)
            reachable[cluster.name] = reachable.get(cluster.name, True) and cluster.reachable
            stores[cluster.name] = min(
                (s for s in (stores.get(cluster.name), cluster.object_store) if s is not None), default=None
            )
            for pool in sorted(cluster.pools, key=lambda p: p.name):
                key = (
                    cluster.name,
                    pool.gpu_type,
                    pool.kind,
                    pool.usd_per_gpu_hour,
                    pool.restart_risk_per_hour,
                )
                groups.setdefault(key, []).append(pool)
            scalable.extend((cluster.name, pool) for pool in cluster.scalable_pools)
        views: dict[tuple[ClusterName, GpuType], View] = {}
        described: dict[tuple[int, ...], str] = {}
        self.offers: list[Offer] = []
        for (cluster_name, gpu_type, kind, price, risk), pools in sorted(groups.items(), key=lambda i: i[0]):
            view = views.get((cluster_name, gpu_type))
            if view is None:
                view = views[(cluster_name, gpu_type)] = View(
                    cluster_name, gpu_type, reachable[cluster_name], stores[cluster_name], described
                )
            offer = Offer(view, kind, price, risk, pools, policy)
            view.offers.append(offer)
            self.offers.append(offer)
        self.by_type: dict[GpuType, list[View]] = {}
        for (_, gpu_type), view in sorted(views.items()):
            view.index = len(self.by_type.setdefault(gpu_type, []))
            self.by_type[gpu_type].append(view)
        # Reachable capacity by type: what fair share divides and what lenders' reservations come out of.
        self.capacity_by_type: dict[GpuType, int] = {}
        self.free_by_type: dict[GpuType, int] = {}
        for offer in self.offers:
            if offer.view.reachable:
                gpu_type = offer.view.gpu_type
                self.capacity_by_type[gpu_type] = (
                    self.capacity_by_type.get(gpu_type, 0) + offer.capacity.total_free
                )
                self.free_by_type[gpu_type] = self.free_by_type.get(gpu_type, 0) + offer.free.total_free
        self.by_pool: dict[tuple[ClusterName, str], Offer] = {}
        for offer in self.offers:
            for pool_name in offer.pool_offsets:
                self.by_pool.setdefault((offer.view.cluster, pool_name), offer)
        self.scalable = sorted(
            ((cluster, pool) for cluster, pool in scalable if reachable.get(cluster, False)),
            key=lambda item: (item[0], item[1].name),
        )
        self.stores = stores
        self._search: dict[tuple[tuple[GpuType, ...], bool], list[Offer]] = {}
        self._by_work_price: dict[tuple[tuple[GpuType, ...], bool], list[Offer]] = {}
        # The cost model the offers' `work_rank`s were worked out for (`_rank_by_work_price`).
        self._ranked_for: CostModel | None = None
        self._eligible: dict[tuple[Pinning, bool], frozenset[ClusterName] | None] = {}
        # Each (region, cloud) some cluster is in, once, and each site as (name, its place's index,
        # whether it runs mixed gangs), in `sites`' order (`_allowed`).
        places: dict[tuple[str, str], int] = {}
        self._site_rows: list[tuple[ClusterName, int, bool]] = []
        for name, (region, cloud, mixed) in self.sites.items():
            place = places.setdefault((region, cloud), len(places))
            self._site_rows.append((name, place, mixed))
        self._places = list(places)
        # The same answers by the id of the rules' object, for gangs of one shape (uniform or not).
        self._eligible_by_object: dict[bool, dict[int, tuple[Pinning, frozenset[ClusterName] | None]]] = {
            True: {},
            False: {},
        }
        self._within: dict[tuple[int, tuple[GpuType, ...], bool, frozenset[ClusterName]], list[Offer]] = {}
        self._type_version = dict.fromkeys(self.by_type, 0)
        # The view each change of a type touched, in order: entry i took the type to version i + 1.
        self._changes: dict[GpuType, list[View]] = {gpu_type: [] for gpu_type in self.by_type}
        # Every change to any offer's free GPUs in the cycle (`plan._Cycle._state`).
        self.changes = 0

    def eligible(self, gang: GangRequest) -> frozenset[ClusterName] | None:
        """The clusters the gang's placement rules and shape allow; None when it may use every one
        (the common case, which then takes the unfiltered paths at no cost)."""
        if gang.anywhere:
            return None
        # Asked several times per gang and cycle. Looked up first by the rules' object: a `Pinning` in
        # a key is hashed and compared by its dataclass's methods, which run interpreted even in the
        # compiled placer. The object is kept with the answer, so its id is not reused while kept.
        pinning = gang.pinning
        by_object = self._eligible_by_object[gang.uniform]
        kept = by_object.get(id(pinning))
        if kept is not None and kept[0] is pinning:
            return kept[1]
        key = (pinning, gang.uniform)
        found = self._eligible.get(key, _UNASKED)
        if found is _UNASKED:
            found = self._eligible[key] = self._allowed(pinning, gang.uniform)
        by_object[id(pinning)] = (pinning, found)
        return found

    def _allowed(self, pinning: Pinning, uniform: bool) -> frozenset[ClusterName] | None:
        """`eligible`'s answer for the rules and shape, worked out: `Pinning.allows` of every site,
        with the rules' test of a region and cloud made once per (region, cloud) the sites are in (a
        dozen, where each of fifty clusters was asked in full) and the names tested against a set."""
        site_ok = [pinning.allows_site(region, cloud) for region, cloud in self._places]
        named = set(pinning.clusters) if pinning.clusters else None
        excluded = pinning.exclude_clusters
        allowed = frozenset(
            name
            for name, place, mixed in self._site_rows
            if (uniform or mixed)
            and site_ok[place]
            and (named is None or name in named)
            and name not in excluded
        )
        return None if len(allowed) == len(self.sites) else allowed

    def _within_clusters(
        self,
        kind: int,
        offers: list[Offer],
        types: tuple[GpuType, ...],
        spot: bool,
        clusters: frozenset[ClusterName],
    ) -> list[Offer]:
        key = (kind, types, spot, clusters)
        found = self._within.get(key)
        if found is None:
            found = self._within[key] = [o for o in offers if o.view.cluster in clusters]
        return found

    def take(self, offer: Offer, placed: HistogramFit, shape: tuple[int, ...]) -> None:
        offer.free.take(placed)
        offer._placed.append(shape)
        self._changed(offer, -sum(shape))

    def set_nodes(self, offer: Offer, nodes: list[int]) -> None:
        """Replace an offer's free nodes (after holding capacity for a preemptor)."""
        before = offer.free.total_free
        offer._base_nodes, offer._placed = list(nodes), []
        offer.free = FreeHistogram(nodes)
        self._changed(offer, offer.free.total_free - before)

    def _changed(self, offer: Offer, delta_free: int) -> None:
        self.changes += 1
        offer.version += 1
        offer.view.version += 1
        gpu_type = offer.view.gpu_type
        self._type_version[gpu_type] += 1
        self._changes[gpu_type].append(offer.view)
        if offer.view.reachable:
            self.free_by_type[gpu_type] += delta_free

    def type_version(self, gpu_type: GpuType) -> int:
        """How many changes the offers of this type have had in the cycle."""
        return self._type_version.get(gpu_type, 0)

    def changed_views(self, gpu_type: GpuType, since_version: int) -> list[View]:
        """The views of this type changed since the type had `since_version` (with repeats)."""
        return self._changes[gpu_type][since_version:]

    def search_order(
        self, gpu_types: Iterable[GpuType], allow_spot: bool, clusters: frozenset[ClusterName] | None = None
    ) -> list[Offer]:
        """Reachable offers of these types that the gang may use, in a fixed order (cached); only
        those on `clusters` when given (`eligible`)."""
        if clusters is not None:
            types = tuple(gpu_types)
            return self._within_clusters(0, self.search_order(types, allow_spot), types, allow_spot, clusters)
        # A gang's own tuple of types is the usual question: look it up as given before normalising it.
        if isinstance(gpu_types, tuple):
            found = self._search.get((gpu_types, allow_spot))
            if found is not None:
                return found
        given = gpu_types = tuple(gpu_types)
        types = tuple(sorted(set(gpu_types)))
        found = self._search.get((types, allow_spot))
        if found is None:
            found = [
                offer
                for gpu_type in types
                for view in self.by_type.get(gpu_type, ())
                if view.reachable
                for offer in view.usable(allow_spot)
            ]
            self._search[(types, allow_spot)] = found
        self._search[(given, allow_spot)] = found
        return found

    def _rank_by_work_price(self, costs: CostModel) -> None:
        """Rank every offer once in the order `by_work_price` gives (each offer's key is fixed for the
        cycle), so that each list of types is sorted on the ranks. The keys are unique (`search_key`
        is), so a list sorted on the ranks is the list sorted on the keys. A cycle asks for hundreds of
        lists of types, and each sorted its offers on a key worked out per offer and list."""
        if self._ranked_for is costs:
            return
        ordered = sorted(
            self.offers,
            key=lambda o: (
                private_tier(o, costs.policy),
                o.price_factor / costs.snapshot_speed(o.view.gpu_type),
                o.price_factor,
                o.kind_rank,
                o.search_key,
            ),
        )
        for rank, offer in enumerate(ordered):
            offer.work_rank = rank
        self._ranked_for = costs

    def by_work_price(
        self,
        gpu_types: Iterable[GpuType],
        allow_spot: bool,
        costs: CostModel,
        clusters: frozenset[ClusterName] | None = None,
    ) -> list[Offer]:
        """`search_order`'s offers by price per unit of work (price / speed), then price, kind and key;
        private offers first with `prefer_private`."""
        if clusters is not None:
            types = tuple(gpu_types)
            ordered = self.by_work_price(types, allow_spot, costs)
            return self._within_clusters(1, ordered, types, allow_spot, clusters)
        if isinstance(gpu_types, tuple):
            found = self._by_work_price.get((gpu_types, allow_spot))
            if found is not None:
                return found
        given = gpu_types = tuple(gpu_types)
        types = tuple(sorted(set(gpu_types)))
        found = self._by_work_price.get((types, allow_spot))
        if found is None:
            self._rank_by_work_price(costs)
            found = sorted(self.search_order(types, allow_spot), key=_WORK_RANK)
            self._by_work_price[(types, allow_spot)] = found
        self._by_work_price[(given, allow_spot)] = found
        return found
