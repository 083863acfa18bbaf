"""Step 6 of the cycle: making room for a gang that fits nowhere for lack of free GPUs.

In this order, the first that applies:

1. Preempt: evict the smallest set of whole gangs that lets the gang fit (`preempt` says who may be
   evicted and how the set is chosen), unless that would pass the per-interval preemption limit. The
   GPUs the gang will use are held for it at once, so that later gangs of the cycle do not take them
   while the victims finish their grace period; the gang itself is admitted in a later cycle, once
   the victims are gone. Victims ordered out by an earlier cycle count the same way until they
   are gone (`RunningGang.evicted_for`, `placement.ordered`): their beneficiary evicts no one new
   and waits, holding only what it needs beyond them, and no other gang counts on them.
2. Wait for private capacity when the Starburst rule says the cloud is not worth it yet (`cost`),
   as long as the gang's tenant and job allow (`wait_policy`); optionally only if running gangs'
   run-time limits free room before the wait ends, and with a reservation of that room for the first
   waiting gang of the cycle (`PolicyConfig`). The wait's words price it against bursting now
   (`wait_saving`).
3. Ask a scalable pool for enough new nodes for the whole gang (`capacity`).
4. Reserve a start for the first such gang of the cycle (`backfill`).

The room maker keeps what the cycle has evicted, requested and reserved so far; `plan` returns it.
"""

from __future__ import annotations

from collections.abc import Sequence

from placement.backfill import Hold, reserve
from placement.capacity import Growth
from placement.cost import CostModel, GangCost
from placement.fairshare import FairShare
from placement.inventory import Inventory, Offer, price_factor
from placement.model import (
    Alternative,
    CapacityKind,
    CapacityRequest,
    ClusterName,
    GangRequest,
    GpuType,
    JobId,
    Preemption,
    PreemptionReason,
    Reservation,
    RunningGang,
    ScalablePool,
    Snapshot,
    TenantId,
    WaitReason,
)
from placement.model import WaitCode as Code
from placement.model_policy import CostPolicy
from placement.ordered import OrderedEvictions
from placement.preempt import (
    Candidate,
    RunningIndex,
    VictimChoice,
    VictimMemo,
    by_share,
    choose_victims,
    preference_of,
)
from placement.quota import QuotaBook
from placement.wait_policy import WaitTerms, terms_for
from placement.wait_saving import WaitSaving, clock

# A victim search's question: (tenant, priority, shape, types, spot, the clusters allowed).
_SearchKey = tuple[TenantId, int, tuple[int, ...], tuple[GpuType, ...], bool, frozenset[ClusterName] | None]


class Room:
    def __init__(
        self,
        snapshot: Snapshot,
        now: float,
        inventory: Inventory,
        book: QuotaBook,
        fair: FairShare,
        costs: CostModel,
    ) -> None:
        self.now = now
        self.policy = policy = snapshot.policy
        self.inventory = inventory
        self.book = book
        self.fair = fair
        self.costs = costs
        # A class named twice is a config mistake: the one first by `repr` wins, whatever the snapshot's
        # order. Sorted only then (each `repr` is the dataclass's interpreted method).
        classes = snapshot.priority_classes
        if len({c.name for c in classes}) < len(classes):
            classes = tuple(sorted(classes, key=repr, reverse=True))
        self.classes = {c.name: c for c in classes}
        self.running = RunningIndex(inventory, snapshot.running, self._preemptible)
        # What preemption could possibly use, per type: lowest evictable priority per tenant, tenants
        # with evictable gangs, and gangs already leaving. Lets most gangs skip the victim search at once.
        # Per tenant, then type (`_hopeful` asks per gang and type: no (tenant, type) pair made to ask).
        self.lowest_priority: dict[TenantId, dict[GpuType, int]] = {}
        self.evictable_tenants: dict[GpuType, set[TenantId]] = {}
        self.draining_types: set[GpuType] = set()
        for entry in self.running.entries():
            for gang, _ in entry.draining:
                self.draining_types.add(gang.gpu_type)
            for tenant, gangs in entry.by_tenant.items():
                gpu_type = gangs[0][0].gpu_type
                lowest = self.lowest_priority.setdefault(tenant, {})
                lowest[gpu_type] = min(gangs[0][0].priority, lowest.get(gpu_type, 1 << 62))
                self.evictable_tenants.setdefault(gpu_type, set()).add(tenant)
        # Gangs evicted for a queued gang by an earlier cycle: theirs and their GPUs are that gang's.
        self.ordered = OrderedEvictions(snapshot, inventory, self.running)
        self.growth = Growth(inventory.scalable, self._pool_work_price)
        # With `PolicyConfig.private_rate_sunk`, the GPU types whose private GPUs gangs with a dearer
        # cloud alternative want: some run on demand in a cloud now, or waited for them earlier in this
        # cycle. A gang whose wait only the sunk internal rate makes worth anything (spot priced under
        # that rate) does not wait for these: freed private GPUs save most where the bill is on demand.
        # It only grows during a cycle, so a decision reused for an equal later gang (`_Cycle.decide`)
        # saw the same answer or one that no longer holds back; and every wait that passes it reads the
        # gang's queue time, which such reuse never crosses.
        self.dear_types: set[GpuType] = (
            {g.gpu_type for g in snapshot.running if g.kind is CapacityKind.ON_DEMAND}
            if policy.private_rate_sunk
            else set()
        )
        # Reservations made this cycle, and per offer the last one (a later one starts after it).
        self.holds: list[Hold] = []
        self.holds_on: dict[Offer, list[Hold]] = {}
        self._waiter_holds = 0
        self._private_fits: dict[
            tuple[tuple[int, ...], tuple[GpuType, ...], bool, frozenset[ClusterName] | None], list[Offer]
        ] = {}
        # Earliest private room by running gangs' limits, per (shape, types, spot): see `private_wait`.
        self._room_at: dict[tuple[tuple[int, ...], tuple[GpuType, ...], bool], float | None] = {}
        # Victim searches that found nothing; the candidates only dwindle during a cycle.
        self.no_victims: set[_SearchKey] = set()
        self.preempted_gpus = policy.preempted_gpus_this_interval
        # Victim searches' outcomes per offer, kept while nothing they read changed (`_preempt`).
        self._victim_memo: VictimMemo = {}
        self._limit_used: WaitReason | None = None
        self.evicted: dict[tuple[TenantId, GpuType], int] = {}
        self.victim_ends: dict[str, float] = {}
        self.preemptions: list[Preemption] = []
        self.capacity_requests: list[CapacityRequest] = []
        self.reservations: list[Reservation] = []
        # Per gang, the cloud offer it would have burst to at once (the private wait's alternative, or
        # the pool asked to grow for it): the attempt's `burst_offer` in federation.
        self.bursts: dict[JobId, Alternative] = {}
        # Each tenant's cost policy, and the wait each policy sets (`wait_policy`).
        self.cost_policies = {t.tenant: t.cost_policy for t in snapshot.tenants}
        self._terms_by_policy: dict[CostPolicy, WaitTerms] = {}

    def private_wait(
        self, ctx: GangCost, shape: tuple[int, ...], group: Sequence[GpuType], burst: Alternative
    ) -> WaitReason | None:
        """Why to wait for private GPUs rather than burst now to `burst` (the cheapest cloud offer that
        fits, with its expected cost), if the Starburst rule, as the gang's tenant and job set it, says so.

        `burst` is kept as the attempt's burst-at-once alternative (`bursts`) whether it waits or not."""
        gang = ctx.gang
        self.bursts.setdefault(gang.job_id, burst)
        cloud_cost = burst.expected_cost_usd
        best: tuple[float, tuple[object, ...], Offer] | None = None
        private = self._private_offers(shape, group, gang.allow_spot, self.inventory.eligible(gang))
        for offer in private:
            cost = ctx.cost(offer.view.gpu_type, offer.price_factor, offer.view.store)
            if best is None or (cost, offer.search_key) < best[:2]:
                best = (cost, offer.search_key, offer)
        if best is None:
            return None
        private_cost, _, offer = best
        # Whether only the sunk internal rate makes this wait worth anything: the cloud offer (spot) is
        # priced under the private run at that rate.
        sunk_only = False
        if self.policy.private_rate_sunk:
            sunk_only = cloud_cost <= private_cost
            if not sunk_only:
                self.dear_types.add(offer.view.gpu_type)
            elif offer.view.gpu_type in self.dear_types:
                return None
            # The internal rate is paid whether the GPUs run or not: the wait saves the cloud's whole
            # bill, less what the private offer itself costs (its dataset's move).
            private_cost = ctx.cost(offer.view.gpu_type, 0.0, offer.view.store)
        delay = ctx.duration_s(offer.view.gpu_type, offer.view.store)
        priority_class = self.classes.get(gang.priority_class)
        terms = self._terms(gang.tenant)
        until = self.costs.private_wait_until_s(
            gang,
            private_cost,
            cloud_cost,
            delay,
            terms=terms,
            urgent=priority_class is not None and priority_class.needs_approval,
        )
        if self.now >= until:
            return None
        room_at = self._private_room_at(shape, group, ctx, private)
        needs_start = self.policy.private_wait_needs_start and (
            self.policy.private_wait_needs_start_max_gpus is None
            or gang.gpu_count <= self.policy.private_wait_needs_start_max_gpus
        )
        max_run_h = terms.needs_start_max_run_h
        if needs_start and max_run_h is not None and ctx.work_s > max_run_h * 3600.0:
            # A long gang waits without the room test (`PolicyConfig.private_wait_needs_start_max_run_h`,
            # or its tenant's `saver` policy: `wait_policy`).
            needs_start = False
        committed_after = self.policy.private_wait_needs_start_after_s
        if (
            needs_start
            and committed_after is not None
            and not sunk_only
            and self.now - gang.queued_at_s > committed_after
        ):
            # The test let it wait, and it has spent that long of its wait on the test's word
            # (`PolicyConfig.private_wait_needs_start_after_s`). Gangs started since may push the limits'
            # room past its wait's end, but runs end before their limits, and bursting now would pay
            # the cloud's bill on top of the hours waited.
            needs_start = False
        if needs_start and (room_at is None or room_at > until):
            return None
        hold: Hold | None = None
        # A sunk-only waiter's room is not reserved: the hold would keep it from the dearer gangs behind.
        if room_at is not None and room_at <= until and not sunk_only and self._may_reserve_for_waiter():
            hold = self._reserve_for_waiter(ctx, shape, private)
            if hold is None or hold.start_at_s > until:
                # Earlier reservations take the room first: by the limits, none is left before the wait ends.
                if needs_start:
                    return None
                hold = None
            else:
                self._keep(hold)
                self._waiter_holds += 1
        view = offer.view
        saving = WaitSaving(view.cluster, view.gpu_type, private_cost, burst, gang.gpu_count, until)
        message = saving.words(self.now)
        if room_at is not None and room_at <= until:
            message += f"; running gangs' run-time limits free room for it by {clock(room_at, self.now)}"
            if hold is not None:
                held = hold.offer.view
                message += f", reserved on cluster {held.cluster} ({held.gpu_type})"
                if hold.start_at_s != room_at:
                    message += f" from {clock(hold.start_at_s, self.now)}, after earlier reservations"
        return WaitReason(Code.WAITING_FOR_PRIVATE_CAPACITY, message, view.cluster, view.gpu_type, at_s=until)

    def _terms(self, tenant: TenantId) -> WaitTerms:
        policy = self.cost_policies.get(tenant, CostPolicy.BALANCED)
        terms = self._terms_by_policy.get(policy)
        if terms is None:
            terms = self._terms_by_policy[policy] = terms_for(self.policy, policy)
        return terms

    def _private_offers(
        self,
        shape: tuple[int, ...],
        group: Sequence[GpuType],
        spot: bool,
        clusters: frozenset[ClusterName] | None = None,
    ) -> list[Offer]:
        key = (shape, tuple(group), spot, clusters)
        private = self._private_fits.get(key)
        if private is None:
            # Whether a private offer could ever hold the shape does not change during a cycle.
            private = self._private_fits[key] = [
                offer
                for offer in self.inventory.search_order(group, spot, clusters)
                if offer.is_private and offer.fits_when_empty(shape)
            ]
        return private

    def _private_room_at(
        self, shape: tuple[int, ...], group: Sequence[GpuType], ctx: GangCost, private: Sequence[Offer]
    ) -> float | None:
        """The earliest time running gangs' run-time limits free private room for the shape (None: never
        known), or None at once when neither rule that reads it is on. Computed once per shape and types
        in a cycle: it depends only on the running gangs, not on the job."""
        policy = self.policy
        if not (policy.private_wait_needs_start or (policy.private_wait_reserve and policy.backfill)):
            return None
        key = (shape, tuple(group), ctx.gang.allow_spot)
        if key in self._room_at:
            return self._room_at[key]
        hold = reserve(
            ctx.gang.job_id,
            shape,
            private,
            self.running,
            self._end_of,
            lambda o: ctx.cost(o.view.gpu_type, o.price_factor, o.view.store),
        )
        at = self._room_at[key] = None if hold is None else hold.start_at_s
        return at

    def _may_reserve_for_waiter(self) -> bool:
        policy = self.policy
        if not (policy.private_wait_reserve and policy.backfill):
            return False
        if policy.private_wait_reservations <= 1:
            # One hold a cycle, as backfill: none if any gang holds one already.
            return not self.holds
        return self._waiter_holds < policy.private_wait_reservations

    def _reserve_for_waiter(
        self, ctx: GangCost, shape: tuple[int, ...], private: Sequence[Offer]
    ) -> Hold | None:
        """The private room for a waiting gang, after every reservation already made on each offer."""
        last = {offer: holds[-1] for offer, holds in self.holds_on.items()}
        return reserve(
            ctx.gang.job_id,
            shape,
            private,
            self.running,
            self._end_of,
            lambda o: ctx.cost(o.view.gpu_type, o.price_factor, o.view.store),
            last,
        )

    def _keep(self, hold: Hold) -> None:
        self.holds.append(hold)
        self.holds_on.setdefault(hold.offer, []).append(hold)
        view = hold.offer.view
        self.reservations.append(Reservation(hold.job_id, view.cluster, view.gpu_type, hold.start_at_s))

    def make_room(
        self, ctx: GangCost, shape: tuple[int, ...], groups: Sequence[tuple[GpuType, ...]]
    ) -> list[WaitReason]:
        notes: list[WaitReason] = []
        if ctx.gang.job_id in self.ordered.leaving:
            gang = ctx.gang
            reason, gpu_type = self.ordered.wait(gang, self.policy, self.now)
            self.book.add(gang.tenant, gpu_type, gang.gpu_count)
            self.fair.add(gang.tenant, gpu_type, gang.gpu_count)
            return [reason]
        if self.policy.preemption:
            for group in groups:
                outcome = self._preempt(ctx, shape, group)
                if outcome is not None:
                    if outcome.code is Code.PREEMPTING:
                        return [outcome]
                    notes.append(outcome)
                    break
        for group in groups:
            chosen = self._cheapest_pool(ctx, shape, group)
            if chosen is None:
                continue
            cluster, pool, _, pool_cost = chosen
            burst = Alternative(cluster, pool.gpu_type, pool.kind, pool.usd_per_gpu_hour, pool_cost)
            if self.policy.private_wait_s_per_gpu_hour > 0:
                wait = self.private_wait(ctx, shape, group, burst)
                if wait is not None:
                    return [*notes, wait]
            self.bursts.setdefault(ctx.gang.job_id, burst)
            return [*notes, self._request_capacity(ctx, chosen)]
        if self.policy.backfill and not self.holds:
            within = self.inventory.eligible(ctx.gang)
            offers = [
                o for group in groups for o in self.inventory.search_order(group, ctx.gang.allow_spot, within)
            ]
            hold = reserve(
                ctx.gang.job_id,
                shape,
                offers,
                self.running,
                self._end_of,
                lambda o: ctx.cost(o.view.gpu_type, o.price_factor, o.view.store),
            )
            if hold is not None:
                self._keep(hold)
                view = hold.offer.view
                message = (
                    f"reserved to start on cluster {view.cluster} ({view.gpu_type}) at {hold.start_at_s:g}, "
                    "when running gangs reach their run-time limits; later jobs may not delay it"
                )
                notes.append(
                    WaitReason(Code.RESERVED, message, view.cluster, view.gpu_type, at_s=hold.start_at_s)
                )
        return notes

    def _end_of(self, job_id: str, ends_at_s: float | None, terminating: bool) -> float | None:
        if job_id in self.victim_ends:
            return self.victim_ends[job_id]
        if terminating:
            return self.now + self.policy.default_grace_period_s
        return None if ends_at_s is None else max(ends_at_s, self.now)

    def _preemptible(self, gang: RunningGang) -> bool:
        priority_class = self.classes.get(gang.priority_class)
        return gang.preemptible and (priority_class is None or priority_class.preemptible)

    def _hopeful(self, gang: GangRequest, group: tuple[GpuType, ...]) -> bool:
        """Whether anyone at all could be evicted for the gang on these types (or is leaving already)."""
        lowest = self.lowest_priority.get(gang.tenant)
        for gpu_type in group:
            if gpu_type in self.draining_types:
                return True
            own = None if lowest is None else lowest.get(gpu_type)
            if own is not None and own < gang.priority:
                return True
            others = self.evictable_tenants.get(gpu_type)
            if (
                others
                and (len(others) > 1 or gang.tenant not in others)
                and self.book.within_guarantee(gang.tenant, gpu_type, gang.gpu_count)
            ):
                return True
        return False

    def _preempt(
        self, ctx: GangCost, shape: tuple[int, ...], group: tuple[GpuType, ...]
    ) -> WaitReason | None:
        gang, book = ctx.gang, self.book
        within = self.inventory.eligible(gang)
        key = (gang.tenant, gang.priority, shape, group, gang.allow_spot, within)
        if key in self.no_victims:
            return None
        need = gang.gpu_count
        if not self._hopeful(gang, group):
            self.no_victims.add(key)
            return None
        limit = self.policy.preemption_limit_gpus
        if limit is not None and self.preempted_gpus >= limit and not self.draining_types.intersection(group):
            # Nothing may be evicted any more this interval: spare the victim search. Once the limit is
            # used, every later gang of the cycle gets this same reason.
            if self._limit_used is None or self._limit_used.held_gpus != self.preempted_gpus:
                message = (
                    f"no gang may be preempted for this job until the interval ends: all {limit} GPUs that "
                    "may be preempted in it are used"
                )
                self._limit_used = WaitReason(
                    Code.PREEMPTION_LIMIT_REACHED, message, limit_gpus=limit, held_gpus=self.preempted_gpus
                )
            return self._limit_used
        # Whether the gang may reclaim guaranteed GPUs of each type from borrowers.
        reclaim = {t: book.within_guarantee(gang.tenant, t, need) for t in group}
        # `rule` lets the gang's own lower priorities go, and others' gangs only where it may reclaim: when
        # no offer of the types could free enough under that, the search below would find no one.
        may_free = self.running.may_free
        found = [
            ids
            for t in group
            if (ids := may_free(self.inventory, t, gang.tenant, gang.priority, reclaim[t], need))
        ]
        if not found:
            self.no_victims.add(key)
            return None
        hopeful = found[0] if len(found) == 1 else frozenset().union(*found)
        offers = [o for o in self.inventory.search_order(group, gang.allow_spot, within) if id(o) in hopeful]
        return self._search(ctx, shape, key, offers, reclaim)

    def _search(
        self,
        ctx: GangCost,
        shape: tuple[int, ...],
        key: _SearchKey,
        offers: list[Offer],
        reclaim: dict[GpuType, bool],
    ) -> WaitReason | None:
        """The victim search on the offers that could free enough, and what it leads to. Apart from
        `_preempt`'s checks, so that the closures the search takes (and the compiled form's
        environment object for what they read) are made only for the gangs that search, not for
        every gang that asks."""
        gang, book, need = ctx.gang, self.book, ctx.gang.gpu_count
        limit = self.policy.preemption_limit_gpus

        def rule(offer: Offer, tenant: TenantId) -> tuple[PreemptionReason, int | None] | None:
            if tenant == gang.tenant:
                return (PreemptionReason.LOWER_PRIORITY, gang.priority)
            gpu_type = offer.view.gpu_type
            if not reclaim[gpu_type]:
                return None
            if book.borrowing(tenant, gpu_type, self.evicted.get((tenant, gpu_type), 0)):
                return (PreemptionReason.RECLAIM_GUARANTEE, None)
            return None

        def valid(victims: Sequence[Candidate]) -> bool:
            """Each borrower's victims, in order, leave it borrowing until the last one goes."""
            evicted = dict(self.evicted)
            for victim, reason in victims:
                k = (victim.tenant, victim.gpu_type)
                if reason is PreemptionReason.RECLAIM_GUARANTEE and not book.borrowing(
                    victim.tenant, victim.gpu_type, evicted.get(k, 0)
                ):
                    return False
                evicted[k] = evicted.get(k, 0) + victim.gpu_count
            return True

        cost = lambda o: ctx.cost(o.view.gpu_type, o.price_factor, o.view.store)  # noqa: E731
        # The kind is what `rule` reads of the gang; the stamp grows with all else the search reads that a
        # cycle changes (usage, fair shares, claims, evictions), each offer's free GPUs aside.
        stamp = (book.changes, self.fair.changes, len(self.running.claimed), len(self.preemptions))
        memo = (self._victim_memo, (gang.tenant, gang.priority, shape), stamp)
        choice = choose_victims(
            shape, offers, self.running, rule, cost, valid, by_share(self.fair.share), memo
        )
        if choice is None:
            self.no_victims.add(key)
            return None
        if limit is not None and choice.victims and self.preempted_gpus + choice.victim_gpus > limit:
            message = (
                f"making room needs evicting {len(choice.victims)} gangs ({choice.victim_gpus} GPUs); "
                f"{self.preempted_gpus} of the {limit} GPUs that may be preempted this interval are used"
            )
            return WaitReason(
                Code.PREEMPTION_LIMIT_REACHED,
                message,
                choice.offer.view.cluster,
                choice.offer.view.gpu_type,
                limit_gpus=limit,
                held_gpus=self.preempted_gpus,
                needed_gpus=choice.victim_gpus,
            )
        offer = choice.offer
        cluster, gpu_type = offer.view.cluster, offer.view.gpu_type
        self.inventory.set_nodes(offer, list(choice.nodes_after))
        book.add(gang.tenant, gpu_type, need)
        self.fair.add(gang.tenant, gpu_type, need)
        grace_s = 0.0
        for victim, reason in choice.victims:
            grace_s = max(grace_s, self._evict(victim, reason, cluster, gpu_type, gang.job_id))
        for leaving in choice.draining:
            self.running.claimed.add(leaving.job_id)
        if choice.draining:
            # How much of their grace period the leaving gangs have left is not known: assume all of it.
            grace_s = max(grace_s, self.policy.default_grace_period_s)
        evicting = len(choice.victims) + len(choice.draining)
        message = (
            f"waiting for {evicting} gangs to leave cluster {cluster} ({gpu_type}); "
            f"their capacity is held for this job"
        )
        return WaitReason(Code.PREEMPTING, message, cluster, gpu_type, at_s=self.now + grace_s)

    def preempt_under_cap(
        self, ctx: GangCost, shape: tuple[int, ...], gpu_type: GpuType, class_name: str
    ) -> WaitReason | None:
        """Make room under its tenant's cap (or borrowing limit) for a gang of an approved priority
        class, by evicting the tenant's own lower-priority gangs of the type; None when that cannot
        make it fit (the caller leaves the quota reason).

        Victims are chosen per offer of the type: first the fewest the gang needs to fit there (as
        `_preempt`), then, while the tenant would still pass a limit, more of its lower-priority gangs
        of the type wherever they run, in preference order; each one that is not needed is dropped
        again. The fewest victims win across offers, then the fewest GPUs, then the cost. Only the
        tenant's own gangs are touched, and only below the gang's priority: other tenants never pay
        for one tenant's cap.
        """
        gang, book = ctx.gang, self.book
        over = book.excess(gang.tenant, gpu_type, gang.gpu_count)
        if over <= 0 or gang.gpu_count <= 0:
            return None
        claimed = self.running.claimed
        own: list[RunningGang] = sorted(
            (
                g
                for entry in self.running.entries()
                for g, _ in entry.by_tenant.get(gang.tenant, ())
                if g.gpu_type == gpu_type and g.priority < gang.priority and g.job_id not in claimed
            ),
            key=preference_of,
        )
        if sum(g.gpu_count for g in own) < over:
            return None

        def rule(_offer: Offer, tenant: TenantId) -> tuple[PreemptionReason, int | None] | None:
            return (PreemptionReason.TENANT_CAP, gang.priority) if tenant == gang.tenant else None

        def cost(offer: Offer) -> float:
            return ctx.cost(offer.view.gpu_type, offer.price_factor, offer.view.store)

        best: tuple[tuple[int, int, float, tuple[object, ...]], VictimChoice, list[RunningGang]] | None = None
        for offer in self.inventory.search_order((gpu_type,), gang.allow_spot, self.inventory.eligible(gang)):
            choice = choose_victims(shape, [offer], self.running, rule, cost, lambda _v: True)
            if choice is None:
                continue
            victims = [g for g, _ in choice.victims]
            freed = sum(g.gpu_count for g in victims)
            for g in own:
                if freed >= over:
                    break
                if g not in victims:
                    victims.append(g)
                    freed += g.gpu_count
            if freed < over:
                continue
            needed = {g.job_id for g, _ in choice.victims}
            for g in reversed(list(victims)):
                if g.job_id not in needed and freed - g.gpu_count >= over:
                    victims.remove(g)
                    freed -= g.gpu_count
            key = (len(victims), freed, cost(offer), offer.search_key)
            if best is None or key < best[0]:
                best = (key, choice, victims)
        if best is None:
            return None
        _, choice, victims = best
        victim_gpus = sum(g.gpu_count for g in victims)
        limit = self.policy.preemption_limit_gpus
        if limit is not None and self.preempted_gpus + victim_gpus > limit:
            return None
        offer = choice.offer
        cluster = offer.view.cluster
        self.inventory.set_nodes(offer, list(choice.nodes_after))
        book.add(gang.tenant, gpu_type, gang.gpu_count)
        self.fair.add(gang.tenant, gpu_type, gang.gpu_count)
        grace_s = 0.0
        for victim in victims:
            grace_s = max(
                grace_s,
                self._evict(victim, PreemptionReason.TENANT_CAP, victim.cluster, gpu_type, gang.job_id),
            )
        for leaving in choice.draining:
            self.running.claimed.add(leaving.job_id)
        message = (
            f"priority class {class_name} is approved: evicting {len(victims)} of tenant {gang.tenant}'s "
            f"lower-priority gangs ({victim_gpus} {gpu_type} GPUs) to make room under its limit; "
            f"this job then runs on cluster {cluster} ({gpu_type}), whose capacity is held for it"
        )
        return WaitReason(
            Code.PREEMPTING,
            message,
            cluster,
            gpu_type,
            tenant=gang.tenant,
            needed_gpus=over,
            held_gpus=victim_gpus,
            at_s=self.now + grace_s,
        )

    def _evict(
        self,
        victim: RunningGang,
        reason: PreemptionReason,
        cluster: ClusterName,
        gpu_type: GpuType,
        preemptor: JobId,
    ) -> float:
        """Order `victim` out for `preemptor`: claimed, counted against its tenant and the cycle's
        preemption limit, and recorded; returns its grace period (when its capacity is free)."""
        self.running.claimed.add(victim.job_id)
        grace = self.policy.default_grace_period_s if victim.grace_period_s is None else victim.grace_period_s
        self.victim_ends[victim.job_id] = self.now + grace
        k = (victim.tenant, victim.gpu_type)
        self.evicted[k] = self.evicted.get(k, 0) + victim.gpu_count
        self.preempted_gpus += victim.gpu_count
        self.preemptions.append(
            Preemption(
                victim.job_id,
                victim.tenant,
                cluster,
                gpu_type,
                victim.gpu_count,
                reason,
                grace,
                preemptor,
                victim.queued_at_s,
            )
        )
        return grace

    def _pool_cost(self, ctx: GangCost, cluster: ClusterName, pool: ScalablePool) -> float | None:
        store = self.inventory.stores.get(cluster)
        if (
            ctx.gang.deadline_at_s is not None
            and self.now + ctx.duration_s(pool.gpu_type, store) > ctx.gang.deadline_at_s
        ):
            return None
        if ctx.kept_off(pool.kind, pool.gpu_type, pool.restart_risk_per_hour):
            # Growing spot for a gang the bound keeps off spot would buy nodes it may not use.
            return None
        factor = price_factor(pool.kind, pool.usd_per_gpu_hour, pool.restart_risk_per_hour, self.policy)
        return ctx.cost(pool.gpu_type, factor, store)

    def _pool_work_price(self, pool: ScalablePool) -> float:
        factor = price_factor(pool.kind, pool.usd_per_gpu_hour, pool.restart_risk_per_hour, self.policy)
        return factor / self.costs.snapshot_speed(pool.gpu_type)

    def _cheapest_pool(
        self, ctx: GangCost, shape: tuple[int, ...], group: tuple[GpuType, ...]
    ) -> tuple[ClusterName, ScalablePool, int, float] | None:
        # Most gangs of a busy cycle ask after every pool they could grow has filled: answered here,
        # before `_grown` makes the closure it passes (and the compiled form its environment object).
        if self.growth.hopeless(shape, group, ctx.gang.allow_spot):
            return None
        return self._grown(ctx, shape, group)

    def _grown(
        self, ctx: GangCost, shape: tuple[int, ...], group: tuple[GpuType, ...]
    ) -> tuple[ClusterName, ScalablePool, int, float] | None:
        static = ctx.static_order and ctx.gang.deadline_at_s is None
        within = self.inventory.eligible(ctx.gang)

        def pool_cost(cluster: ClusterName, pool: ScalablePool) -> float | None:
            # A cluster the gang may not use is no cheaper for growing: it is unusable, as a missed deadline.
            return (
                None if within is not None and cluster not in within else self._pool_cost(ctx, cluster, pool)
            )

        chosen = self.growth.choose(shape, group, ctx.gang.allow_spot, pool_cost, static)
        if chosen is None:
            return None
        cluster, pool, nodes = chosen
        cost = self._pool_cost(ctx, cluster, pool)
        assert cost is not None
        return cluster, pool, nodes, cost

    def _request_capacity(
        self, ctx: GangCost, chosen: tuple[ClusterName, ScalablePool, int, float]
    ) -> WaitReason:
        cluster, pool, nodes, _ = chosen
        self.growth.ask(cluster, pool, nodes)
        gang = ctx.gang
        self.book.add(gang.tenant, pool.gpu_type, gang.gpu_count)
        self.fair.add(gang.tenant, pool.gpu_type, gang.gpu_count)
        self.capacity_requests.append(
            CapacityRequest(cluster, pool.name, pool.gpu_type, pool.kind, nodes, (gang.job_id,))
        )
        message = (
            f"asked for {nodes} more nodes of pool {pool.name} on cluster {cluster} ({pool.gpu_type}) "
            "for this job"
        )
        return WaitReason(
            Code.CAPACITY_REQUESTED, message, cluster, pool.gpu_type, needed_gpus=gang.gpu_count
        )
