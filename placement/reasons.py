"""Wait reasons recorded as figures during the cycle and worded when read.

A busy cycle leaves thousands of gangs waiting on capacity, each with a reason for every cluster of
every GPU type it accepts, and every admission changes the free figures of one cluster. Wording those
reasons as they arise (a message and a `WaitReason` per cluster, per gang shape, after each change)
took a quarter of the cycle. Instead the cycle keeps, per GPU type, one tuple of every cluster's free
figures per change, shared by every gang that waits until the next change, and a gang's wait records
which tuple it saw (`Table`) plus its own quota reasons and notes (`GangExplanation`). The reasons are
worded on first read, and a table's wording is shared by every gang that recorded it.

Each record has a `key`: equal keys mean equal reasons, also across cycles (it holds what the wording
reads: the clusters' capacity, reachability and free figures, the shape), so the scheduler writes the
reasons of a job only when its key changed and the worded reasons did too.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Final

from placement import explain
from placement.explain import CODE_RANK, ranked
from placement.inventory import Inventory, View
from placement.model import ClusterName, GpuType, WaitReason
from placement.model import WaitCode as Code

# Free GPUs and largest free block of a cluster's usable offers (None: none usable).
Figures = tuple[int, int] | None
_CAPACITY_CODES: Final = frozenset({Code.INSUFFICIENT_CAPACITY, Code.GANG_LARGER_THAN_CLUSTER})
# The latest rank a cluster's reason (blocker or capacity) can have.
_LAST_TABLE_RANK: Final = max(
    CODE_RANK[c] for c in (*_CAPACITY_CODES, Code.CLUSTER_UNREACHABLE, Code.SPOT_NOT_ALLOWED)
)


class Table:
    """Why each cluster of one GPU type cannot take a gang of one shape, as of one set of figures."""

    __slots__ = (
        "_built",
        "_key",
        "_per_view",
        "_positions",
        "allow_spot",
        "capped",
        "figures",
        "gpu_type",
        "previous",
        "shape",
        "static",
        "version",
        "views",
    )

    def __init__(
        self,
        views: Sequence[View],
        gpu_type: GpuType,
        shape: tuple[int, ...],
        allow_spot: bool,
        capped: bool,
        figures: tuple[Figures, ...],
        static: Hashable,
        previous: Table | None,
    ) -> None:
        self.views = views
        self.gpu_type = gpu_type
        self.shape = shape
        self.allow_spot = allow_spot
        # With the type ruled out by quota only blockers are listed (they never change in a cycle).
        self.capped = capped
        self.figures = figures
        self.static = static
        # The table of the same (type, shape, spot) before the last changes: once worded, this one is
        # worded from it by replacing the reasons of the views whose figures changed.
        self.previous = previous
        self._built: tuple[WaitReason, ...] | None = None
        self._key: Hashable | None = None
        self._per_view: list[WaitReason | None] = []
        self._positions: list[int] = []
        # The type's version (`Inventory.type_version`) the figures were last found current at (-1:
        # never, or the table lists blockers only): `Tables.table`'s.
        self.version = -1

    @property
    def key(self) -> Hashable:
        # Made once: every gang of a deep queue that waits on this table reads it, each cycle.
        if self._key is None:
            self._key = (self.gpu_type, self.shape, self.allow_spot, self.capped, self.static, self.figures)
        return self._key

    def build(self) -> tuple[WaitReason, ...]:
        if self._built is not None:
            return self._built
        base = self.previous
        while base is not None and base._built is None:
            base = base.previous
        self.previous = None
        if base is None or not self._patch(base):
            self._per_view = [
                self._reason(view, figures) for view, figures in zip(self.views, self.figures, strict=True)
            ]
            built = ranked(r for r in self._per_view if r is not None)
            at = {id(r): i for i, r in enumerate(built)}
            self._positions = [-1 if r is None else at[id(r)] for r in self._per_view]
            self._built = built
        assert self._built is not None
        return self._built

    def _reason(self, view: View, figures: Figures) -> WaitReason | None:
        reason = view.blocker(self.allow_spot)
        if reason is None and not self.capped and figures is not None:
            reason = view.capacity_reason(self.shape, self.allow_spot, figures)
        return reason

    def _patch(self, base: Table) -> bool:
        """Word this table from `base`'s, replacing the reasons of views whose figures changed.

        A view's code for a shape does not change in a cycle (blockers and what an empty view could
        hold are fixed; only the free figures move), so each reason keeps its rank and position and
        the table needs no new sort. False (word it from scratch) if a code did change after all.
        """
        assert base._built is not None
        per_view, rows = list(base._per_view), list(base._built)
        for i, figures in enumerate(self.figures):
            if figures is base.figures[i]:
                continue
            old, reason = per_view[i], self._reason(self.views[i], figures)
            if reason is old:
                continue
            if old is None or reason is None or reason.code is not old.code:  # pragma: no cover
                return False
            per_view[i] = reason
            rows[base._positions[i]] = reason
        self._per_view, self._positions, self._built = per_view, base._positions, tuple(rows)
        return True


# Quota reasons of a gang with none, per number of types: shared (`GangExplanation.quotas`).
_NO_QUOTAS: Final[tuple[tuple[None, ...], ...]] = tuple((None,) * n for n in range(9))


def no_quotas(count: int) -> tuple[None, ...]:
    """A tuple of `count` Nones, shared for the counts of most lists of types."""
    return _NO_QUOTAS[count] if count < len(_NO_QUOTAS) else (None,) * count


class GangExplanation:
    """Every reason that keeps one gang from every placement it accepts, most fundamental first.

    Where quota already rules a type out, that type's cluster capacity is not reported: the quota is
    what must change first. A gang that fits somewhere but waits by choice, for a deadline or for a
    reservation gets no capacity reason for the clusters where it fits (`fits_now`).
    """

    __slots__ = ("_key", "fits_now", "head", "notes", "quotas", "ruled_out", "shape", "single", "tables")

    def __init__(
        self,
        head: tuple[WaitReason, ...],
        quotas: tuple[WaitReason | None, ...],
        tables: tuple[Table, ...],
        fits_now: frozenset[tuple[ClusterName, GpuType]],
        notes: tuple[WaitReason, ...],
        shape: tuple[int, ...],
        single: bool,
        ruled_out: frozenset[ClusterName] = frozenset(),
    ) -> None:
        self.head = head
        # Clusters the gang's placement rules or shape rule out: their capacity is not its reason.
        self.ruled_out = ruled_out
        # Per type accepted, its quota reason (None: none) and its table, as two tuples of one length:
        # a tuple of pairs was one more object per type kept with every wait (the plan holds them
        # all, and the collector walks each), and the quota reasons of a gang that has none are one
        # shared tuple of Nones (`no_quotas`).
        self.quotas = quotas
        self.tables = tables
        self.fits_now = fits_now
        self.notes = notes
        self.shape = shape
        # One type, no quota reason and no missing type: the table is the whole ranked list but notes.
        self.single = single
        self._key: Hashable | None = None

    @property
    def parts(self) -> tuple[tuple[WaitReason | None, Table], ...]:
        """Per type accepted, its quota reason (None: none) and its table."""
        return tuple(zip(self.quotas, self.tables, strict=True))

    @property
    def key(self) -> Hashable:
        # Made once: equal gangs decided on the same state share this explanation (`plan._Cycle`).
        if self._key is None:
            parts = tuple((quota, table.key) for quota, table in zip(self.quotas, self.tables, strict=True))
            self._key = (
                self.head,
                parts,
                tuple(sorted(self.fits_now)),
                self.notes,
                self.shape,
                self.single,
                tuple(sorted(self.ruled_out)),
            )
        return self._key

    def build(self) -> tuple[WaitReason, ...]:
        reasons = list(self.head)
        table: tuple[WaitReason, ...] = ()
        fits_now = self.fits_now
        for quota, recipe in zip(self.quotas, self.tables, strict=True):
            if quota is not None:
                reasons.append(quota)
            table = recipe.build()
            if fits_now:
                table = tuple(
                    r
                    for r in table
                    if not (r.code in _CAPACITY_CODES and (r.cluster, r.gpu_type) in fits_now)
                )
            if self.ruled_out:
                table = tuple(r for r in table if r.cluster not in self.ruled_out)
            reasons.extend(table)
        notes = self.notes
        if self.single:
            # Notes (deadline, reservation, waiting, room made) all rank after any cluster's reason.
            if not notes:
                return table
            if all(CODE_RANK[n.code] > _LAST_TABLE_RANK for n in notes):
                return table + ranked(notes)
        reasons.extend(notes)
        if not reasons:  # pragma: no cover - every path names a blocker; kept so no job waits silently
            message = f"no placement for {explain.describe(self.shape)}"
            reasons.append(WaitReason(Code.INSUFFICIENT_CAPACITY, message))
        return ranked(reasons)


class Tables:
    """The cycle's figures per GPU type, and the reason tables recorded from them."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        # (type, spot) -> (type version, figures per view in `by_type` order)
        self._figures: dict[tuple[GpuType, bool], tuple[int, tuple[Figures, ...]]] = {}
        self._static: dict[tuple[GpuType, bool], Hashable] = {}
        # Per type, then shape, the tables by (spot, capped) as a slot 2 * spot + capped: looked up once
        # or more per waiting gang, where a (type, shape, spot, capped) key was made and hashed per ask.
        self._tables: dict[GpuType, dict[tuple[int, ...], list[Table | None]]] = {}

    def table(self, gpu_type: GpuType, shape: tuple[int, ...], allow_spot: bool, capped: bool) -> Table:
        """The table as of now: one per (type, shape, spot) between two changes of the type."""
        if capped:
            # Only blockers are listed, whatever the shape and the free figures: one table per cycle,
            # and a key that stays equal from cycle to cycle while nothing else changes.
            shape = ()
        by_shape = self._tables.get(gpu_type)
        if by_shape is None:
            by_shape = self._tables[gpu_type] = {}
        slots = by_shape.get(shape)
        if slots is None:
            slots = by_shape[shape] = [None, None, None, None]
        slot = 2 * allow_spot + capped
        table = slots[slot]
        version = -1
        if capped:
            if table is not None:
                return table
            figures: tuple[Figures, ...] = (None,) * len(self.inventory.by_type.get(gpu_type, ()))
        else:
            # A table whose figures were taken at the type's version now is the table as of now: no
            # look at the figures (most asks between two changes of the type).
            version = self.inventory.type_version(gpu_type)
            if table is not None and table.version == version:
                return table
            figures = self._figures_now(gpu_type, allow_spot)
            if table is not None and table.figures is figures:
                table.version = version
                return table
        # No table for the key, or one whose figures are no longer current: a new one, after it.
        views = self.inventory.by_type.get(gpu_type, [])
        static = self._static.get((gpu_type, allow_spot))
        if static is None:
            static = self._static[(gpu_type, allow_spot)] = tuple(
                (v.cluster, v.reachable, tuple(o.capacity.counts for o in v.usable(allow_spot)))
                for v in views
            )
        table = Table(views, gpu_type, shape, allow_spot, capped, figures, static, table)
        slots[slot] = table
        table.version = version
        return table

    def _figures_now(self, gpu_type: GpuType, allow_spot: bool) -> tuple[Figures, ...]:
        version = self.inventory.type_version(gpu_type)
        cached = self._figures.get((gpu_type, allow_spot))
        if cached is not None and cached[0] == version:
            return cached[1]
        views = self.inventory.by_type.get(gpu_type, [])
        if cached is None:
            figures = tuple(_figures(view, allow_spot) for view in views)
        else:
            # After a change only the views that changed are asked again.
            rows = list(cached[1])
            for view in set(self.inventory.changed_views(gpu_type, cached[0])):
                rows[view.index] = _figures(view, allow_spot)
            figures = tuple(rows)
        self._figures[(gpu_type, allow_spot)] = (version, figures)
        return figures


def _figures(view: View, allow_spot: bool) -> Figures:
    usable = view.usable(allow_spot)
    if not usable:
        return None
    return (sum(o.free.total_free for o in usable), max(o.free.max_free for o in usable))
