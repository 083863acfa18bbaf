"""The placement policy: one scheduling cycle, from a `Snapshot` to a `Plan`, in numbered steps.

1. Working state: offers and their free GPUs (`inventory`), tenant usage against the tree of quotas
   (`quota`), dominant shares (`fairshare`), the cost model (`cost`), running gangs by offer (`preempt`).
2. Order (`fairshare.FairOrder`): tenants take turns by their next gang: gangs their tenant can run
   within its guarantee before gangs that would borrow (guarantees are reclaimed whatever the
   borrower's priority, so a borrower first would retake the GPUs after each eviction); then priority
   (highest first); then the tenant with the lowest weighted dominant share; then queue time. Each
   tenant's own jobs go by priority, then queue time.
3. Gates, for each gang in that order: known tenant, priority within the tenant's and the user's
   maximum, approval of a class that needs one still valid at `now`, no spent GPU-hour budget on the
   tenant or an ancestor. A gang that fails a gate waits, whatever capacity there is.
4. Quota: each GPU type the gang accepts must pass caps and borrowing limits up the tree and leave
   what lenders hold back (`quota`). Types that fail are not considered.
5. Place now: among offers of the accepted types (ordered types: one type at a time, in order), the
   cheapest expected cost that fits (`cost`), then private before on demand before spot, then the
   tightest packing, then cluster name and GPU type. Offers that miss the deadline, or would delay a
   backfill reservation, are skipped. If the best is cloud capacity while a private offer could hold
   the gang, the gang may wait for private GPUs instead (Starburst rule in `cost`).
6. Make room, for a gang that fits nowhere for lack of capacity: evict the smallest set of lower
   priority or borrowing gangs (`preempt`, within the per-interval limit) and hold the capacity for
   the gang; else ask a scalable pool for nodes (`capacity`); else, for the first such gang, reserve
   the earliest start that running gangs' ends allow (`backfill`).
7. Explain: a gang left waiting gets every reason, most fundamental first (`explain`).
8. Repatriate (off by default): after every queued gang, move running cloud gangs that can resume
   from a checkpoint onto private GPUs still idle, if that saves more than the move costs
   (`repatriate`).

A gang that fails does not hold up later ones beyond its reservation (greedy with backfill). Every
input is read through a sort on total keys or folded into order-free counts, so equal snapshots give
equal plans whatever the order of their tuples.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import attrgetter, gt, not_, or_
from typing import Final

from placement.backfill import Hold
from placement.chunks import Chunks
from placement.cost import CostModel, GangCost, restart_slowdown
from placement.fairshare import Entry, FairOrder, FairShare
from placement.fit import HistogramFit, gang_shape
from placement.inventory import Inventory, Offer, private_tier
from placement.model import (
    Admission,
    Alternative,
    CapacityKind,
    Choice,
    ClusterName,
    GangRequest,
    GpuType,
    GpuTypePolicy,
    Plan,
    PolicyConfig,
    RunningGang,
    Snapshot,
    TenantId,
    Waiting,
    WaitReason,
)
from placement.model import WaitCode as Code
from placement.model_plan import explained_wait, reasoned_wait, wait_for_job
from placement.quota import QuotaBook
from placement.reasons import GangExplanation, Table, Tables, no_quotas
from placement.repatriate import choose_moves
from placement.room import Room
from placement.set_affinity import SetStores
from placement.stretch_carry import PlanCarry, Slice, Standing


def plan(
    snapshot: Snapshot,
    *,
    now: float,
    between: Callable[[], None] | None = None,
    carry: PlanCarry | None = None,
) -> Plan:
    """Decide which queued gangs to admit where, whom to evict, what to buy, and why the others wait.

    `between` is called after every few decisions: the caller's chance to step aside for other work
    (`federation.scheduling.yielding`); it must not touch the snapshot. `carry` is what the last plan
    over the same queue kept (`placement.stretch_carry`): given or not, the plan is the same; given,
    a deep queue's stretches cost what changed in them.
    """
    return _plan(snapshot, now, reuse=True, between=between, carry=carry)


# Decisions between two calls of `plan`'s `between`: tens of microseconds of work each.
_BETWEEN_EVERY: Final = 16
# Waits taken in bulk between two calls of `between` (`_Cycle.take_in_bulk`): well under a µs each.
_BETWEEN_EVERY_BULK: Final = 4096
# How often the cycle asks whether a stretch of the queue waits as already decided
# (`_Cycle.take_in_bulk`): after this many gangs, or as many as the queue has kinds and tenants (what
# the question costs) times `_BULK_PER_KIND`, if more; twice as long after each question that took
# fewer gangs than that. The tests ask after every gang.
_BULK_FIRST_CHECK = 63
_BULK_PER_KIND = 1
_QUEUE_ORDER: Final = attrgetter("queued_at_s", "job_id")
_QUEUED_AT: Final = attrgetter("queued_at_s")
_DECISION_KEY: Final = attrgetter("decision_key")
_DECISION_HASH: Final = attrgetter("decision_hash")
# How much of the queue's start the setup probes for shared key objects (`_Cycle`).
_PROBE_KEYS: Final = 256
# `within_guarantee`'s mark for no types (no headroom at all): below any gang's GPUs, and no
# headroom (guarantee less usage) comes near it.
_NO_HEADROOM: Final = -(1 << 60)


def _plan(
    snapshot: Snapshot,
    now: float,
    *,
    reuse: bool,
    between: Callable[[], None] | None = None,
    carry: PlanCarry | None = None,
) -> Plan:
    """`plan`; with `reuse` off every gang is decided afresh (the tests' check that reuse changes nothing)."""
    if carry is None:
        carry = PlanCarry()
    carry.begin(snapshot.queued, between)
    cycle = _Cycle(snapshot, now, reuse=reuse, carry=carry)
    order = FairOrder(snapshot.queued, cycle.fair, cycle.within_guarantee, carry.queue.tenant_lists())
    walk = iter(order)
    # When to ask next whether a stretch of the queue waits as already decided (`take_in_bulk`): a
    # question costs what the kinds and tenants number, so it is asked at most once per as many gangs,
    # and half as often after each that took fewer gangs than that.
    least = max(_BULK_FIRST_CHECK, _BULK_PER_KIND * (len(cycle.tenant_kinds) + cycle.kinds))
    gap = least
    index, check_at = 0, gap
    while (gang := next(walk, None)) is not None:
        if between is not None and index % _BETWEEN_EVERY == 0:
            between()
        cycle.decide(gang)
        carry.one_by_one += 1
        index += 1
        if index >= check_at and cycle.kinds:
            taken = cycle.take_in_bulk(order, between)
            if taken:
                index += taken
                walk = iter(order)  # the walk goes on from the tenants' positions after the stretch
            gap = least if taken >= gap else 2 * gap
            check_at = index + gap
    # Last, so that a move only takes private room no queued gang took or could take this cycle.
    moves = choose_moves(snapshot.running, cycle.inventory, cycle.book, cycle.costs, cycle.room.holds_on, now)
    return Plan(
        admissions=tuple(cycle.admissions),
        waiting=cycle.all_waiting(),
        preemptions=tuple(cycle.room.preemptions),
        capacity_requests=tuple(cycle.room.capacity_requests),
        reservations=tuple(cycle.room.reservations),
        moves=tuple(moves),
        bursts=cycle.room.bursts,
    )


# Its own `__init__`, compiled to struct writes: made per gang (see `placement.model_plan`'s text).
@dataclass(slots=True, init=False)
class _Fit:
    offer: Offer
    placed: HistogramFit
    cost_usd: float
    # For `explain`: the next best offer with room, and the first offer passed over for lack of room.
    runner_up: tuple[Offer, float] | None = None
    full: Offer | None = None

    def __init__(
        self,
        offer: Offer,
        placed: HistogramFit,
        cost_usd: float,
        runner_up: tuple[Offer, float] | None = None,
        full: Offer | None = None,
    ) -> None:
        self.offer = offer
        self.placed = placed
        self.cost_usd = cost_usd
        self.runner_up = runner_up
        self.full = full


@dataclass(slots=True, init=False)
class _Miss:
    # Nothing fits for lack of free GPUs (not a deadline, a reservation or a choice to wait).
    capacity_only: bool
    notes: Sequence[WaitReason] = ()
    # The gang chose to wait (for private capacity): try no other type and make no room.
    stop: bool = False

    def __init__(
        self,
        capacity_only: bool,
        notes: Sequence[WaitReason] = (),
        stop: bool = False,
    ) -> None:
        self.capacity_only = capacity_only
        self.notes = notes
        self.stop = stop


# Offers looked at past the chosen one for the runner-up that `explain` names.
_RUNNER_UP_SCAN: Final = 16


def _alternative(offer: Offer, cost_usd: float) -> Alternative:
    view = offer.view
    return Alternative(view.cluster, view.gpu_type, offer.kind, offer.usd_per_gpu_hour, cost_usd)


# Reasons that say the gang has its way to run already (room being made, a choice to wait for private
# GPUs, a reserved start): no eviction under its cap on top.
_MAKING_ROOM: Final = frozenset(
    {Code.PREEMPTING, Code.CAPACITY_REQUESTED, Code.WAITING_FOR_PRIVATE_CAPACITY, Code.RESERVED}
)

# Empty sets of clusters and placements, shared (an empty frozenset is made anew by each call).
_NO_CLUSTERS: Final[frozenset[ClusterName]] = frozenset()
_NO_FITS: Final[frozenset[tuple[ClusterName, GpuType]]] = frozenset()

# Most misses of a long queue are this one; it carries no notes, so one value serves them all.
_NO_FIT: Final = _Miss(True)


class _Cycle:
    """The working state of one `plan` call and the decision for one gang at a time."""

    def __init__(
        self, snapshot: Snapshot, now: float, *, reuse: bool = True, carry: PlanCarry | None = None
    ) -> None:
        self.now = now
        # The stretches the last plan made, which this one's may be edited from (`take_in_bulk`).
        self._carry = PlanCarry() if carry is None else carry
        self.policy = policy = snapshot.policy
        self.inventory = Inventory(snapshot.clusters, policy)
        self.book = QuotaBook(snapshot.tenants, snapshot.running, snapshot.gpu_families)
        self.families = dict(snapshot.gpu_families)
        self._placeable = set(self.inventory.by_type) | {p.gpu_type for _, p in self.inventory.scalable}
        self._offered_types: dict[tuple[GpuType, ...], tuple[GpuType, ...]] = {}
        # Each gang's list of types without repeats, kept per list (a queue holds a few hundred lists):
        # `dict.fromkeys` and a tuple per gang cost ten times the lookup.
        self._distinct_types: dict[tuple[GpuType, ...], tuple[GpuType, ...]] = {}
        # `_explain`'s heads, per types, then clusters allowed, then (pinned, uniform) as a slot
        # 2 * pinned + uniform: see `_head`. Nested, so that no 4-field key is made and hashed per wait.
        self._heads: dict[
            tuple[GpuType, ...],
            dict[
                frozenset[ClusterName] | None,
                list[tuple[tuple[WaitReason, ...], bool, frozenset[ClusterName]] | None],
            ],
        ] = {}
        book = self.book
        self.fair = FairShare(book.tenants, book.running_gpus, self.inventory.capacity_by_type, policy)
        self.costs = CostModel(dict(sorted(snapshot.gpu_speeds)), snapshot.egress_rates, policy)
        self.room = Room(snapshot, now, self.inventory, self.book, self.fair, self.costs)
        self.tables = Tables(self.inventory)
        # Capacity only shrinks during a cycle, so a (shape, types, spot) that fits nowhere stays so.
        # Kept per types, then clusters allowed, then spot (a slot), as a set of shapes: no 4-field key
        # made and hashed per gang that asks.
        self.infeasible: dict[
            tuple[GpuType, ...], dict[frozenset[ClusterName] | None, list[set[tuple[int, ...]]]]
        ] = {}
        # Replica lists repeat across a long queue: each is sorted into a shape once.
        self.shapes: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.admissions: list[Admission] = []
        # Where this cycle placed each job set's gangs that read a dataset: their set-mates decided
        # later count those stores as holding it (`set_affinity`; earlier cycles' are in the snapshot).
        self.sets = SetStores()
        self.waiting: list[Waiting] = []
        # The waits before `waiting`'s, in chunks: the stretches' (`take_in_bulk`, the chunks the
        # carry keeps and the next plan's shares) and those decided between them.
        self._waited: list[tuple[Waiting, ...]] = []
        # The last wait decided for each kind of gang (`GangRequest.decision_key`), and the working
        # state it was decided on (`_state`): another gang of that kind decided on the same state waits
        # for the same reasons, so it takes them without the work. A deep queue is mostly such gangs.
        # Kinds are numbered once per cycle by their key objects (`_kind_by_object`, by `id`): equal
        # keys are mostly one object (the scheduler's requests share them, `snapshot.GangRequests`),
        # so the objects are counted by C-level calls and each distinct one is hashed once, where
        # hashing a 22-field key per gang was most of this setup at 100,000 queued. Only kinds queued
        # more than once are numbered (a queue of all different gangs paid 5 to 9% for the
        # bookkeeping), and gangs whose own held GPUs or leaving victims the cycle carries
        # (`OrderedEvictions`) are decided as their own. Two lists rather than one of pairs: a pair
        # per decision made the garbage collector run more often. The gangs hold their keys, so no id
        # is reused during the cycle.
        queued = snapshot.queued if reuse else ()
        # Where the queue's key objects are apart (requests made apart, as the benchmark's; a first
        # stretch of the queue is probed), most gangs are kinds of their own, told apart by their kept
        # hashes alone (`GangRequest.decision_hash`, in a compiled loop): only the gangs whose hash
        # another's shares are looked at below, and the others count as kinds of their own. Where the
        # objects are shared (the scheduler's interned requests: a deep queue's gangs share a few
        # hundred), every gang is looked at below, per key object, which costs two passes over the
        # queue fewer there. Either way the same kinds are numbered.
        looked_at: Sequence[GangRequest] = queued
        twice_mask: list[bool] | None = None
        head = queued[:_PROBE_KEYS]
        if len({id(g.decision_key) for g in head}) == len(head):
            every_hash: list[object] = [g.decision_hash for g in queued]
            twice = _repeated(every_hash)
            twice_mask = list(map(twice.__contains__, every_hash)) if twice else []
            looked_at = list(compress(queued, twice_mask))
        # The gangs per key object, and a gang of each (by the object's id). Carried from the last
        # plan over the same queue where the objects are shared (`queue_carry.QueueCarry`: a pass
        # over a million gangs' keys was a sixth of a steady cycle), else counted here.
        counted = None if twice_mask is not None or not reuse else self._carry.queue.kind_counts()
        if counted is not None:
            samples, per_object = counted
        else:
            keys = list(map(_DECISION_KEY, looked_at))
            ids = list(map(id, keys))
            samples = dict(zip(ids, looked_at, strict=True))
            # Where no key object is queued twice (requests made apart, as the benchmark's), every
            # one counts one gang and none is repeated: no count is made (a `Counter` counts through
            # its Python-level methods, a tenth of this setup), and none kept.
            per_object = {} if len(samples) == len(ids) else Counter(ids)
        if per_object and reuse and twice_mask is None:
            # Kept only as counted over the whole queue (by hashes, only the gangs whose hash repeats
            # are counted).
            self._carry.queue.keep_kind_counts(samples, per_object)
        # Equal keys hash equal, so a key object queued once whose hash no other key object shares is
        # a kind of one gang: it is left unnumbered without going through the dict of values. Each
        # distinct key's hash is read where the request keeps it (`GangRequest.decision_hash`: hashing
        # a 22-field key per distinct key object and cycle was the most of this setup in a queue of
        # all different requests), and the kinds of one gang are picked out, by C-level calls. Looked
        # at per distinct key object, not per gang: a deep queue's gangs share a few hundred objects.
        hashes = list(map(_DECISION_HASH, samples.values()))
        shared = _repeated(hashes)
        repeated = set(compress(per_object, map(gt, per_object.values(), repeat(1))))
        maybe = list(map(or_, map(repeated.__contains__, samples), map(shared.__contains__, hashes)))
        by_value: dict[tuple[object, ...], int] = {}
        counts: list[int] = []
        # A gang of each numbered kind: what the kind's gangs have in common (`take_in_bulk`).
        self._kind_gangs: list[GangRequest] = []
        object_kind: dict[int, int] = {}
        for object_id, sample in compress(samples.items(), maybe):
            kind = by_value.setdefault(sample.decision_key, len(counts))
            if kind == len(counts):
                counts.append(0)
                self._kind_gangs.append(sample)
            counts[kind] += per_object.get(object_id, 1)
            object_kind[object_id] = kind
        self._kind_by_object = {o: k for o, k in object_kind.items() if counts[k] > 1}
        self._carried = self.room.ordered.carried()
        self._decided_on: list[int] = [-1] * len(counts)
        self._decided: list[Waiting | None] = [None] * len(counts)
        # `within_guarantee`'s answers: per tenant and types, the most GPUs it could take within a
        # guarantee (`QuotaBook.guarantee_headroom`), found at the tenant's count of changes to its
        # usage kept per tenant.
        self._headrooms: dict[TenantId, dict[tuple[GpuType, ...], int]] = {}
        self._headrooms_at: dict[TenantId, int] = {}
        self._reason_ones: dict[int, tuple[WaitReason, ...]] = {}
        # Per tenant, the state and the position `_settled_until` last found.
        self._settled_at: dict[TenantId, tuple[int, tuple[object, ...], int]] = {}
        numbered = [k for k, count in enumerate(counts) if count > 1]
        self.kinds = len(numbered)
        # Each tenant's numbered kinds, and how many of its gangs are of no numbered kind (a kind of
        # their own, or carried) and not yet decided (`take_in_bulk`).
        self.tenant_kinds: dict[TenantId, list[int]] = {}
        self._unnumbered_left: dict[TenantId, int] = {}
        if numbered:
            # The kinds of one gang passed over above, counted by tenant at C level.
            left = self._unnumbered_left = {}
            for unnumbered in compress(samples.values(), map(not_, maybe)):
                left[unnumbered.tenant] = left.get(unnumbered.tenant, 0) + 1
            for unnumbered in compress(queued, map(not_, twice_mask)) if twice_mask else ():
                left[unnumbered.tenant] = left.get(unnumbered.tenant, 0) + 1
            for kind, count in enumerate(counts):
                tenant = self._kind_gangs[kind].tenant
                if count > 1:
                    self.tenant_kinds.setdefault(tenant, []).append(kind)
                else:
                    left[tenant] = left.get(tenant, 0) + 1
            for g in queued if self._carried else ():
                if g.job_id in self._carried and id(g.decision_key) in self._kind_by_object:
                    left[g.tenant] = left.get(g.tenant, 0) + 1

    def all_waiting(self) -> Sequence[Waiting]:
        """Every wait of the cycle, in the order decided: a tuple, or with stretches taken in bulk their
        chunks (`placement.chunks.Chunks`), which the last plan's waits share where unchanged, so that
        neither the plan nor its reader passes over a million waits (a tuple of them was 6 to 9 ms)."""
        if not self._waited:
            return tuple(self.waiting)
        if self.waiting:
            self._waited.append(tuple(self.waiting))
            self.waiting = []
        return Chunks(tuple(self._waited))

    def _state(self) -> int:
        """Grows whenever the cycle's working state changes in a way a decision could read.

        Every write a decision makes to the working state counts here: free GPUs change with each
        admission and with capacity held for a preemptor; usage against quotas (which fair shares
        follow) with each admission, eviction and capacity request; and reservations (with their
        holds) are counted. What else decisions write (the shape and infeasibility caches, `Room`'s
        caches) is recomputable from these and gives the same answers. Today every change of free GPUs
        also adds usage; both are counted so that a write of one alone cannot slip past. Each count
        only grows, so their sum is unchanged exactly when none of them changed.
        """
        return self.inventory.changes + self.book.changes + len(self.room.reservations)

    def within_guarantee(self, gang: GangRequest) -> bool:
        """Whether the gang's tenant could run it on some accepted type without borrowing.

        Asked for every queued gang (`fair_order`). The most GPUs the tenant could take within a
        guarantee of one of the types reads only the tenant's own usage, so it is kept per (tenant,
        types) while that is unchanged (`QuotaBook.tenant_changes`; guarantees do not change in a
        cycle), for every gang size: answers kept per size, dropped at any change of any tenant's
        usage, were worked out afresh for two asks in three."""
        book, tenant, types = self.book, gang.tenant, gang.gpu_types
        changed = book.tenant_changes.get(tenant, 0)
        # Per tenant, the headrooms by types, all found at the tenant's count of changes kept beside
        # them (a change drops them all at once): no (tenant, types) key or (count, headroom) value
        # made per ask.
        kept = self._headrooms.get(tenant)
        if kept is None or self._headrooms_at[tenant] != changed:
            kept = self._headrooms[tenant] = {}
            self._headrooms_at[tenant] = changed
        headroom = kept.get(types)
        if headroom is None:
            found = book.guarantee_headroom(tenant, types)
            headroom = kept[types] = _NO_HEADROOM if found is None else found
        return headroom != _NO_HEADROOM and gang.gpu_count <= headroom

    def take_in_bulk(self, order: FairOrder, between: Callable[[], None] | None) -> int:
        """Decide at once the stretch of the queue, next in `order`, whose gangs all take their kind's
        wait as decided on the current state; how many that was (0: none, and `order` is untouched).

        `decide` takes such a gang's wait without deciding, and taking a wait changes no state, so
        within the stretch nothing changes what the others read, nor their order. That order is
        then a sort: a tenant is "settled" when its gangs left are all of numbered kinds decided on
        this state, its kinds share one standing (guarantee, priority; its share is unchanged too),
        and the entry its next gang goes by says the same. A settled tenant's gangs then go by one
        standing, then queue time and id, the order the walk merges them in. The first gang of an
        unsettled tenant, at the entry it goes by, ends the stretch. A deep queue that fits nowhere
        is mostly such stretches: one wait per kind, handed to a million gangs without a heap step
        and a decision each.

        A tenant whose gangs are not all of kinds decided on this state and of its next gang's
        standing (a kind not yet decided, a kind of another priority, a gang of a kind of its own) is
        settled up to its first gang that is not (`_settled_until`): its gangs before that one go by
        its standing and queue time, and that gang, at the entry it will go by, ends the stretch as an
        unsettled tenant's would. A server's queue has such tenants: jobs submitted through the API
        are another kind than the seeded ones (another run-time limit and class, the class's value a
        higher priority), and one such tenant, never settled even once its API jobs were decided,
        ended every stretch at its next gang, so that half of a deep queue was decided gang by gang.
        """
        heads = order.heads()
        if heads is None:
            return 0
        state = self._state()
        decided_on, kind_gangs = self._decided_on, self._kind_gangs
        # (the entry its next gang goes by, its gangs, that gang's position, the first position not
        # taken in any case).
        settled: list[tuple[Entry, list[GangRequest], int, int]] = []
        end: Entry | None = None
        for entry, gangs, position in heads:
            tenant = entry[5]
            kinds = self.tenant_kinds.get(tenant, ())
            if not kinds or order.fair.share(tenant) != entry[2]:
                if end is None or entry < end:
                    end = entry
                continue
            # The kinds that go by the standing of the tenant's next gang, decided on this state.
            alike = [
                k
                for k in kinds
                if decided_on[k] == state
                and (not self.within_guarantee(kind_gangs[k]), -kind_gangs[k].priority) == entry[:2]
            ]
            if len(alike) == len(kinds) and not self._unnumbered_left.get(tenant):
                settled.append((entry, gangs, position, len(gangs)))
                continue
            until = self._settled_until(tenant, gangs, position, state, entry[:2], alike)
            if until == position:
                if end is None or entry < end:
                    end = entry
                continue
            settled.append((entry, gangs, position, until))
            if until < len(gangs):
                # The gang that is not decided on this state goes by its own entry, as an unsettled
                # tenant's next gang does.
                stop_entry = order.entry(tenant, until)
                if end is None or stop_entry < end:
                    end = stop_entry
        # Per standing, each settled tenant's gangs taken: its list and the bounds.
        stretch: dict[Standing, dict[TenantId, Slice]] = {}
        taken: dict[TenantId, int] = {}
        for entry, gangs, position, until in settled:
            standing = entry[:3]
            if end is None or standing < end[:3]:
                stop = until
            elif standing > end[:3]:
                continue
            else:
                stop = bisect_left(gangs, end[3:5], position, until, key=_QUEUE_ORDER)
            if stop > position:
                stretch.setdefault(standing, {})[entry[5]] = (gangs, position, stop)
                taken[entry[5]] = stop
        if not taken:
            return 0
        count = 0
        for standing in sorted(stretch):
            slices = stretch[standing]
            # Each kind's decision, for every kind of the stretch's tenants decided on this state (what
            # the carry checks; a kind not decided on it has no gang in the stretch).
            decisions: dict[Hashable, Waiting] = {}
            for tenant in slices:
                for k in self.tenant_kinds[tenant]:
                    if decided_on[k] == state:
                        decisions[kind_gangs[k].decision_key] = self._decided[k]  # type: ignore[assignment]
            waits = self._carry.stretch_waits(
                standing, slices, decisions, self._decided, self._kind_by_object, between
            )
            count += sum(map(len, waits))
            # Chunks of the plan's waits (`all_waiting`), where the cycle's list took a copy of a
            # stretch's million waits first (a reference count touched each).
            if self.waiting:
                self._waited.append(tuple(self.waiting))
                self.waiting = []
            self._waited += waits
        order.advance(taken)
        self._carry.in_bulk += count
        return count

    def _settled_until(
        self,
        tenant: TenantId,
        gangs: list[GangRequest],
        position: int,
        state: int,
        standing: tuple[object, ...],
        alike: list[int],
    ) -> int:
        """The first position from `position` on of a gang of the tenant's that does not take its
        kind's wait as decided on `state` in the `standing` of its next gang (a kind not decided on
        it, or of another standing, a kind of its own, a gang whose held GPUs the cycle carries), or
        the end of its gangs; `alike` are the tenant's kinds that do. Kept per tenant with the state
        and standing: while those are unchanged the kinds decided on them only grow, so a later ask
        goes on from the last answer rather than from `position` (each tenant's gangs read at most
        once per state)."""
        kept = self._settled_at.get(tenant)
        at = position
        if kept is not None and kept[0] == state and kept[1] == standing and kept[2] > position:
            at = kept[2]
        kind_by_object, carried = self._kind_by_object, self._carried
        takes = set(alike)
        size = len(gangs)
        while at < size:
            gang = gangs[at]
            kind = kind_by_object.get(id(gang.decision_key))
            if kind is None or kind not in takes or (carried and gang.job_id in carried):
                break
            at += 1
        self._settled_at[tenant] = (state, standing, at)
        return at

    # -- step 3 and 4: gates and quota

    def decide(self, gang: GangRequest) -> None:
        """Admit the gang, or leave it waiting with its reasons; a wait may reuse an equal gang's."""
        kind = self._kind_by_object.get(id(gang.decision_key))
        if kind is None or (self._carried and gang.job_id in self._carried):
            if self._unnumbered_left:
                self._unnumbered_left[gang.tenant] -= 1
            self._decide(gang)
            return
        # `_state()`, inline: a deep queue takes this path for nearly every gang.
        state = self.inventory.changes + self.book.changes + len(self.room.reservations)
        if self._decided_on[kind] == state:
            earlier = self._decided[kind]
            assert earlier is not None
            self.waiting.append(wait_for_job(earlier, gang.job_id))
            return
        reads, waiting = self.costs.queue_time_reads, len(self.waiting)
        self._decide(gang)
        # An entry whose state has passed is never matched again (the state only grows): no clean-up.
        if len(self.waiting) > waiting and self.costs.queue_time_reads == reads and self._state() == state:
            self._decided_on[kind] = state
            self._decided[kind] = self.waiting[-1]

    def _decide(self, gang: GangRequest) -> None:
        gang = self.sets.widened(gang)
        # GPUs held for this gang since the cycle began (its victims' of earlier cycles) are its own.
        self.room.ordered.release(gang.job_id)
        gates = self._gates(gang)
        if gates:
            self.waiting.append(reasoned_wait(gang.job_id, tuple(gates)))
            return
        ctx = GangCost(self.costs, gang)
        shape = self.shapes.get(gang.replica_gpus)
        if shape is None:
            shape = self.shapes[gang.replica_gpus] = gang_shape(gang.replica_gpus)
        types = self._distinct_types.get(gang.gpu_types)
        if types is None:
            types = self._distinct_types[gang.gpu_types] = tuple(dict.fromkeys(gang.gpu_types))
        if self.families and len(types) > 1:
            types = self._offered(types)
        quota: dict[GpuType, WaitReason] = {}
        allowed: list[GpuType] = []
        limited: list[GpuType] = []
        for gpu_type in types:
            limit = self.book.limit_reason(gang.tenant, gpu_type, gang.gpu_count)
            reason = limit or self.book.lending_reason(
                gang.tenant, gpu_type, gang.gpu_count, self.inventory.free_by_type.get(gpu_type, 0)
            )
            if reason is None:
                allowed.append(gpu_type)
            else:
                quota[gpu_type] = reason
                if limit is not None:
                    limited.append(gpu_type)
        approved = self._approved_class(gang) if self.policy.preemption else None
        if approved is not None and limited:
            leaving = self.room.ordered.leaving.get(gang.job_id)
            if leaving and self._under_cap_once_gone(gang, leaving, limited):
                # Its own lower-priority gangs are leaving to make room under the cap for it: it waits for
                # them (and holds what it needs beyond theirs), it does not pass the cap meanwhile.
                waits = self.room.make_room(ctx, shape, [()])
                self.waiting.append(Waiting(gang.job_id, (quota[limited[0]], *waits)))
                return
        if gang.gpu_type_policy is GpuTypePolicy.ORDERED:
            groups: list[tuple[GpuType, ...]] = [(gpu_type,) for gpu_type in allowed]
        else:
            groups = [tuple(allowed)] if allowed else []
        notes: list[WaitReason] = []
        capacity_only = True
        for group in groups:
            outcome = self._place(ctx, shape, group)
            if isinstance(outcome, _Fit):
                self._admit(ctx, shape, outcome)
                return
            notes.extend(outcome.notes)
            capacity_only = capacity_only and outcome.capacity_only
            if outcome.stop:
                break
        else:
            if groups and capacity_only:
                notes.extend(self.room.make_room(ctx, shape, groups))
        if (
            approved is not None
            and limited
            and gang.job_id not in self.room.ordered.leaving  # never more victims while some leave
            and not any(n.code in _MAKING_ROOM for n in notes)
        ):
            for gpu_type in limited:
                evicting = self.room.preempt_under_cap(ctx, shape, gpu_type, approved)
                if evicting is not None:
                    self.waiting.append(Waiting(gang.job_id, (quota[gpu_type], evicting)))
                    return
        self.waiting.append(self._explain(ctx, shape, types, quota, notes, capacity_only))

    def _offered(self, types: tuple[GpuType, ...]) -> tuple[GpuType, ...]:
        """The types without the variants of a family that no cluster has (nor could grow) while
        another of the family is offered: a job asking for `A100` is expanded to the family's bare
        name and every variant, and most federations have a few of them. Cached per cycle."""
        kept = self._offered_types.get(types)
        if kept is None:
            placeable = self._placeable
            present = {self.families.get(t, t) for t in types if t in placeable}
            kept = tuple(t for t in types if t in placeable or self.families.get(t, t) not in present)
            self._offered_types[types] = kept
        return kept

    def _approved_class(self, gang: GangRequest) -> str | None:
        """The gang's priority class if it needs an admin's approval (the gates passed, so it has one)."""
        priority_class = self.room.classes.get(gang.priority_class)
        if priority_class is None or not priority_class.needs_approval:
            return None
        return priority_class.name

    def _under_cap_once_gone(
        self, gang: GangRequest, leaving: Sequence[RunningGang], limited: Sequence[GpuType]
    ) -> bool:
        """Whether the gang's own leaving victims free what it needs under its limits on some type."""
        for gpu_type in limited:
            freed = sum(g.gpu_count for g in leaving if g.tenant == gang.tenant and g.gpu_type == gpu_type)
            if freed and self.book.excess(gang.tenant, gpu_type, gang.gpu_count) <= freed:
                return True
        return False

    def _gates(self, gang: GangRequest) -> list[WaitReason]:
        quota = self.book.tenants.get(gang.tenant)
        if quota is None:
            return [WaitReason(Code.UNKNOWN_TENANT, f"tenant {gang.tenant} is not known to the federation")]
        reasons: list[WaitReason] = []
        # Asked of every queued gang: the two limits are tested in place, with no pairs built per gang.
        tenant_max, user_max = quota.max_priority, gang.user_max_priority
        if tenant_max is not None and gang.priority > tenant_max:
            reasons.append(_priority_not_allowed(gang, f"tenant {gang.tenant}", tenant_max))
        if user_max is not None and gang.priority > user_max:
            reasons.append(_priority_not_allowed(gang, "the submitting user", user_max))
        priority_class = self.room.classes.get(gang.priority_class)
        if priority_class is not None and priority_class.needs_approval:
            expires = gang.approval_expires_at_s
            if expires is None:
                message = f"priority class {priority_class.name} needs an admin's approval; none is granted"
                reasons.append(WaitReason(Code.APPROVAL_REQUIRED, message, tenant=gang.tenant))
            elif expires <= self.now:
                message = f"the approval for priority class {priority_class.name} expired at {expires:g}"
                reasons.append(WaitReason(Code.APPROVAL_EXPIRED, message, tenant=gang.tenant, at_s=expires))
        budget = self.book.budget_reason(gang.tenant)
        if budget is not None:
            reasons.append(budget)
        return reasons

    # -- step 5: place now

    def _place(self, ctx: GangCost, shape: tuple[int, ...], group: tuple[GpuType, ...]) -> _Fit | _Miss:
        gang = ctx.gang
        # With a bound on spot restarts, which spot offers a gang may take depends on its run, not only
        # its shape: such gangs neither read nor fill the shape's infeasibility cache.
        spot_bounded = gang.allow_spot and self.costs.spot_max_exposure is not None
        within = self.inventory.eligible(gang)
        by_within = self.infeasible.get(group)
        if by_within is None:
            by_within = self.infeasible[group] = {}
        by_spot = by_within.get(within)
        if by_spot is None:
            by_spot = by_within[within] = [set(), set()]
        infeasible = by_spot[gang.allow_spot]
        if not spot_bounded and shape in infeasible:
            return _NO_FIT
        need, largest = gang.gpu_count, shape[0] if shape else 0
        policy = self.policy

        # Spot offers with room that the bound on restarts kept from this gang: named if it waits.
        refused: list[Offer] = []
        # The first offer without room (in a static order, the cheapest): named by `explain` if cheaper.
        full: list[Offer] = []

        # Cost is the gang's GPU-hours times price per unit of work, so with a static order the offers'
        # fixed order by price per unit of work is the order of cost: no sort, and the scan below stops
        # at the first rank past the best fit. Otherwise they are sorted, price breaking ties of cost
        # (which a gang of no GPUs has zero everywhere).
        offers = (
            self.inventory.by_work_price(group, gang.allow_spot, self.costs, within)
            if ctx.static_order
            else self.inventory.search_order(group, gang.allow_spot, within)
        )
        candidates: Iterable[tuple[int, float, float, int, Offer]] = _candidates(
            offers, ctx, policy, need, largest, spot_bounded, full, refused
        )
        if not ctx.static_order:
            candidates = sorted(candidates, key=lambda c: (c[0], c[1], c[2], c[3], c[4].search_key))
        best: _Fit | None = None
        rank = (0, 0.0, 0.0, 0)
        fitted = False
        late: tuple[float, Offer] | None = None
        blocked: tuple[Offer, Hold] | None = None
        holds_on, deadline = self.room.holds_on, gang.deadline_at_s
        runner_up: tuple[Offer, float] | None = None
        remaining = iter(candidates)
        for tier, cost, factor, kind_rank, offer in remaining:
            if best is not None and (tier, cost, factor, kind_rank) != rank:
                if runner_up is None:
                    runner_up = self._runner_up(ctx, shape, (offer, cost), remaining)
                break
            placed = offer.fit(shape)
            if placed is None:
                continue
            fitted = True
            if deadline is not None:
                finish = self.now + ctx.duration_s(offer.view.gpu_type, offer.view.store)
                if finish > deadline:
                    late = (finish, offer) if late is None or finish < late[0] else late
                    continue
            if holds_on:
                delayed = next(
                    (h for h in holds_on.get(offer, ()) if not h.allows(shape, gang.max_runtime_s, self.now)),
                    None,
                )
                if delayed is not None:
                    blocked = (offer, delayed)
                    continue
            if best is None or placed.packing_key < best.placed.packing_key:
                if best is not None:
                    runner_up = (best.offer, best.cost_usd)
                best, rank = _Fit(offer, placed, cost), (tier, cost, factor, kind_rank)
            elif runner_up is None:
                runner_up = (offer, cost)
        if best is not None:
            best.runner_up = runner_up
            best.full = full[0] if full else None
        if best is None:
            spot_notes = self._spot_notes(ctx, refused)
            if not fitted:
                if not spot_bounded:
                    infeasible.add(shape)
                return _Miss(True, spot_notes) if spot_notes else _NO_FIT
            return _Miss(False, [*self._placement_notes(gang, late, blocked), *spot_notes])
        if self.policy.private_wait_s_per_gpu_hour > 0 and not best.offer.is_private:
            wait = self.room.private_wait(ctx, shape, group, _alternative(best.offer, best.cost_usd))
            if wait is not None:
                return _Miss(False, [wait], stop=True)
        return best

    def _runner_up(
        self,
        ctx: GangCost,
        shape: tuple[int, ...],
        first: tuple[Offer, float],
        rest: Iterable[tuple[int, float, float, int, Offer]],
    ) -> tuple[Offer, float] | None:
        """The next offer after the chosen rank where the gang would fit now (for `explain`): a few
        offers past the choice at most, so that explaining costs the cycle little."""
        deadline = ctx.gang.deadline_at_s
        for index, (offer, cost) in enumerate(chain([first], _offers_and_costs(rest))):
            if index >= _RUNNER_UP_SCAN:
                return None
            if offer.fit(shape) is None:
                continue
            if (
                deadline is not None
                and self.now + ctx.duration_s(offer.view.gpu_type, offer.view.store) > deadline
            ):
                continue
            return (offer, cost)
        return None

    def _spot_notes(self, ctx: GangCost, refused: Sequence[Offer]) -> list[WaitReason]:
        """Why spot capacity with room is not offered to this gang: reclaims would slow it too much."""
        bound = self.policy.spot_max_restart_slowdown
        if bound is None:  # without a bound no spot offer is refused
            return []
        notes, seen = [], set()
        for offer in refused:
            view = offer.view
            if (view.cluster, view.gpu_type) in seen:
                continue
            seen.add((view.cluster, view.gpu_type))
            slowdown = restart_slowdown(ctx.spot_exposure(view.gpu_type, offer.risk_per_hour))
            message = (
                f"spot capacity on cluster {view.cluster} ({view.gpu_type}) is not offered to this job: "
                f"at {offer.risk_per_hour:g} reclaims per node-hour, each restarting it from scratch, its "
                f"run would take about {slowdown:.0%} longer (the policy allows {bound:.0%})"
            )
            notes.append(WaitReason(Code.SPOT_NOT_ALLOWED, message, view.cluster, view.gpu_type))
        return notes

    def _placement_notes(
        self, gang: GangRequest, late: tuple[float, Offer] | None, blocked: tuple[Offer, Hold] | None
    ) -> list[WaitReason]:
        notes = []
        if late is not None:
            finish, offer = late
            message = (
                f"the job must finish by {gang.deadline_at_s:g}; the fastest placement free now, on cluster "
                f"{offer.view.cluster} ({offer.view.gpu_type}), would finish at {finish:g}"
            )
            notes.append(
                WaitReason(
                    Code.DEADLINE_UNMEETABLE, message, offer.view.cluster, offer.view.gpu_type, at_s=finish
                )
            )
        if blocked is not None:
            offer, hold = blocked
            message = (
                f"starting now on cluster {offer.view.cluster} ({offer.view.gpu_type}) would delay job "
                f"{hold.job_id}, reserved to start there at {hold.start_at_s:g}"
            )
            if gang.max_runtime_s <= 0:
                message += "; a job with a run-time limit that ends before then may start ahead"
            notes.append(
                WaitReason(
                    Code.BACKFILL_WOULD_DELAY,
                    message,
                    offer.view.cluster,
                    offer.view.gpu_type,
                    at_s=hold.start_at_s,
                )
            )
        return notes

    def _admit(self, ctx: GangCost, shape: tuple[int, ...], fit: _Fit) -> None:
        gang, offer = ctx.gang, fit.offer
        cluster, gpu_type = offer.view.cluster, offer.view.gpu_type
        self.inventory.take(offer, fit.placed, shape)
        self.sets.admitted(gang, offer.view.store)
        self.book.add(gang.tenant, gpu_type, gang.gpu_count)
        self.fair.add(gang.tenant, gpu_type, gang.gpu_count)
        for hold in self.room.holds_on.get(offer, ()):
            hold.commit(shape, gang.max_runtime_s, self.now)
        self.admissions.append(
            Admission(
                gang.job_id,
                cluster,
                gpu_type,
                offer.kind,
                offer.usd_per_gpu_hour,
                fit.cost_usd,
                self._choice(ctx, fit),
            )
        )

    def _choice(self, ctx: GangCost, fit: _Fit) -> Choice:
        """The figures `explain` words for the admitted gang: why this offer."""
        gang, offer, model = ctx.gang, fit.offer, self.costs
        store = offer.view.store
        cheaper_full = None
        if fit.full is not None and fit.full is not offer:
            full = fit.full
            full_cost = ctx.cost(full.view.gpu_type, full.price_factor, full.view.store)
            if full_cost < fit.cost_usd:
                cheaper_full = _alternative(full, full_cost)
        return Choice(
            speed=ctx.speed(offer.view.gpu_type),
            run_hours=ctx.work_s / ctx.speed(offer.view.gpu_type) / 3600.0,
            dataset=gang.dataset,
            dataset_store=gang.dataset_store,
            cluster_store=store,
            egress_usd=model.egress_usd(gang, store),
            transfer_s=model.transfer_s(gang, store),
            runner_up=None if fit.runner_up is None else _alternative(*fit.runner_up),
            cheaper_full=cheaper_full,
            spot_lost_work_h=(
                self.policy.spot_lost_work_h if gang.resumable and offer.kind is CapacityKind.SPOT else None
            ),
        )

    # -- step 7: explain

    def _explain(
        self,
        ctx: GangCost,
        shape: tuple[int, ...],
        types: tuple[GpuType, ...],
        quota: dict[GpuType, WaitReason],
        notes: list[WaitReason],
        capacity_only: bool,
    ) -> Waiting:
        """The gang's wait, with its reasons recorded as figures and worded when read (`reasons`)."""
        gang = ctx.gang
        within = self.inventory.eligible(gang)
        # The head depends on the types, the clusters allowed and which rules allowed them, not on the
        # rest of the gang: kept per cycle (each pinned gang built a frozenset, a sort and a worded
        # reason for it).
        pinned = bool(gang.pinning)
        by_within = self._heads.get(types)
        if by_within is None:
            by_within = self._heads[types] = {}
        slots = by_within.get(within)
        if slots is None:
            slots = by_within[within] = [None, None, None, None]
        slot = 2 * pinned + gang.uniform
        kept = slots[slot]
        if kept is None:
            kept = self._head(types, within, pinned, gang.uniform)
            slots[slot] = kept
        head, missing, ruled_out = kept
        fits_now = _NO_FITS
        if not capacity_only:
            fits_now = frozenset(
                (o.view.cluster, o.view.gpu_type)
                for o in self.inventory.search_order(types, gang.allow_spot, within)
                if o.fit(shape) is not None
            )
        tables, spot = self.tables, gang.allow_spot
        single = len(types) == 1 and not quota and not missing and not ruled_out
        if single:
            table = tables.table(types[0], shape, spot, False)
            if not notes and not fits_now:
                # The common case of a long queue: the type's table is the whole explanation.
                return explained_wait(gang.job_id, table)
            rows: tuple[Table, ...] = (table,)
            quotas: tuple[WaitReason | None, ...] = no_quotas(1)
        elif quota:
            rows = tuple([tables.table(t, shape, spot, t in quota) for t in types])
            if len(types) == 1:
                quotas = self._one_reason(quota[types[0]])
            else:
                quotas = tuple([quota.get(t) for t in types])
        else:
            # No quota reason: every table uncapped, and the reasons a shared tuple of Nones.
            rows = tuple([tables.table(t, shape, spot, False) for t in types])
            quotas = no_quotas(len(types))
        noted = self._one_reason(notes[0]) if len(notes) == 1 else tuple(notes)
        explanation = GangExplanation(head, quotas, rows, fits_now, noted, shape, single, ruled_out)
        return explained_wait(gang.job_id, explanation)

    # A tuple of one reason, one per reason in the cycle: many waits' explanations hold such a tuple
    # of a reason many share (a kept quota or preemption-limit reason), and the plan keeps every
    # explanation, for the collector to walk each. Kept by the reason's id: the tuple holds the
    # reason, so the id is not reused while kept. A variable-length tuple in the types, so that the
    # compiled form keeps the very object (a fixed-length one is taken apart and made anew when read).
    # (Tables are not: a type's table changes with its free GPUs, and one in six asks found one kept.)
    def _one_reason(self, reason: WaitReason) -> tuple[WaitReason, ...]:
        kept = self._reason_ones.get(id(reason))
        if kept is None:
            kept = self._reason_ones[id(reason)] = (reason,)
        return kept

    def _head(
        self, types: tuple[GpuType, ...], within: frozenset[ClusterName] | None, pinned: bool, uniform: bool
    ) -> tuple[tuple[WaitReason, ...], bool, frozenset[ClusterName]]:
        """What a wait's reasons begin with, before quota and capacity: the types no cluster has and
        the clusters the gang's rules (or its shape) exclude; whether a type is missing; those
        clusters."""
        head: tuple[WaitReason, ...] = ()
        by_type = self.inventory.by_type
        missing = [gpu_type for gpu_type in types if gpu_type not in by_type]
        if missing and self.families:
            # A family stands for its variants (`placement.gpu_types`): a variant no cluster has is
            # not news while another of the family's (or its bare name) is there.
            present = {self.families.get(t, t) for t in types if t in by_type}
            missing = [t for t in missing if self.families.get(t, t) not in present]
        if missing or not types:
            names = ", ".join(missing) or "(none listed)"
            only = missing[0] if len(missing) == 1 else None
            message = f"no cluster has GPUs of type {names}"
            head = (WaitReason(Code.NO_CLUSTER_HAS_GPU_TYPE, message, None, only),)
        ruled_out = _NO_CLUSTERS
        if within is not None:
            # Only clusters that have the types are named: those an unpinned job is told about too,
            # so the rules teach a tenant nothing about the federation it could not learn anyway.
            ruled_out = frozenset(
                v.cluster for t in types for v in by_type.get(t, ()) if v.cluster not in within
            )
            if ruled_out:
                head = (*head, _ruled_out(pinned, uniform, sorted(ruled_out)))
        return head, bool(missing), ruled_out


def _repeated(values: Sequence[object]) -> set[object]:
    """The values the list holds more than once (a compiled loop over two sets: a `Counter` counted
    through its Python-level methods). Read as objects: the values are hashes, and compiled, an `int`
    read from a list is unboxed and each set operation boxed it again, a new object each time for
    most hashes."""
    seen: set[object] = set()
    again: set[object] = set()
    for value in values:
        if value in seen:
            again.add(value)
        else:
            seen.add(value)
    return again


def _priority_not_allowed(gang: GangRequest, subject: str, limit: int) -> WaitReason:
    """Why the gang's priority is above what its tenant or its submitter may use."""
    message = f"{subject} may use priority up to {limit}; the job asks {gang.priority}"
    if gang.priority_class:
        message += f" (class {gang.priority_class})"
    return WaitReason(Code.PRIORITY_NOT_ALLOWED, message, tenant=gang.tenant)


def _ruled_out(pinned: bool, uniform: bool, clusters: Sequence[ClusterName]) -> WaitReason:
    """Why the named clusters, which have GPUs the gang accepts, are not considered for it (`pinned`:
    the gang has placement rules; `uniform`: its replicas all run the same)."""
    named = f"{'clusters' if len(clusters) > 1 else 'cluster'} {', '.join(clusters)}"
    rules = "the job's placement rules (spec.placement)"
    volcano = "its tasks differ (in GPUs, image, command, env or template), which needs Volcano"
    if pinned and not uniform:
        message = f"{named} ruled out by {rules}, or without Volcano while {volcano}"
    elif pinned:
        message = f"{named} ruled out by {rules}"
    else:
        message = f"{named} cannot run this job: {volcano}, and no Volcano is found there"
    return WaitReason(Code.PLACEMENT_RULES, message)


# Generator functions, not generator expressions: mypyc compiles a generator expression it cannot
# specialise into a list, computed all at once, and these two must stay lazy (`_place` stops at the
# first rank past its best fit, and `room_now` notes the first full offer it meets on the way).


def _candidates(
    offers: Iterable[Offer],
    ctx: GangCost,
    policy: PolicyConfig,
    need: int,
    largest: int,
    spot_bounded: bool,
    full: list[Offer],
    refused: list[Offer],
) -> Iterator[tuple[int, float, float, int, Offer]]:
    """The offers with room now for `need` GPUs with a replica of `largest`, each with its ranks, in
    the order given. The first offer without room goes to `full` (named by `explain` if cheaper), and
    spot offers with room that the bound on restarts keeps from the gang to `refused` (named if it
    waits). Tested here rather than by a closure of `_place`'s: a call per offer looked at (forty a
    gang that reaches the offers) went through the closure's generic Python entry."""
    for o in offers:
        free = o.free
        if free.total_free < need or free.max_free < largest:
            if not full:
                full.append(o)
            continue
        if spot_bounded and ctx.kept_off(o.kind, o.view.gpu_type, o.risk_per_hour):
            refused.append(o)
            continue
        yield (
            private_tier(o, policy),
            ctx.cost(o.view.gpu_type, o.price_factor, o.view.store),
            o.price_factor,
            o.kind_rank,
            o,
        )


def _offers_and_costs(rest: Iterable[tuple[int, float, float, int, Offer]]) -> Iterator[tuple[Offer, float]]:
    """Each candidate's offer and cost."""
    for c in rest:
        yield c[4], c[1]
