"""Capacity requests: when a gang fits nowhere now, ask a scalable pool for enough nodes for all of it.

A request is for whole new nodes of one pool in one cluster, enough for every replica of the gang
(first-fit decreasing onto empty nodes), so the provisioner grows a pool atomically for one gang or
not at all. Among pools that may grow that far (their maximum, less nodes they have and nodes earlier
cycles asked for, less what this cycle has asked for already), the cheapest expected cost wins.
Placement sees the new nodes only as inventory in a later snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import compress, pairwise
from typing import Final

from placement.model import CapacityKind, ClusterName, GpuType, ScalablePool


def nodes_needed(shape: tuple[int, ...], gpus_per_node: int) -> int | None:
    """Empty nodes of `gpus_per_node` GPUs that hold every replica of `shape` (None: a replica is too big)."""
    if not shape:
        return 0
    if gpus_per_node <= 0 or shape[0] > gpus_per_node:
        return None
    nodes: list[int] = []
    for gpus in shape:
        for i, free in enumerate(nodes):
            if free >= gpus:
                nodes[i] -= gpus
                break
        else:
            nodes.append(gpus_per_node - gpus)
    return len(nodes)


# A cluster nothing was asked of yet (`Growth._asked`): read, never written.
_NONE: Final[dict[str, int]] = {}


class Growth:
    """The cycle's scalable pools and what it has asked of them so far."""

    def __init__(
        self,
        pools: Sequence[tuple[ClusterName, ScalablePool]],
        static_key: Callable[[ScalablePool], float] | None = None,
    ) -> None:
        """`static_key`: a pool's price per unit of work, which orders pools as the cost does for a
        gang whose cost orders them so (`choose`'s `static`)."""
        self._by_type: dict[GpuType, list[tuple[ClusterName, ScalablePool]]] = {}
        for cluster, pool in pools:
            self._by_type.setdefault(pool.gpu_type, []).append((cluster, pool))
        self._pools = list(pools)
        self._static_key = static_key
        # Every pool by (static key, cluster, name), ranked once when first asked (`_in_order`).
        self._ranked: list[tuple[ClusterName, ScalablePool]] | None = None
        self._ranked_exact = False
        # Nodes asked for so far, per cluster, then pool name: read for every pool a search passes, where
        # a (cluster, name) key was a pair made and hashed per pool (two strings' kept hashes instead).
        self._asked: dict[ClusterName, dict[str, int]] = {}
        # Pools with no room left are dropped from the lists searched: room only shrinks in a cycle, and
        # a pool without room holds no gang. Late in a busy cycle most pools are full. `_filled` counts
        # pools that filled up; a list is pruned again only when it grew since the list's last pruning.
        self._filled = 0
        self._pruned_at: dict[int, int] = {}
        # Pools only shrink during a cycle: a (shape, types, spot) that no pool can hold stays so.
        # Kept per types, then spot (a slot), as sets of shapes: no (shape, types, spot) key made and
        # hashed per gang that asks (most gangs of a busy cycle, `Room._cheapest_pool`).
        self._hopeless: dict[tuple[GpuType, ...], list[set[tuple[int, ...]]]] = {}
        self._orders: dict[tuple[tuple[GpuType, ...], bool], list[tuple[ClusterName, ScalablePool]]] = {}
        self._needed: dict[tuple[int, ...], dict[int, int | None]] = {}

    def hopeless(self, shape: tuple[int, ...], gpu_types: tuple[GpuType, ...], allow_spot: bool) -> bool:
        """Whether no pool of these types could grow enough for the shape (`choose` found none)."""
        return shape in self._hopeless_shapes(gpu_types, allow_spot)

    def _hopeless_shapes(self, gpu_types: tuple[GpuType, ...], allow_spot: bool) -> set[tuple[int, ...]]:
        """The shapes no pool of these types (spot ones only if allowed) can grow enough for, so far."""
        by_spot = self._hopeless.get(gpu_types)
        if by_spot is None:
            by_spot = self._hopeless[gpu_types] = [set(), set()]
        return by_spot[allow_spot]

    def choose(
        self,
        shape: tuple[int, ...],
        gpu_types: tuple[GpuType, ...],
        allow_spot: bool,
        cost: Callable[[ClusterName, ScalablePool], float | None],
        static: bool = False,
    ) -> tuple[ClusterName, ScalablePool, int] | None:
        """The cheapest pool of these types that can grow by enough nodes for the gang.

        `cost` gives a pool's expected cost for the gang, or None when it is unusable (deadline missed).
        `static`, when the gang's cost orders pools as the growth's static key does (price per unit of
        work), lets the search take the first pool in that order that has room.
        """
        hopeless = self._hopeless_shapes(gpu_types, allow_spot)
        if shape in hopeless:
            return None
        if static and self._static_key is not None:
            return self._first_in_order(shape, gpu_types, allow_spot, self._static_key, cost)
        best: tuple[ClusterName, ScalablePool, int] | None = None
        best_key: tuple[float, str, str] | None = None
        roomy = False
        by_size = self._needed_by_size(shape)
        for gpu_type in gpu_types:
            pools = self._by_type.get(gpu_type)
            for cluster, pool in self._pruned(pools) if pools else ():
                if pool.kind is CapacityKind.SPOT and not allow_spot:
                    continue
                nodes = _nodes_on(by_size, shape, pool.gpus_per_node)
                if nodes is None or nodes == 0:
                    continue
                if pool.addable_nodes - self._asked.get(cluster, _NONE).get(pool.name, 0) < nodes:
                    continue
                roomy = True
                expected = cost(cluster, pool)
                if expected is None:
                    continue
                rank = (expected, cluster, pool.name)
                if best_key is None or rank < best_key:
                    best, best_key = (cluster, pool, nodes), rank
        if not roomy:
            hopeless.add(shape)
        return best

    def _first_in_order(
        self,
        shape: tuple[int, ...],
        gpu_types: tuple[GpuType, ...],
        allow_spot: bool,
        static_key: Callable[[ScalablePool], float],
        cost: Callable[[ClusterName, ScalablePool], float | None],
    ) -> tuple[ClusterName, ScalablePool, int] | None:
        order = self._orders.get((gpu_types, allow_spot))
        if order is None:
            order = self._orders[(gpu_types, allow_spot)] = self._in_order(gpu_types, allow_spot, static_key)
        roomy = False
        by_size = self._needed_by_size(shape)
        for cluster, pool in self._pruned(order):
            nodes = _nodes_on(by_size, shape, pool.gpus_per_node)
            if not nodes or pool.addable_nodes - self._asked.get(cluster, _NONE).get(pool.name, 0) < nodes:
                continue
            roomy = True
            if cost(cluster, pool) is not None:
                return cluster, pool, nodes
        if not roomy:
            self._hopeless_shapes(gpu_types, allow_spot).add(shape)
        return None

    def _in_order(
        self, gpu_types: tuple[GpuType, ...], allow_spot: bool, static_key: Callable[[ScalablePool], float]
    ) -> list[tuple[ClusterName, ScalablePool]]:
        """The pools of these types (spot ones only if allowed) by (static key, cluster, name).

        Taken from every pool ranked once, where each list of types sorted its pools, working out each
        pool's key per list (a steady cycle makes hundreds of lists). Where two pools' keys tie (a
        pool named twice in a cluster) or a key is not a number, or the types repeat, each list is
        sorted as before, whose order then depends on the list's own order of types."""
        ranked = self._ranked
        if ranked is None:
            items = self._pools
            keys = [(static_key(p), c, p.name) for c, p in items]
            order = sorted(range(len(items)), key=keys.__getitem__)
            in_order = [keys[i] for i in order]
            exact = all(a < b for a, b in pairwise(in_order)) and all(k[0] == k[0] for k in keys)
            ranked = self._ranked = [items[i] for i in order] if exact else []
            self._ranked_exact = exact
        wanted = set(gpu_types)
        if self._ranked_exact and len(wanted) == len(gpu_types):
            spot = CapacityKind.SPOT
            # The ranked pairs themselves, picked by `compress`, not new ones (compiled, a pair read
            # into a typed local is taken apart and made anew when stored): the growth keeps each list.
            picked = [p.gpu_type in wanted and (allow_spot or p.kind is not spot) for _, p in ranked]
            return list(compress(ranked, picked))
        return sorted(
            (
                (cluster, pool)
                for gpu_type in gpu_types
                for cluster, pool in self._by_type.get(gpu_type, ())
                if allow_spot or pool.kind is not CapacityKind.SPOT
            ),
            key=lambda item: (static_key(item[1]), item[0], item[1].name),
        )

    def _needed_by_size(self, shape: tuple[int, ...]) -> dict[int, int | None]:
        """The shape's `nodes_needed` per node size, kept for the cycle: looked up once per search
        (a search asks for one shape across every pool; looking the shape up per pool hashed it per
        pool, and a (shape, size) key was a tuple made and hashed per pool)."""
        by_size = self._needed.get(shape)
        if by_size is None:
            by_size = self._needed[shape] = {}
        return by_size

    def _room(self, cluster: ClusterName, pool: ScalablePool) -> int:
        return pool.addable_nodes - self._asked.get(cluster, _NONE).get(pool.name, 0)

    def _pruned(
        self, pools: list[tuple[ClusterName, ScalablePool]]
    ) -> list[tuple[ClusterName, ScalablePool]]:
        """The list without the pools that have no room left (pruned in place, order kept)."""
        if self._pruned_at.get(id(pools), 0) != self._filled:
            self._pruned_at[id(pools)] = self._filled
            pools[:] = list(compress(pools, [self._room(c, p) > 0 for c, p in pools]))
        return pools

    def ask(self, cluster: ClusterName, pool: ScalablePool, nodes: int) -> None:
        asked = self._asked.get(cluster)
        if asked is None:
            asked = self._asked[cluster] = {}
        asked[pool.name] = asked.get(pool.name, 0) + nodes
        if self._room(cluster, pool) <= 0:
            self._filled += 1


def _nodes_on(by_size: dict[int, int | None], shape: tuple[int, ...], gpus_per_node: int) -> int | None:
    """`nodes_needed(shape, gpus_per_node)`, kept in the shape's `by_size`."""
    found = by_size.get(gpus_per_node, -1)
    if found == -1:
        found = by_size[gpus_per_node] = nodes_needed(shape, gpus_per_node)
    return found
