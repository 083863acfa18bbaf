"""Fitting one gang's replicas into nodes' free GPUs, each replica on one node.

Placement asks "does this gang fit here, and how well?" for many (gang, pool) pairs per cycle, so the
question has its own module with two faces of the same rule:

- `fit_replicas` works on a list of nodes and says which node gives how many GPUs. It is the readable
  reference and what a later dispatch step (or a test) can replay.
- `FreeHistogram` keeps only how many nodes have each free-GPU count. Nodes with equal free counts are
  interchangeable for fitting, and free counts are small integers (0..gpus_per_node), so a best-fit
  step costs O(gpus_per_node) instead of O(nodes). The placer keeps one per pool group as its working
  state.

The rule is best-fit decreasing: replicas largest first, each on the node with the smallest free count
that still holds it. That fills nodes that are already partly used and leaves whole nodes free for
large replicas. Among nodes with the same free count, a node this gang already uses comes first (fewer
nodes touched), then the lowest index. Both faces follow the same rule, so they always agree on
whether a gang fits. Like any bin-packing heuristic it can miss a fit that an exhaustive search would
find; the placer then reports the gang as waiting, never as placed where it does not fit.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from placement.model import NodePool


def gang_shape(replica_gpus: Iterable[int]) -> tuple[int, ...]:
    """The replicas that need GPUs, largest first: the order in which best-fit places them.

    Replicas that need no GPU take nothing and fit anywhere, so they are left out.
    """
    replicas = tuple(replica_gpus)
    if any(gpus < 0 for gpus in replicas):
        raise ValueError(f"a replica cannot need a negative number of GPUs: {replicas}")
    return tuple(sorted((gpus for gpus in replicas if gpus > 0), reverse=True))


def combine_node_lists(pools: Iterable[NodePool]) -> tuple[int, ...]:
    """The free GPUs of every node of several pools, as one node list (pools in the order given).

    The placer lets one gang span pools that are interchangeable for it (same cluster, GPU type,
    capacity kind and price); this is the node list such a group offers.
    """
    return tuple(free for pool in pools for free in pool.free_gpus_per_node)


def fit_replicas(replica_gpus: Sequence[int], free_gpus_per_node: Sequence[int]) -> tuple[int, ...] | None:
    """GPUs taken on each node (same length as `free_gpus_per_node`), or None when the gang does not fit.

    Every replica must fit on one node; a replica with 0 GPUs takes nothing and always fits.
    """
    shape = gang_shape(replica_gpus)
    free = tuple(free_gpus_per_node)
    if any(gpus < 0 for gpus in free):
        raise ValueError(f"a node cannot have a negative number of free GPUs: {free}")
    taken = [0] * len(free)
    if not shape:
        return tuple(taken)
    top = max(free, default=0)
    if shape[0] > top or sum(shape) > sum(free):
        return None
    # buckets[v] holds the nodes with v free GPUs as a heap of (untouched, index): nodes this gang
    # already uses sort first, then by index. Filled in index order, so each list is already a heap.
    buckets: list[list[tuple[int, int]]] = [[] for _ in range(top + 1)]
    for index, gpus in enumerate(free):
        buckets[gpus].append((1, index))
    for gpus in shape:
        for value in range(gpus, top + 1):
            if buckets[value]:
                break
        else:
            return None
        _, index = heapq.heappop(buckets[value])
        taken[index] += gpus
        heapq.heappush(buckets[value - gpus], (0, index))
    return tuple(taken)


def fits(shape: tuple[int, ...], free_gpus_per_node: list[int]) -> bool:
    """Whether `fit_replicas(shape, free_gpus_per_node)` finds a fit, for a `shape` from `gang_shape`
    (positive, largest first), without working out where: the same best-fit steps on a count of nodes
    by free GPUs, as `FreeHistogram` takes them. Which node of a free count a replica takes never
    changes which counts are left, so the two agree. The victim search asks this of many node lists
    and needs the nodes only of the one it keeps, where each `fit_replicas` built a heap entry per
    node (30,000 instructions a call on the benchmark's offers). Typed as a tuple and a list, and
    summed in loops, so that the compiled form reads them natively."""
    if not shape:
        return True
    top = total = 0
    for gpus in free_gpus_per_node:
        if gpus < 0:
            free = tuple(free_gpus_per_node)
            raise ValueError(f"a node cannot have a negative number of free GPUs: {free}")
        if gpus > top:
            top = gpus
        total += gpus
    need = 0
    for gpus in shape:
        need += gpus
    if shape[0] > top or need > total:
        return False
    counts = [0] * (top + 1)
    for gpus in free_gpus_per_node:
        counts[gpus] += 1
    for gpus in shape:
        value = gpus
        while value <= top and not counts[value]:
            value += 1
        if value > top:
            return False
        counts[value] -= 1
        counts[value - gpus] += 1
    return True


# Its own `__init__`, compiled to struct writes: made per gang (see `placement.model_plan`'s text).
@dataclass(frozen=True, slots=True, init=False)
class HistogramFit:
    """Where a gang would go in a `FreeHistogram`, and how tightly it packs there."""

    # (free GPUs of the node before, GPUs taken) per replica, in placement order.
    moves: tuple[tuple[int, int], ...]
    nodes_touched: int
    # GPUs left free on the nodes the gang uses: capacity the gang fragments.
    stranded_gpus: int

    def __init__(
        self,
        moves: tuple[tuple[int, int], ...],
        nodes_touched: int,
        stranded_gpus: int,
    ) -> None:
        object.__setattr__(self, "moves", moves)
        object.__setattr__(self, "nodes_touched", nodes_touched)
        object.__setattr__(self, "stranded_gpus", stranded_gpus)

    @property
    def packing_key(self) -> tuple[int, int]:
        """Lower packs better: strand the fewest GPUs, then touch the fewest nodes."""
        return (self.stranded_gpus, self.nodes_touched)


class FreeHistogram:
    """Mutable count of nodes by free GPUs, for fitting many gangs into one group of nodes quickly.

    Working state of one placement call; it never leaves the placer.
    """

    __slots__ = ("_counts", "max_free", "node_count", "total_free")

    def __init__(self, free_gpus_per_node: Iterable[int]) -> None:
        free = tuple(free_gpus_per_node)
        # Counted by distinct value, in C: a replay's elastic cloud pools are hundreds of nodes with one
        # or two free counts, built every cycle. The lowest, highest and total in loops the compiled
        # form runs natively: `min` and `max` with a default, and `sum`, were generic calls (every
        # offer's histogram is built each cycle).
        values = set(free)
        low = top = 0
        for gpus in values:
            if gpus < low:
                low = gpus
            if gpus > top:
                top = gpus
        if low < 0:
            raise ValueError(f"a node cannot have a negative number of free GPUs: {free}")
        self._counts = [0] * (top + 1)
        for gpus in values:
            self._counts[gpus] = free.count(gpus)
        total = 0
        for gpus in free:
            total += gpus
        self.node_count = len(free)
        self.total_free = total
        self.max_free = top

    @property
    def counts(self) -> tuple[int, ...]:
        """Node counts indexed by free-GPU value."""
        return tuple(self._counts)

    def fit(self, shape: Sequence[int]) -> HistogramFit | None:
        """Best-fit the replicas of `shape` (from `gang_shape`: positive, largest first), or None."""
        if not shape:
            return HistogramFit((), 0, 0)
        # Cheap checks first: most candidates in a busy cycle fail one of these.
        top = self.max_free
        if shape[0] > top or sum(shape) > self.total_free:
            return None
        untouched = self._counts.copy()
        touched = [0] * len(untouched)
        moves = []
        nodes = stranded = 0
        for gpus in shape:
            for value in range(gpus, top + 1):
                if touched[value]:
                    touched[value] -= 1
                    stranded -= gpus
                    break
                if untouched[value]:
                    untouched[value] -= 1
                    nodes += 1
                    stranded += value - gpus
                    break
            else:
                return None
            touched[value - gpus] += 1
            moves.append((value, gpus))
        return HistogramFit(tuple(moves), nodes, stranded)

    def take(self, placed: HistogramFit) -> None:
        """Commit a fit computed by `fit` on this histogram's current state."""
        counts = self._counts.copy()
        for value, gpus in placed.moves:
            if value >= len(counts) or not counts[value]:
                raise ValueError("the fit was computed on another histogram or state")
            counts[value] -= 1
            counts[value - gpus] += 1
        self._counts = counts
        self.total_free -= sum(gpus for _, gpus in placed.moves)
        top = self.max_free
        while top > 0 and not counts[top]:
            top -= 1
        self.max_free = top
