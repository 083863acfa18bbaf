"""A straightforward implementation of the placement policy, for the benchmark to compare against.

It follows the rules of `placement.plan` step by step with the plainest data structures: node lists
fitted with `fit_replicas` for every offer and every gang, tenant shares recomputed for every pick,
quota limits read from the tenant records on every check, and no caches. It shares only the formulas
(`CostModel`, `price_factor`, `fit_replicas`, `nodes_needed`) with the placer, so that agreement of
the two on a large snapshot checks the placer's indexes, caches and shortcuts. It decides admissions
(and the preemptions, capacity requests and reservations that change later admissions), not reasons.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from placement.capacity import nodes_needed
from placement.cost import CostModel, GangCost
from placement.fit import fit_replicas, gang_shape
from placement.inventory import KIND_RANK, price_factor
from placement.model import (
    Admission,
    CapacityKind,
    ClusterName,
    GangRequest,
    GpuType,
    GpuTypePolicy,
    RunningGang,
    Snapshot,
    TenantId,
)


@dataclass
class Offer:
    cluster: ClusterName
    gpu_type: GpuType
    kind: CapacityKind
    price: float
    risk: float
    factor: float
    store: str | None
    reachable: bool
    nodes: list[int]
    sizes: list[int]
    offsets: dict[str, int] = field(default_factory=dict)

    def key(self) -> tuple[str, str, int, float, float]:
        return (self.cluster, self.gpu_type, KIND_RANK[self.kind], self.price, self.risk)


def plan_reference(snapshot: Snapshot, now: float) -> list[Admission]:
    return _Reference(snapshot, now).run()


class _Reference:
    def __init__(self, snapshot: Snapshot, now: float) -> None:
        self.s, self.now, self.policy = snapshot, now, snapshot.policy
        self.costs = CostModel(dict(sorted(snapshot.gpu_speeds)), snapshot.egress_rates, self.policy)
        groups: dict[tuple[str, str, CapacityKind, float, float], Offer] = {}
        reachable = {c.name: True for c in snapshot.clusters}
        for c in snapshot.clusters:
            reachable[c.name] = reachable[c.name] and c.reachable
        for c in snapshot.clusters:
            for p in sorted(c.pools, key=lambda p: p.name):
                k = (c.name, p.gpu_type, p.kind, p.usd_per_gpu_hour, p.restart_risk_per_hour)
                if k not in groups:
                    factor = price_factor(p.kind, p.usd_per_gpu_hour, p.restart_risk_per_hour, self.policy)
                    groups[k] = Offer(
                        c.name,
                        p.gpu_type,
                        p.kind,
                        p.usd_per_gpu_hour,
                        p.restart_risk_per_hour,
                        factor,
                        c.object_store,
                        reachable[c.name],
                        [],
                        [],
                    )
                o = groups[k]
                o.offsets.setdefault(p.name, len(o.nodes))
                o.nodes += list(p.free_gpus_per_node)
                o.sizes += [max(f, p.gpus_per_node) for f in p.free_gpus_per_node]
        self.offers = sorted(groups.values(), key=Offer.key)
        # Placement rules and gangs whose tasks differ: where each cluster is, and whether Volcano is.
        self.sites: dict[str, tuple[str, str, bool]] = {}
        for c in snapshot.clusters:
            mixed = c.runs_mixed_gangs and self.sites.get(c.name, ("", "", True))[2]
            self.sites[c.name] = (c.region, c.provider.value, mixed)
        self.capacity: dict[str, int] = {}
        for o in self.offers:
            if o.reachable:
                self.capacity[o.gpu_type] = self.capacity.get(o.gpu_type, 0) + sum(o.sizes)
        self.where: dict[int, list[tuple[RunningGang, list[tuple[int, int]]]]] = {}
        for r in sorted(snapshot.running, key=lambda r: r.job_id):
            for o in self.offers:
                if r.cluster == o.cluster and r.nodes and all(n.pool in o.offsets for n in r.nodes):
                    shares = [(o.offsets[n.pool] + n.node_index, n.gpus) for n in r.nodes]
                    self.where.setdefault(id(o), []).append((r, shares))
                    break
        self.draining_types = {
            r.gpu_type for located in self.where.values() for r, _ in located if r.terminating
        }
        self.tenants = {t.tenant: t for t in sorted(snapshot.tenants, key=repr, reverse=True)}
        self.usage: dict[tuple[str, str], int] = {}
        self.own: dict[str, dict[str, int]] = {}
        for r in snapshot.running:
            self._use(r.tenant, r.gpu_type, r.gpu_count)
        self.classes = {c.name: c for c in sorted(snapshot.priority_classes, key=repr, reverse=True)}
        self.claimed: set[str] = set()
        self.victim_ends: dict[str, float] = {}
        self.evicted: dict[tuple[str, str], int] = {}
        self.preempted = self.policy.preempted_gpus_this_interval
        self.asked: dict[tuple[str, str], int] = {}
        self.hold: tuple[Offer, float, list[int]] | None = None
        self.admissions: list[Admission] = []

    def _may(self, gang: GangRequest, cluster: str) -> bool:
        region, cloud, mixed = self.sites[cluster]
        return (gang.uniform or mixed) and gang.pinning.allows(cluster, region, cloud)

    # -- accounting
    def _path(self, tenant: str) -> list[str]:
        out = [tenant]
        while True:
            q = self.tenants.get(TenantId(out[-1]))
            if q is None or q.parent is None or q.parent not in self.tenants or q.parent in out:
                return out
            out.append(q.parent)

    def _use(self, tenant: str, gpu_type: str, gpus: int) -> None:
        for node in self._path(tenant):
            self.usage[(node, gpu_type)] = self.usage.get((node, gpu_type), 0) + gpus
        own = self.own.setdefault(tenant, {})
        own[gpu_type] = own.get(gpu_type, 0) + gpus

    def _guaranteed(self, tenant: str, gpu_type: GpuType) -> int:
        q = self.tenants[TenantId(tenant)].quota_for(gpu_type) if tenant in self.tenants else None
        return 0 if q is None else q.guaranteed_gpus

    def _over_limit(self, gang: GangRequest, gpu_type: GpuType) -> int:
        """GPUs of the type the tenant must give back for the gang to pass every cap and borrowing limit."""
        over = 0
        for node in self._path(gang.tenant):
            q, held = self.tenants[TenantId(node)], self.usage.get((node, gpu_type), 0)
            share = q.quota_for(gpu_type)
            for limit in (
                q.cap_for(gpu_type),
                None
                if share is None or share.borrowing_limit_gpus is None
                else share.guaranteed_gpus + share.borrowing_limit_gpus,
            ):
                if limit is not None:
                    over = max(over, held + gang.gpu_count - limit)
        return over

    def _quota_ok(self, gang: GangRequest, gpu_type: GpuType) -> bool:
        need = gang.gpu_count
        for node in self._path(gang.tenant):
            q, held = self.tenants[TenantId(node)], self.usage.get((node, gpu_type), 0)
            cap = q.cap_for(gpu_type)
            if cap is not None and held + need > cap:
                return False
            share = q.quota_for(gpu_type)
            if (
                share
                and share.borrowing_limit_gpus is not None
                and held + need > share.guaranteed_gpus + share.borrowing_limit_gpus
            ):
                return False
        held = self.usage.get((gang.tenant, gpu_type), 0)
        if held + need <= self._guaranteed(gang.tenant, gpu_type):
            return True
        parents = {q.parent for q in self.tenants.values()}
        reserved = 0
        for t, q in self.tenants.items():
            share = q.quota_for(gpu_type)
            if t != gang.tenant and t not in parents and share and share.lending_limit_gpus is not None:
                reserved += max(
                    0, share.guaranteed_gpus - self.usage.get((t, gpu_type), 0) - share.lending_limit_gpus
                )
        free = sum(sum(o.nodes) for o in self.offers if o.reachable and o.gpu_type == gpu_type)
        return reserved <= 0 or free - need >= reserved

    def _share(self, tenant: str) -> float:
        capacity = self.capacity
        q = self.tenants.get(TenantId(tenant))
        load = {g: float(n) for g, n in self.own.get(tenant, {}).items()}
        if self.policy.fair_share_history and self.policy.history_horizon_h > 0 and q is not None:
            for g, h in q.usage_history_gpu_hours:
                load[g] = load.get(g, 0.0) + h / self.policy.history_horizon_h
        weight = q.weight if q is not None and q.weight > 0 else 1.0
        return max((n / capacity[g] for g, n in load.items() if capacity.get(g, 0) > 0), default=0.0) / weight

    # -- the cycle
    def _within_guarantee(self, gang: GangRequest) -> bool:
        return any(
            self.usage.get((gang.tenant, t), 0) + gang.gpu_count <= self._guaranteed(gang.tenant, t)
            for t in gang.gpu_types
        )

    def run(self) -> list[Admission]:
        # Tenants take turns by their next gang: within its tenant's guarantee before borrowing, then
        # priority, then the lowest dominant share, then queue time; each tenant's own gangs by
        # priority, then queue time. Recomputed from scratch at every turn: slow, and plainly right.
        pending: dict[str, list[GangRequest]] = {}
        for g in sorted(self.s.queued, key=lambda g: (-g.priority, g.queued_at_s, g.job_id)):
            pending.setdefault(g.tenant, []).append(g)
        while pending:
            t = min(
                pending,
                key=lambda t: (
                    not self._within_guarantee(pending[t][0]),
                    -pending[t][0].priority,
                    self._share(t),
                    pending[t][0].queued_at_s,
                    pending[t][0].job_id,
                    t,
                ),
            )
            gang = pending[t].pop(0)
            if not pending[t]:
                del pending[t]
            self.decide(gang)
        return self.admissions

    def _gates_ok(self, gang: GangRequest) -> bool:
        q = self.tenants.get(gang.tenant)
        if q is None:
            return False
        if q.max_priority is not None and gang.priority > q.max_priority:
            return False
        if gang.user_max_priority is not None and gang.priority > gang.user_max_priority:
            return False
        c = self.classes.get(gang.priority_class)
        if (
            c is not None
            and c.needs_approval
            and (gang.approval_expires_at_s is None or gang.approval_expires_at_s <= self.now)
        ):
            return False
        for node in self._path(gang.tenant):
            b = self.tenants[TenantId(node)]
            if b.monthly_budget_gpu_hours is not None and b.spent_gpu_hours >= b.monthly_budget_gpu_hours:
                return False
        return True

    def decide(self, gang: GangRequest) -> None:
        if not self._gates_ok(gang):
            return
        shape = gang_shape(gang.replica_gpus)
        allowed = [t for t in dict.fromkeys(gang.gpu_types) if self._quota_ok(gang, t)]
        groups: list[tuple[GpuType, ...]] = (
            [(t,) for t in allowed]
            if gang.gpu_type_policy is GpuTypePolicy.ORDERED
            else ([tuple(allowed)] if allowed else [])
        )
        ctx = GangCost(self.costs, gang)
        capacity_only = True
        for group in groups:
            usable = [
                o
                for o in self.offers
                if o.gpu_type in group
                and o.reachable
                and (gang.allow_spot or o.kind is not CapacityKind.SPOT)
                and self._may(gang, o.cluster)
            ]
            best, fitted = None, False
            for o in usable:
                taken = fit_replicas(shape, o.nodes)
                if taken is None:
                    continue
                fitted = True
                if (
                    gang.deadline_at_s is not None
                    and self.now + ctx.duration_s(o.gpu_type, o.store) > gang.deadline_at_s
                ):
                    continue
                if self.hold is not None and self.hold[0] is o and not self._hold_allows(shape, gang):
                    continue
                touched = [i for i, n in enumerate(taken) if n]
                cost = ctx.cost(o.gpu_type, o.factor, o.store)
                rank = (
                    cost,
                    o.factor,
                    KIND_RANK[o.kind],
                    sum(o.nodes[i] - taken[i] for i in touched),
                    len(touched),
                    o.key(),
                )
                if best is None or rank < best[0]:
                    best = (rank, o, taken, cost)
            if best is None:
                capacity_only = capacity_only and not fitted
                continue
            _, o, taken, cost = best
            if (
                self.policy.private_wait_s_per_gpu_hour > 0
                and o.kind is not CapacityKind.PRIVATE
                and self._waits(ctx, shape, group, cost)
            ):
                return
            o.nodes = [n - t for n, t in zip(o.nodes, taken, strict=True)]
            if self.hold is not None and self.hold[0] is o:
                self._hold_commit(shape, gang)
            self._use(gang.tenant, o.gpu_type, gang.gpu_count)
            self.admissions.append(Admission(gang.job_id, o.cluster, o.gpu_type, o.kind, o.price, cost))
            return
        if groups and capacity_only and self._make_room(gang, shape, groups, ctx):
            return
        # An approved class at its tenant's cap evicts the tenant's own lower priorities to get under it.
        c = self.classes.get(gang.priority_class)
        if self.policy.preemption and c is not None and c.needs_approval:
            for t in dict.fromkeys(gang.gpu_types):
                over = self._over_limit(gang, t)
                if over > 0 and self._preempt(gang, shape, (t,), ctx, cap_over=over):
                    return

    def _waits(self, ctx: GangCost, shape: tuple[int, ...], group: tuple[GpuType, ...], cloud: float) -> bool:
        best = None
        for o in self.offers:
            if (
                o.gpu_type in group
                and o.reachable
                and o.kind is CapacityKind.PRIVATE
                and self._may(ctx.gang, o.cluster)
                and fit_replicas(shape, o.sizes) is not None
            ):
                c = ctx.cost(o.gpu_type, o.factor, o.store)
                if best is None or (c, o.key()) < best[:2]:
                    best = (c, o.key(), o)
        if best is None:
            return False
        # A class that needs approval never waits (issue 35); every tenant is balanced here.
        klass = self.classes.get(ctx.gang.priority_class)
        until = self.costs.private_wait_until_s(
            ctx.gang,
            best[0],
            cloud,
            ctx.duration_s(best[2].gpu_type, best[2].store),
            urgent=klass is not None and klass.needs_approval,
        )
        return self.now < until

    def _hold_allows(self, shape: tuple[int, ...], gang: GangRequest) -> bool:
        assert self.hold is not None
        if gang.max_runtime_s > 0 and self.now + gang.max_runtime_s <= self.hold[1]:
            return True
        return fit_replicas(shape, self.hold[2]) is not None

    def _hold_commit(self, shape: tuple[int, ...], gang: GangRequest) -> None:
        assert self.hold is not None
        if gang.max_runtime_s > 0 and self.now + gang.max_runtime_s <= self.hold[1]:
            return
        taken = fit_replicas(shape, self.hold[2])
        assert taken is not None
        self.hold = (self.hold[0], self.hold[1], [n - t for n, t in zip(self.hold[2], taken, strict=True)])

    # -- step 6
    def _located(self, o: Offer) -> list[tuple[RunningGang, list[tuple[int, int]]]]:
        return self.where.get(id(o), [])

    def _preemptible(self, r: RunningGang) -> bool:
        c = self.classes.get(r.priority_class)
        return r.preemptible and (c is None or c.preemptible)

    def _make_room(
        self, gang: GangRequest, shape: tuple[int, ...], groups: list[tuple[GpuType, ...]], ctx: GangCost
    ) -> bool:
        """Whether room is made (or the gang waits for private GPUs, or holds a reservation)."""
        if self.policy.preemption:
            for group in groups:
                done = self._preempt(gang, shape, group, ctx)
                if done is not None:
                    if done:
                        return True
                    break
        for group in groups:
            best = None
            for c in self.s.clusters:
                if not c.reachable or not self._may(gang, c.name):
                    continue
                for p in c.scalable_pools:
                    if p.gpu_type not in group or (p.kind is CapacityKind.SPOT and not gang.allow_spot):
                        continue
                    n = nodes_needed(shape, p.gpus_per_node)
                    if not n or p.addable_nodes - self.asked.get((c.name, p.name), 0) < n:
                        continue
                    if (
                        gang.deadline_at_s is not None
                        and self.now + ctx.duration_s(p.gpu_type, c.object_store) > gang.deadline_at_s
                    ):
                        continue
                    cost = ctx.cost(
                        p.gpu_type,
                        price_factor(p.kind, p.usd_per_gpu_hour, p.restart_risk_per_hour, self.policy),
                        c.object_store,
                    )
                    if best is None or (cost, c.name, p.name) < best[0]:
                        best = ((cost, c.name, p.name), c, p, n)
            if best is None:
                continue
            if self.policy.private_wait_s_per_gpu_hour > 0 and self._waits(ctx, shape, group, best[0][0]):
                return True
            _, c, p, n = best
            self.asked[(c.name, p.name)] = self.asked.get((c.name, p.name), 0) + n
            self._use(gang.tenant, p.gpu_type, gang.gpu_count)
            return True
        if self.policy.backfill and self.hold is None:
            self._reserve(gang, shape, groups, ctx)
            return self.hold is not None
        return False

    def _preempt(
        self,
        gang: GangRequest,
        shape: tuple[int, ...],
        group: tuple[GpuType, ...],
        ctx: GangCost,
        cap_over: int | None = None,
    ) -> bool | None:
        """True: room made; False: the limit stopped it; None: no victims. With `cap_over`, only the
        tenant's own lower priorities, enough of them (anywhere) to free that many GPUs of its quota."""
        limit = self.policy.preemption_limit_gpus
        need = gang.gpu_count

        def order(e: tuple[RunningGang, str, object]) -> tuple[float, int, int, float, str]:
            r, why, _ = e
            above = -self._share(r.tenant) if why == "reclaim" else 1.0
            return (above, r.priority, r.gpu_count, -r.queued_at_s, r.job_id)

        own: list[RunningGang] = []
        if cap_over is not None:
            own = sorted(
                (
                    r
                    for o in self.offers
                    if o.gpu_type in group
                    for r, _ in self._located(o)
                    if r.tenant == gang.tenant
                    and r.priority < gang.priority
                    and not r.terminating
                    and r.job_id not in self.claimed
                    and self._preemptible(r)
                ),
                key=lambda r: (r.priority, r.gpu_count, -r.queued_at_s, r.job_id),
            )
            if sum(r.gpu_count for r in own) < cap_over:
                return None
        elif limit is not None and self.preempted >= limit and not self.draining_types.intersection(group):
            located_all = [(o, r) for o in self.offers for r, _ in self._located(o)]
            # Reported only for a gang that has anyone to evict at all, as the placer does.
            hopeful = any(
                r.gpu_type in group
                and not r.terminating
                and self._preemptible(r)
                and (
                    (r.tenant == gang.tenant and r.priority < gang.priority)
                    or (
                        r.tenant != gang.tenant
                        and self.usage.get((gang.tenant, r.gpu_type), 0) + need
                        <= self._guaranteed(gang.tenant, r.gpu_type)
                    )
                )
                for _, r in located_all
            )
            return False if hopeful else None
        best = None
        for o in self.offers:
            if (
                o.gpu_type not in group
                or not o.reachable
                or (o.kind is CapacityKind.SPOT and not gang.allow_spot)
                or not self._may(gang, o.cluster)
            ):
                continue
            if fit_replicas(shape, o.sizes) is None:
                continue
            located = self._located(o)
            draining = [(r, s) for r, s in located if r.terminating and r.job_id not in self.claimed]
            eligible = []
            for r, s in located:
                if r.terminating or r.job_id in self.claimed or not self._preemptible(r):
                    continue
                if r.tenant == gang.tenant:
                    if r.priority < gang.priority:
                        eligible.append((r, "lower", s))
                elif (
                    cap_over is None
                    and self.usage.get((gang.tenant, o.gpu_type), 0) + need
                    <= self._guaranteed(gang.tenant, o.gpu_type)
                    and (
                        self.usage.get((r.tenant, o.gpu_type), 0)
                        - self.evicted.get((r.tenant, o.gpu_type), 0)
                        > self._guaranteed(r.tenant, o.gpu_type)
                    )
                ):
                    eligible.append((r, "reclaim", s))
            if not draining and not eligible and cap_over is None:
                continue
            base = _freed(o.nodes, [s for _, s in draining])
            if fit_replicas(shape, _freed(base, [s for _, _, s in eligible])) is None:
                continue
            ordered = sorted(eligible, key=order)
            chosen = None
            if fit_replicas(shape, base) is not None:
                chosen = []
            else:
                for e in ordered:
                    if fit_replicas(shape, _freed(base, [e[2]])) is not None:
                        chosen = [e]
                        break
            if chosen is None:
                chosen = []
                for e in ordered:
                    chosen.append(e)
                    if fit_replicas(shape, _freed(base, [x[2] for x in chosen])) is not None:
                        break
                for e in reversed(list(chosen)):
                    rest = [x for x in chosen if x is not e]
                    if fit_replicas(shape, _freed(base, [x[2] for x in rest])) is not None:
                        chosen = rest
                chosen = sorted(chosen, key=order)
            ev = dict(self.evicted)
            valid = True
            for r, why, _ in chosen:
                k = (r.tenant, r.gpu_type)
                if why == "reclaim" and not self.usage.get(k, 0) - ev.get(k, 0) > self._guaranteed(*k):
                    valid = False
                ev[k] = ev.get(k, 0) + r.gpu_count
            if not valid:
                continue
            victim_freed = _freed([0] * len(o.nodes), [s for _, _, s in chosen])
            used = list(draining)
            vbase = [a + b for a, b in zip(o.nodes, victim_freed, strict=True)]
            for d in reversed(list(used)):
                rest = [x for x in used if x is not d]
                if fit_replicas(shape, _freed(vbase, [s for _, s in rest])) is not None:
                    used = rest
            total = _freed(victim_freed, [s for _, s in used])
            victims = [r for r, _, _ in chosen]
            if cap_over is not None:
                # Enough of the tenant's own to get under its limit; then drop, last first, each one
                # the gang's fit does not need and the quota can do without.
                freed = sum(r.gpu_count for r in victims)
                for r in own:
                    if freed >= cap_over:
                        break
                    if r not in victims:
                        victims.append(r)
                        freed += r.gpu_count
                if freed < cap_over:
                    continue
                needed = {r.job_id for r, _, _ in chosen}
                for r in reversed(list(victims)):
                    if r.job_id not in needed and freed - r.gpu_count >= cap_over:
                        victims.remove(r)
                        freed -= r.gpu_count
            gpus = sum(r.gpu_count for r in victims)
            key = (len(victims), gpus, ctx.cost(o.gpu_type, o.factor, o.store), o.key())
            if best is None or key < best[0]:
                best = (key, o, victims, used, total)
        if best is None:
            return None
        _, o, victims, used, total = best
        gpus = sum(r.gpu_count for r in victims)
        if limit is not None and victims and self.preempted + gpus > limit:
            return None if cap_over is not None else False
        taken = fit_replicas(shape, [n + f for n, f in zip(o.nodes, total, strict=True)])
        assert taken is not None
        o.nodes = [n - max(0, t - f) for n, t, f in zip(o.nodes, taken, total, strict=True)]
        self._use(gang.tenant, o.gpu_type, need)
        for r in victims:
            self.claimed.add(r.job_id)
            grace = self.policy.default_grace_period_s if r.grace_period_s is None else r.grace_period_s
            self.victim_ends[r.job_id] = self.now + grace
            self.evicted[(r.tenant, r.gpu_type)] = self.evicted.get((r.tenant, r.gpu_type), 0) + r.gpu_count
            self.preempted += r.gpu_count
        for r, _ in used:
            self.claimed.add(r.job_id)
        return True

    def _reserve(
        self, gang: GangRequest, shape: tuple[int, ...], groups: list[tuple[GpuType, ...]], ctx: GangCost
    ) -> None:
        best = None
        for group in groups:
            for o in self.offers:
                if (
                    o.gpu_type not in group
                    or not o.reachable
                    or (o.kind is CapacityKind.SPOT and not gang.allow_spot)
                    or not self._may(gang, o.cluster)
                ):
                    continue
                if fit_replicas(shape, o.sizes) is None:
                    continue
                events = []
                for r, s in self._located(o):
                    if r.job_id in self.victim_ends:
                        end: float | None = self.victim_ends[r.job_id]
                    elif r.terminating:
                        end = self.now + self.policy.default_grace_period_s
                    else:
                        end = None if r.ends_at_s is None else max(r.ends_at_s, self.now)
                    if end is not None:
                        events.append((end, r.job_id, s))
                nodes = list(o.nodes)
                for end, _, s in sorted(events, key=lambda e: (e[0], e[1])):
                    nodes = _freed(nodes, [s])
                    taken = fit_replicas(shape, nodes)
                    if taken is not None:
                        key = (end, ctx.cost(o.gpu_type, o.factor, o.store), o.key())
                        if best is None or key < best[0]:
                            best = (key, o, [n - t for n, t in zip(nodes, taken, strict=True)])
                        break
        if best is not None:
            self.hold = (best[1], best[0][0], best[2])


def _freed(nodes: list[int], shares: list[list[tuple[int, int]]] | list[tuple[int, int]]) -> list[int]:
    out = list(nodes)
    for item in shares:
        for index, gpus in item if isinstance(item, list) else [item]:
            out[index] += gpus
    return out
