"""Preemption: the smallest set of whole running gangs to evict so that one waiting gang fits.

Who may be evicted for a waiting gang of tenant T, priority P, on GPU type X:

- a gang of T with a priority below P (within a tenant, lower priority yields to higher);
- a gang of another tenant that holds more of X than it is guaranteed (it borrows), when T stays
  within its own guarantee of X by taking the gang (guaranteed quota is reclaimed from borrowers).
  A borrower is evicted only down to its guarantee: each victim must still be borrowing once the
  victims before it are gone.

Never: a gang marked not preemptible (or whose priority class is not), a gang whose nodes are not
known (the placer could not tell what evicting it frees), or a gang another preemptor already counts
on this cycle.

Per offer (cluster, GPU type, kind, price) the search works on the offer's node list: the GPUs free
now plus those of gangs already leaving (evicted earlier and inside their grace period, which cost
nothing to count on). If the gang fits with those, no one new is evicted. Otherwise a single victim
is preferred when one suffices; failing that, victims are added in preference order (borrowers
first, from the tenant furthest above its weighted fair share; then lowest priority, fewest GPUs, most
recently queued, job id) until the gang fits, and then every victim whose removal
still leaves a fit is dropped again, so each evicted gang is needed. Among offers, the fewest victims
win, then the fewest GPUs evicted, then the offer's expected cost. A gang that would not fit even
with every candidate evicted evicts no one.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Final

from placement.fit import fit_replicas, fits
from placement.inventory import Inventory, Offer
from placement.model import GpuType, PreemptionReason, RunningGang, TenantId

Candidate = tuple[RunningGang, PreemptionReason]


# Its own `__init__`, compiled to struct writes: made per gang (see `placement.model_plan`'s text).
@dataclass(frozen=True, slots=True, init=False)
class VictimChoice:
    offer: Offer
    victims: tuple[Candidate, ...]
    # Gangs already leaving whose GPUs the preemptor counts on.
    draining: tuple[RunningGang, ...]
    # The offer's free GPUs per node once the preemptor's share of the free ones is held for it.
    nodes_after: tuple[int, ...]

    def __init__(
        self,
        offer: Offer,
        victims: tuple[Candidate, ...],
        draining: tuple[RunningGang, ...],
        nodes_after: tuple[int, ...],
    ) -> None:
        object.__setattr__(self, "offer", offer)
        object.__setattr__(self, "victims", victims)
        object.__setattr__(self, "draining", draining)
        object.__setattr__(self, "nodes_after", nodes_after)

    @property
    def victim_gpus(self) -> int:
        return sum(gang.gpu_count for gang, _ in self.victims)


Preference = tuple[float, int, int, float, str]


def _preference(candidate: Candidate) -> Preference:
    gang, _ = candidate
    return (0.0, gang.priority, gang.gpu_count, -gang.queued_at_s, gang.job_id)


def preference_of(gang: RunningGang) -> Preference:
    """A tenant's own gang's place in the victim order (`_preference`)."""
    return _preference((gang, PreemptionReason.LOWER_PRIORITY))


def by_share(share: Callable[[TenantId], float]) -> Callable[[Candidate], Preference]:
    """Victim order: borrowers first, from the tenant furthest above its weighted fair share (its
    weighted dominant share, `fairshare`), so a tenant with three times the weight keeps three times
    the GPUs; then the tenant's own lower priorities; within each, lowest priority, fewest GPUs, most
    recently queued, job id."""

    def preference(candidate: Candidate) -> Preference:
        gang, reason = candidate
        above = -share(gang.tenant) if reason is PreemptionReason.RECLAIM_GUARANTEE else 1.0
        return (above, gang.priority, gang.gpu_count, -gang.queued_at_s, gang.job_id)

    return preference


Located = tuple[RunningGang, tuple[tuple[int, int], ...]]
_JOB_ID: Final = attrgetter("job_id")
# Who may be evicted from one tenant: the reason, and a priority bound (only gangs below it; None: any).
TenantRule = tuple[PreemptionReason, int | None]


class OfferRunning:
    """The running gangs of one offer, split the ways the victim search reads them."""

    __slots__ = ("all", "by_tenant", "draining", "draining_gpus", "evictable_gpus", "tenant_gpus")

    def __init__(self) -> None:
        self.all: list[Located] = []
        self.draining: list[Located] = []
        # Evictable gangs per tenant, lowest priority first.
        self.by_tenant: dict[TenantId, list[Located]] = {}
        # What a victim search here could free at most (claims during the cycle only lessen it): the
        # leaving gangs' GPUs, every evictable gang's, and per tenant its gangs' priorities in order with
        # the GPUs of the gangs before each (`most_freed`): for n gangs one list of the n priorities
        # then the n + 1 sums (0 first), where two lists in a pair were three objects per tenant and
        # offer kept through the cycle for the collector to walk.
        self.draining_gpus = 0
        self.evictable_gpus = 0
        self.tenant_gpus: dict[TenantId, list[int]] = {}

    def most_freed(self, tenant: TenantId, below: int | None, others: bool) -> int:
        """The GPUs the tenant's gangs below priority `below` (None: all) hold here, plus, with `others`,
        every other tenant's evictable gangs', plus the leaving gangs': at least what any search with
        that rule could count."""
        gpus = self.draining_gpus
        own = self.tenant_gpus.get(tenant)
        if own is not None:
            count = len(own) >> 1  # gangs: the priorities are own[:count], the sums own[count:]
            mine = own[count + (count if below is None else bisect_left(own, below, 0, count))]
            gpus += mine
            if others:
                gpus += self.evictable_gpus - own[-1]
        elif others:
            gpus += self.evictable_gpus
        return gpus


class RunningIndex:
    """Running gangs by the offer their nodes are in; gangs that cannot be located are left out."""

    def __init__(
        self, inventory: Inventory, running: Iterable[RunningGang], preemptible: Callable[[RunningGang], bool]
    ) -> None:
        self._by_offer: dict[int, OfferRunning] = {}
        by_offer = self._by_offer
        # By job id, the order every list below keeps among equals (an attribute key, called in C).
        for gang in sorted(running, key=_JOB_ID):
            located = _locate(inventory, gang)
            if located is None:
                continue
            offer, shares = located
            entry = by_offer.get(id(offer))
            if entry is None:
                entry = by_offer[id(offer)] = OfferRunning()
            everything = entry.all
            everything.append((gang, shares))
            # The other lists take the very pair `all` holds, by a slice of it: compiled, a pair in a
            # typed local is taken apart and made anew each time it is stored, and a running gang's
            # pair made twice was two objects kept through the cycle (and in its plan's explanations)
            # for the collector to walk.
            if gang.terminating:
                entry.draining.extend(everything[-1:])
                entry.draining_gpus += gang.gpu_count
            elif preemptible(gang):
                gangs = entry.by_tenant.get(gang.tenant)
                if gangs is None:
                    gangs = entry.by_tenant[gang.tenant] = []
                gangs.extend(everything[-1:])
                entry.evictable_gpus += gang.gpu_count
        for entry in by_offer.values():
            for tenant, gangs in entry.by_tenant.items():
                # By (priority, job id). The gangs are in job-id order, so a stable sort on the priorities
                # alone gives it, and none is needed where they already ascend: most lists hold a gang
                # or two, where sorting each with a key function made a pair per gang in a Python call.
                priorities = [gang.priority for gang, _ in gangs]
                if not _ascending(priorities):
                    order = sorted(range(len(gangs)), key=priorities.__getitem__)
                    gangs[:] = list(map(gangs.__getitem__, order))  # the pairs themselves, as above
                    priorities = [priorities[i] for i in order]
                held = 0
                priorities.append(held)
                for gang, _ in gangs:
                    held += gang.gpu_count
                    priorities.append(held)
                entry.tenant_gpus[tenant] = priorities  # the priorities, then the sums
        self.claimed: set[str] = set()
        # `may_free`'s answers, with the version of the type's offers each was found at.
        self._may_free: dict[tuple[GpuType, TenantId, int | None, bool, int], tuple[int, frozenset[int]]] = {}
        self._running_offers: dict[GpuType, list[tuple[Offer, OfferRunning]]] = {}

    def may_free(
        self,
        inventory: Inventory,
        gpu_type: GpuType,
        tenant: TenantId,
        below: int | None,
        others: bool,
        need: int,
    ) -> frozenset[int]:
        """The offers of the type (by id) where a victim search could find `need` GPUs for a preemptor
        whose rule lets go the tenant's own gangs below priority `below` (None: any) and, with `others`,
        other tenants' gangs: those whose free GPUs plus every such gang's and every leaving gang's come
        to `need`. The search finds nothing on any other offer (it counts no more than that).

        Most gangs of a busy cycle that fit nowhere may free enough nowhere either: this answers for
        all of them at once. Kept while the type's offers are unchanged; gangs claimed meanwhile only
        lessen what could be freed, so a kept answer still holds every offer the search could use.
        """
        key = (gpu_type, tenant, below, others, need)
        version = inventory.type_version(gpu_type)
        found = self._may_free.get(key)
        if found is not None and found[0] == version:
            return found[1]
        running = self._running_offers.get(gpu_type)
        if running is None:
            # The type's offers with running gangs, each with its entry, once a cycle: the offers and
            # their order are fixed for the cycle (`Inventory.search_order`, cached), where each ask
            # looked every offer's entry up again.
            running = self._running_offers[gpu_type] = [
                (offer, entry)
                for offer in inventory.search_order((gpu_type,), True)
                if (entry := self._by_offer.get(id(offer))) is not None
            ]
        ids = frozenset(
            id(offer)
            for offer, entry in running
            if offer.free.total_free + entry.most_freed(tenant, below, others) >= need
        )
        self._may_free[key] = (version, ids)
        return ids

    def entries(self) -> Iterable[OfferRunning]:
        return self._by_offer.values()

    def entry(self, offer: Offer) -> OfferRunning | None:
        return self._by_offer.get(id(offer))

    def on(self, offer: Offer) -> list[Located]:
        entry = self._by_offer.get(id(offer))
        return [] if entry is None else entry.all


def _ascending(values: list[int]) -> bool:
    """Whether no value is below the one before it."""
    return all(values[i] >= values[i - 1] for i in range(1, len(values)))


def _locate(inventory: Inventory, gang: RunningGang) -> tuple[Offer, tuple[tuple[int, int], ...]] | None:
    if not gang.nodes:
        return None
    offer: Offer | None = None
    shares = []
    for share in gang.nodes:
        found = inventory.by_pool.get((gang.cluster, share.pool))
        if found is None or (offer is not None and found is not offer):
            return None
        offer = found
        index = found.node_index(share.pool, share.node_index)
        if index is None or not 0 <= index < len(found.node_sizes) or share.gpus < 0:
            return None
        shares.append((index, share.gpus))
    assert offer is not None
    return offer, tuple(shares)


def _with(nodes: list[int], shares: Iterable[tuple[int, int]]) -> list[int]:
    out = list(nodes)
    for index, gpus in shares:
        out[index] += gpus
    return out


# Each offer's outcome of earlier victim searches in the cycle (`choose_victims`' `memo`): by (the
# preemptor's kind, the offer), the offer's version and the caller's stamp it was found at, and the
# outcome (the victims, or None).
VictimMemo = dict[tuple[Hashable, Offer], tuple[int, Hashable, VictimChoice | None]]


def choose_victims(
    shape: tuple[int, ...],
    offers: Sequence[Offer],
    index: RunningIndex,
    rule: Callable[[Offer, TenantId], TenantRule | None],
    offer_cost: Callable[[Offer], float],
    valid: Callable[[Sequence[Candidate]], bool],
    preference: Callable[[Candidate], Preference] = _preference,
    memo: tuple[VictimMemo, Hashable, Hashable] | None = None,
) -> VictimChoice | None:
    """The best victim set over `offers`, or None when no set lets the gang fit on any of them.

    `rule(offer, tenant)` says whether, why and below which priority the tenant's gangs may be evicted;
    `valid(victims)` may still refuse a whole set (a borrower evicted below its guarantee).

    `memo` is (the outcomes kept, the preemptor's kind, a stamp): an offer's outcome is taken from one
    kept for the same kind when the offer's version and the stamp are those it was found at. The
    caller vouches that the kind holds everything `rule`, `valid` and `preference` read of the gang
    (`offer_cost`, read afresh, is not in the outcome), and that the stamp changes whenever anything
    else they read changes, and whenever a running gang is claimed (claims are read here).
    """
    best: VictimChoice | None = None
    best_key: tuple[int, int, float, tuple[object, ...]] | None = None
    for offer in offers:
        choice: VictimChoice | None
        if memo is None:
            choice = _offer_choice(shape, offer, index, rule, valid, preference)
        else:
            kept, kind, stamp = memo
            found = kept.get((kind, offer))
            if found is not None and found[0] == offer.version and found[1] == stamp:
                choice = found[2]
            else:
                choice = _offer_choice(shape, offer, index, rule, valid, preference)
                kept[(kind, offer)] = (offer.version, stamp, choice)
        if choice is None:
            continue
        key = (len(choice.victims), choice.victim_gpus, offer_cost(offer), offer.search_key)
        if best_key is None or key < best_key:
            best, best_key = choice, key
    return best


def _offer_choice(
    shape: tuple[int, ...],
    offer: Offer,
    index: RunningIndex,
    rule: Callable[[Offer, TenantId], TenantRule | None],
    valid: Callable[[Sequence[Candidate]], bool],
    preference: Callable[[Candidate], Preference],
) -> VictimChoice | None:
    """The fewest victims on one offer that let the gang fit there, or None."""
    entry = index.entry(offer)
    if entry is None or not offer.fits_when_empty(shape):
        return None
    need = sum(shape)
    claimed = index.claimed
    draining = [(g, s) for g, s in entry.draining if g.job_id not in claimed]
    room = offer.free.total_free + sum(g.gpu_count for g, _ in draining)
    eligible: list[tuple[Candidate, tuple[tuple[int, int], ...]]] = []
    for tenant, gangs in entry.by_tenant.items():
        found = rule(offer, tenant)
        if found is None:
            continue
        reason, below = found
        for gang, shares in gangs:
            if below is not None and gang.priority >= below:
                break
            if gang.job_id not in claimed:
                eligible.append(((gang, reason), shares))
                room += gang.gpu_count
    if room < need:
        return None  # not enough GPUs even with every candidate gone
    nodes = offer.nodes()
    freed = _with([0] * len(nodes), (s for _, shares in draining for s in shares))
    everything = _with(_with(nodes, (s for _, shares in eligible for s in shares)), enumerate(freed))
    if not fits(shape, everything):
        return None  # even evicting every candidate would not do
    chosen = _smallest_set(shape, nodes, freed, eligible, preference)
    if chosen is None:
        return None
    victims, victim_freed = chosen
    if not valid(victims):
        return None
    used_draining = _needed_draining(shape, nodes, victim_freed, draining)
    used = {gang.job_id for gang in used_draining}
    total_freed = _with(victim_freed, (s for g, shares in draining if g.job_id in used for s in shares))
    taken = fit_replicas(shape, [n + f for n, f in zip(nodes, total_freed, strict=True)])
    assert taken is not None
    # The preemptor uses freed GPUs first; whatever it needs beyond them is held from the free ones.
    nodes_after = tuple(n - max(0, t - f) for n, t, f in zip(nodes, taken, total_freed, strict=True))
    return VictimChoice(offer, tuple(victims), tuple(used_draining), nodes_after)


def _smallest_set(
    shape: tuple[int, ...],
    nodes: list[int],
    freed: list[int],
    eligible: list[tuple[Candidate, tuple[tuple[int, int], ...]]],
    preference: Callable[[Candidate], Preference],
) -> tuple[list[Candidate], list[int]] | None:
    base = [n + f for n, f in zip(nodes, freed, strict=True)]
    if fits(shape, base):
        return [], [0] * len(nodes)
    ordered = sorted(eligible, key=lambda item: preference(item[0]))
    for candidate, shares in ordered:
        if fits(shape, _with(base, shares)):
            return [candidate], _with([0] * len(nodes), shares)
    chosen: list[tuple[Candidate, tuple[tuple[int, int], ...]]] = []
    current = base
    for item in ordered:
        chosen.append(item)
        current = _with(current, item[1])
        if fits(shape, current):
            break
    else:
        return None
    # Drop, latest-added first, every victim the gang fits without.
    for item in reversed(list(chosen)):
        # Told apart by the gang, not the pair: compiled (mypyc), a pair read from a list is a new tuple,
        # never `is` another.
        rest = [other for other in chosen if other[0][0] is not item[0][0]]
        if fits(shape, _with(base, (s for _, shares in rest for s in shares))):
            chosen = rest
    victim_freed = _with([0] * len(nodes), (s for _, shares in chosen for s in shares))
    return [candidate for candidate, _ in sorted(chosen, key=lambda item: preference(item[0]))], victim_freed


def _needed_draining(
    shape: tuple[int, ...],
    nodes: list[int],
    victim_freed: list[int],
    draining: list[tuple[RunningGang, tuple[tuple[int, int], ...]]],
) -> list[RunningGang]:
    """The leaving gangs the preemptor counts on: all of them, less those it fits without."""
    kept = list(draining)
    base = [n + f for n, f in zip(nodes, victim_freed, strict=True)]
    for item in reversed(list(kept)):
        rest = [other for other in kept if other[0] is not item[0]]  # by the gang (`_smallest_set`)
        if fits(shape, _with(base, (s for _, shares in rest for s in shares))):
            kept = rest
    return [gang for gang, _ in kept]
