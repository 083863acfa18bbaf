"""Invariants of the full policy over random snapshots with tenant trees, quotas, budgets, priority
classes, running gangs on known nodes (so preemption and backfill have work), scalable pools and deadlines.

- every queued job is admitted once or waits with reasons;
- no cap or borrowing limit is passed by what the plan adds, and no gate is bypassed;
- a gang is admitted whole, on one cluster and GPU type it accepts, where it fits;
- only lower priorities (same tenant) or borrowers (for a tenant within its guarantee) are preempted,
  and a tenant's own gangs give way to its cap only for its approved higher priority;
- every evicted gang is needed, and eviction stays within the per-interval limit;
- the same snapshot, in any order, gives the same plan.
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.fit import fit_replicas
from placement.model import (
    CapacityKind,
    ClusterName,
    ClusterState,
    GangRequest,
    GpuQuota,
    GpuType,
    GpuTypePolicy,
    JobId,
    NodePool,
    NodeShare,
    Plan,
    PolicyConfig,
    PreemptionReason,
    PriorityClass,
    Provider,
    RunningGang,
    ScalablePool,
    Snapshot,
    TenantId,
    TenantQuota,
    WaitCode,
)
from placement.plan import plan
from tests.properties import examples
from tests.unit.placement_builders import shuffled

SETTINGS = settings(max_examples=examples(120), deadline=None)
TYPES = [GpuType("A100"), GpuType("H100")]
TEAMS = [TenantId("t1"), TenantId("t2"), TenantId("t3")]
ORG = TenantId("org")
NOW = 1000.0
CLASSES = (PriorityClass("urgent", 3, preemptible=False, needs_approval=True), PriorityClass("batch", 0))
KINDS = [CapacityKind.PRIVATE, CapacityKind.PRIVATE, CapacityKind.ON_DEMAND, CapacityKind.SPOT]
SHAPES = st.sampled_from([(8,), (4,), (4, 4), (8, 8), (2, 2, 2), (8, 8, 8), (1, 8)])
OPTIONAL_LIMIT = st.sampled_from([None, None, 0, 8, 16, 32])


@st.composite
def quotas(draw: st.DrawFn, tenant: TenantId, parent: TenantId | None) -> TenantQuota:
    return TenantQuota(
        tenant=tenant,
        parent=parent,
        quotas=tuple(
            GpuQuota(
                gpu_type,
                guaranteed_gpus=draw(st.sampled_from([0, 8, 16, 24])),
                borrowing_limit_gpus=draw(OPTIONAL_LIMIT),
                lending_limit_gpus=draw(OPTIONAL_LIMIT),
                cap_gpus=draw(st.sampled_from([None, None, 16, 32])),
            )
            for gpu_type in draw(st.lists(st.sampled_from(TYPES), unique=True, max_size=2))
        ),
        weight=draw(st.sampled_from([1.0, 2.0])),
        monthly_budget_gpu_hours=draw(st.sampled_from([None, None, None, 10.0])),
        spent_gpu_hours=draw(st.sampled_from([0.0, 20.0])),
        max_priority=draw(st.sampled_from([None, None, None, 2])),
    )


@st.composite
def layout(draw: st.DrawFn) -> tuple[list[ClusterState], list[RunningGang]]:
    clusters, running = [], []
    for c in range(draw(st.integers(1, 3))):
        name = ClusterName(f"c{c}")
        pools = []
        for p in range(draw(st.integers(1, 2))):
            pool_name = f"p{p}"
            size = draw(st.sampled_from([4, 8, 8]))
            free = []
            for node in range(draw(st.integers(1, 4))):
                left = size
                for _ in range(draw(st.integers(0, 2))):
                    gpus = min(left, draw(st.sampled_from([2, 4, 8])))
                    if gpus == 0:
                        break
                    left -= gpus
                    terminating = draw(st.sampled_from([False, False, False, True]))
                    # An outstanding order names the queued gang it evicts for (j0, j1 or one gone).
                    ordered = draw(st.sampled_from([None, JobId("j0"), JobId("j1"), JobId("gone")]))
                    running.append(
                        RunningGang(
                            job_id=JobId("r"),
                            tenant=draw(st.sampled_from(TEAMS)),
                            priority=draw(st.integers(0, 3)),
                            cluster=name,
                            gpu_type=GpuType("?"),  # set below, once the pool's type is drawn
                            gpu_count=gpus,
                            preemptible=draw(st.sampled_from([True, True, True, False])),
                            queued_at_s=float(draw(st.integers(0, 9))),
                            ends_at_s=draw(st.sampled_from([None, NOW + 50, NOW + 500])),
                            nodes=(NodeShare(pool_name, node, gpus),),
                            terminating=terminating,
                            evicted_for=ordered if terminating else None,
                        )
                    )
                free.append(left)
            kind = draw(st.sampled_from(KINDS))
            gpu_type = draw(st.sampled_from(TYPES))
            running = [
                r
                if r.cluster != name or r.nodes[0].pool != pool_name or r.gpu_type != "?"
                else RunningGang(
                    **{**{f: getattr(r, f) for f in r.__dataclass_fields__}, "gpu_type": gpu_type}
                )
                for r in running
            ]
            pools.append(
                NodePool(pool_name, gpu_type, kind, draw(st.sampled_from([1.0, 2.0])), size, tuple(free))
            )
        scalable = tuple(
            ScalablePool(
                "grow",
                draw(st.sampled_from(TYPES)),
                CapacityKind.ON_DEMAND,
                3.0,
                8,
                0,
                draw(st.integers(1, 3)),
            )
            for _ in range(draw(st.integers(0, 1)))
        )
        clusters.append(ClusterState(name, Provider.PRIVATE, "r", tuple(pools), scalable_pools=scalable))
    running = [
        RunningGang(**{**{f: getattr(r, f) for f in r.__dataclass_fields__}, "job_id": JobId(f"r{i}")})
        for i, r in enumerate(running)
    ]
    return clusters, running


@st.composite
def gangs(draw: st.DrawFn, index: int) -> GangRequest:
    urgent = draw(st.sampled_from([False, False, False, True]))
    return GangRequest(
        job_id=JobId(f"j{index}"),
        tenant=draw(st.sampled_from(TEAMS)),
        priority=3 if urgent else draw(st.integers(0, 3)),
        queued_at_s=float(draw(st.integers(0, 9))),
        replica_gpus=draw(SHAPES),
        gpu_types=tuple(draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=2, unique=True))),
        gpu_type_policy=draw(st.sampled_from(list(GpuTypePolicy))),
        allow_spot=draw(st.booleans()),
        max_runtime_s=draw(st.sampled_from([0, 100, 3600])),
        priority_class="urgent" if urgent else "",
        approval_expires_at_s=draw(st.sampled_from([None, NOW - 1, NOW + 1])),
        deadline_at_s=draw(st.sampled_from([None, None, None, NOW + 1800, NOW + 7200])),
        user_max_priority=draw(st.sampled_from([None, None, None, 2])),
    )


@st.composite
def snapshots(draw: st.DrawFn, max_queue: int = 6) -> Snapshot:
    clusters, running = draw(layout())
    tenants = [draw(quotas(ORG, None))] + [draw(quotas(t, ORG if t != "t3" else None)) for t in TEAMS]
    queue = [draw(gangs(i)) for i in range(draw(st.integers(1, max_queue)))]
    policy = PolicyConfig(
        preemption_limit_gpus=draw(st.sampled_from([None, None, 8, 16])),
        preempted_gpus_this_interval=draw(st.sampled_from([0, 0, 4])),
        backfill=draw(st.booleans()),
        private_wait_s_per_gpu_hour=draw(st.sampled_from([0.0, 0.0, 600.0])),
    )
    return Snapshot(
        tuple(queue), tuple(running), tuple(tenants), tuple(clusters), priority_classes=CLASSES, policy=policy
    )


def limits(snapshot: Snapshot) -> dict[tuple[str, str], int]:
    out = {}
    for tenant in snapshot.tenants:
        for gpu_type in TYPES:
            bounds = [tenant.cap_for(gpu_type)]
            quota = tenant.quota_for(gpu_type)
            if quota is not None and quota.borrowing_limit_gpus is not None:
                bounds.append(quota.guaranteed_gpus + quota.borrowing_limit_gpus)
            known = [b for b in bounds if b is not None]
            if known:
                out[(tenant.tenant, gpu_type)] = min(known)
    return out


def path(snapshot: Snapshot, tenant: str) -> list[str]:
    parents = {t.tenant: t.parent for t in snapshot.tenants}
    out = [tenant]
    while parents.get(TenantId(out[-1])) is not None:
        out.append(str(parents[TenantId(out[-1])]))
    return out


def added_by_plan(snapshot: Snapshot, result: Plan) -> list[tuple[GangRequest, str]]:
    """Every gang the plan commits capacity to this cycle, with its GPU type."""
    gangs = {g.job_id: g for g in snapshot.queued}
    added = [(gangs[a.job_id], str(a.gpu_type)) for a in result.admissions]
    added += [(gangs[r.job_ids[0]], str(r.gpu_type)) for r in result.capacity_requests]
    for job_id in dict.fromkeys(p.for_job for p in result.preemptions):
        gpu_type = next(p.gpu_type for p in result.preemptions if p.for_job == job_id)
        added.append((gangs[job_id], str(gpu_type)))
    return added


@SETTINGS
@given(snapshots())
def test_each_job_once_and_waiting_jobs_have_reasons(snapshot: Snapshot) -> None:
    result = plan(snapshot, now=NOW)
    decided = [a.job_id for a in result.admissions] + [w.job_id for w in result.waiting]
    assert sorted(decided) == sorted(g.job_id for g in snapshot.queued)
    assert all(w.reasons for w in result.waiting)


@SETTINGS
@given(snapshots())
def test_no_cap_or_borrowing_limit_is_passed_and_no_gate_bypassed(snapshot: Snapshot) -> None:
    check_caps_and_gates(snapshot)


def check_caps_and_gates(snapshot: Snapshot) -> None:
    result = plan(snapshot, now=NOW)
    held: Counter[tuple[str, str]] = Counter()
    for gang in snapshot.running:
        for node in path(snapshot, gang.tenant):
            held[(node, gang.gpu_type)] += gang.gpu_count
    new: Counter[tuple[str, str]] = Counter()
    tenants = {t.tenant: t for t in snapshot.tenants}
    for gang, gpu_type in added_by_plan(snapshot, result):
        for node in path(snapshot, gang.tenant):
            new[(node, gpu_type)] += gang.gpu_count
            quota = tenants[TenantId(node)]
            budget = quota.monthly_budget_gpu_hours
            assert budget is None or quota.spent_gpu_hours < budget, (
                f"{gang.job_id}: budget of {node} is spent"
            )
        tenant = tenants[gang.tenant]
        assert tenant.max_priority is None or gang.priority <= tenant.max_priority
        assert gang.user_max_priority is None or gang.priority <= gang.user_max_priority
        if gang.priority_class == "urgent":
            assert gang.approval_expires_at_s is not None
            assert gang.approval_expires_at_s > NOW
    # An approved class makes room under its tenant's cap by evicting the tenant's own gangs: what it
    # adds is judged once they are gone.
    for p in result.preemptions:
        if p.reason is PreemptionReason.TENANT_CAP:
            for node in path(snapshot, p.tenant):
                held[(node, p.gpu_type)] -= p.gpu_count
    for key, limit in limits(snapshot).items():
        assert new[key] == 0 or held[key] + new[key] <= limit, f"{key}: {held[key]} + {new[key]} > {limit}"


def offer_nodes(snapshot: Snapshot) -> dict[tuple[str, str, CapacityKind, float], list[int]]:
    nodes: dict[tuple[str, str, CapacityKind, float], list[int]] = {}
    for cluster in snapshot.clusters:
        for pool in sorted(cluster.pools, key=lambda p: p.name):
            key = (cluster.name, pool.gpu_type, pool.kind, pool.usd_per_gpu_hour)
            nodes.setdefault(key, []).extend(pool.free_gpus_per_node)
    return nodes


@SETTINGS
@given(snapshots())
def test_gangs_are_admitted_whole_on_one_cluster_where_they_fit(snapshot: Snapshot) -> None:
    result = plan(snapshot, now=NOW)
    gangs = {g.job_id: g for g in snapshot.queued}
    free = offer_nodes(snapshot)
    replay = {key: list(nodes) for key, nodes in free.items()}
    for admission in result.admissions:
        gang = gangs[admission.job_id]
        assert admission.gpu_type in gang.gpu_types
        assert gang.allow_spot or admission.kind is not CapacityKind.SPOT
        key = (admission.cluster, admission.gpu_type, admission.kind, admission.usd_per_gpu_hour)
        assert fit_replicas(gang.replica_gpus, free[key]) is not None, "does not fit where it was admitted"
        if not result.preemptions:
            # No capacity was held for preemptors: the admissions replay node by node, in order.
            taken = fit_replicas(gang.replica_gpus, replay[key])
            assert taken is not None, f"{gang.job_id} does not fit after the admissions before it"
            replay[key] = [f - t for f, t in zip(replay[key], taken, strict=True)]
    used: Counter[tuple[str, str, CapacityKind, float]] = Counter()
    for admission in result.admissions:
        used[(admission.cluster, admission.gpu_type, admission.kind, admission.usd_per_gpu_hour)] += gangs[
            admission.job_id
        ].gpu_count
    for key, gpus in used.items():
        assert gpus <= sum(free[key])


@SETTINGS
@given(snapshots())
def test_only_lower_priorities_or_borrowers_are_preempted_within_the_limit(snapshot: Snapshot) -> None:
    check_preemptions(snapshot)


def check_preemptions(snapshot: Snapshot) -> None:
    result = plan(snapshot, now=NOW)
    running = {r.job_id: r for r in snapshot.running}
    gangs = {g.job_id: g for g in snapshot.queued}
    tenants = {t.tenant: t for t in snapshot.tenants}
    held: Counter[tuple[str, str]] = Counter()
    for gang in snapshot.running:
        held[(gang.tenant, gang.gpu_type)] += gang.gpu_count
    # A victim's tenant is judged on what it holds at the preemptor's turn, which may include gangs
    # admitted earlier in the cycle: bound that by everything the plan adds for it.
    added: Counter[tuple[str, str]] = Counter()
    for gang, gpu_type in added_by_plan(snapshot, result):
        added[(gang.tenant, gpu_type)] += gang.gpu_count
    evicted: Counter[tuple[str, str]] = Counter()
    victims = [p.victim for p in result.preemptions]
    assert len(victims) == len(set(victims))

    def guaranteed(tenant: str, gpu_type: str) -> int:
        quota = tenants[TenantId(tenant)].quota_for(GpuType(gpu_type))
        return 0 if quota is None else quota.guaranteed_gpus

    for p in result.preemptions:
        victim, preemptor = running[p.victim], gangs[p.for_job]
        assert victim.preemptible
        assert not victim.terminating
        assert (p.gpu_count, p.requeue_queued_at_s) == (victim.gpu_count, victim.queued_at_s)
        if p.reason is PreemptionReason.LOWER_PRIORITY:
            assert victim.tenant == preemptor.tenant
            assert victim.priority < preemptor.priority
        elif p.reason is PreemptionReason.TENANT_CAP:
            # A tenant's own gangs give way to its cap only for its approved higher priority.
            assert victim.tenant == preemptor.tenant
            assert victim.priority < preemptor.priority
            assert preemptor.priority_class == "urgent"
            assert preemptor.approval_expires_at_s is not None
            assert preemptor.approval_expires_at_s > NOW
        else:
            assert victim.tenant != preemptor.tenant
            key = (victim.tenant, victim.gpu_type)
            assert held[key] + added[key] - evicted[key] > guaranteed(*key), (
                "victim's tenant was not borrowing"
            )
            own = (preemptor.tenant, victim.gpu_type)
            assert held[own] + preemptor.gpu_count <= guaranteed(*own), "preemptor was beyond its guarantee"
            evicted[key] += victim.gpu_count
        (waiting,) = [w for w in result.waiting if w.job_id == p.for_job]
        assert waiting.reasons[-1].code is WaitCode.PREEMPTING
    limit = snapshot.policy.preemption_limit_gpus
    total = sum(p.gpu_count for p in result.preemptions)
    assert limit is None or total == 0 or snapshot.policy.preempted_gpus_this_interval + total <= limit


@SETTINGS
@given(snapshots(max_queue=1))
def test_every_evicted_gang_is_needed(snapshot: Snapshot) -> None:
    """With one queued gang the state at its turn is the snapshot, so need can be checked exactly."""
    result = plan(snapshot, now=NOW)
    if not result.preemptions or any(p.reason is PreemptionReason.TENANT_CAP for p in result.preemptions):
        return  # victims under a cap are needed for the quota, not the fit (tests/unit/test_placement_cap_preempt.py)
    (gang,) = snapshot.queued
    running = {r.job_id: r for r in snapshot.running}
    first = result.preemptions[0]
    pools = {p.name: p for c in snapshot.clusters if c.name == first.cluster for p in c.pools}
    victim_pool = pools[running[first.victim].nodes[0].pool]
    offer = (victim_pool.gpu_type, victim_pool.kind, victim_pool.usd_per_gpu_hour)
    # The offer's node list: its pools in name order, as the placer concatenates them.
    offsets, nodes = {}, []
    for name in sorted(pools):
        if (pools[name].gpu_type, pools[name].kind, pools[name].usd_per_gpu_hour) == offer:
            offsets[name] = len(nodes)
            nodes.extend(pools[name].free_gpus_per_node)

    def freed(gangs: list[RunningGang]) -> list[int]:
        out = list(nodes)
        for g in gangs:
            for share in g.nodes:
                out[offsets[share.pool] + share.node_index] += share.gpus
        return out

    victims = [running[p.victim] for p in result.preemptions]
    draining = [
        r
        for r in snapshot.running
        if r.terminating and all(n.pool in offsets for n in r.nodes) and r.cluster == first.cluster
    ]
    assert fit_replicas(gang.replica_gpus, freed(victims + draining)) is not None
    for victim in victims:
        rest = [v for v in victims if v is not victim]
        assert fit_replicas(gang.replica_gpus, freed(rest + draining)) is None, (
            f"{victim.job_id} was not needed"
        )


@SETTINGS
@given(snapshots())
def test_no_one_more_is_evicted_for_a_gang_whose_ordered_victims_are_still_leaving(
    snapshot: Snapshot,
) -> None:
    check_no_more_victims_while_some_leave(snapshot)


def check_no_more_victims_while_some_leave(snapshot: Snapshot) -> None:
    result = plan(snapshot, now=NOW)
    awaited = {r.evicted_for for r in snapshot.running if r.terminating and r.evicted_for is not None}
    for p in result.preemptions:
        assert p.for_job not in awaited, f"{p.victim} evicted again for {p.for_job}"


@SETTINGS
@given(snapshots(), st.randoms(use_true_random=False))
def test_the_same_snapshot_in_any_order_gives_the_same_plan(snapshot: Snapshot, rng: random.Random) -> None:
    expected = plan(snapshot, now=NOW)
    assert plan(snapshot, now=NOW) == expected
    assert plan(shuffled(snapshot, rng), now=NOW) == expected


@st.composite
def capped_tenant(draw: st.DrawFn) -> Snapshot:
    """One tenant near its cap of A100, its own gangs of mixed priorities on known nodes, another
    tenant's gangs beside them, and a queue where some gangs are of the approved urgent class."""
    a100 = GpuType("A100")
    nodes = draw(st.integers(2, 5))
    free: list[int] = []
    running: list[RunningGang] = []
    for node in range(nodes):
        left = 8
        for _ in range(draw(st.integers(0, 2))):
            gpus = min(left, draw(st.sampled_from([4, 8])))
            if gpus == 0:
                break
            left -= gpus
            # Some are leaving already, ordered out for a queued gang (its own victims of an earlier cycle).
            ordered = draw(st.sampled_from([None, None, None, JobId("j0"), JobId("j1")]))
            running.append(
                RunningGang(
                    job_id=JobId(f"r{len(running)}"),
                    terminating=ordered is not None,
                    evicted_for=ordered,
                    tenant=draw(st.sampled_from([TEAMS[0], TEAMS[0], TEAMS[1]])),
                    priority=draw(st.integers(0, 3)),
                    cluster=ClusterName("c0"),
                    gpu_type=a100,
                    gpu_count=gpus,
                    preemptible=draw(st.sampled_from([True, True, False])),
                    queued_at_s=float(draw(st.integers(0, 9))),
                    nodes=(NodeShare("p0", node, gpus),),
                )
            )
        free.append(left)
    pool = NodePool("p0", a100, CapacityKind.PRIVATE, 1.0, 8, tuple(free))
    cluster = ClusterState(ClusterName("c0"), Provider.PRIVATE, "r", (pool,))
    cap = draw(st.sampled_from([8, 16, 24]))
    tenants = (
        TenantQuota(
            TEAMS[0], quotas=(GpuQuota(a100, guaranteed_gpus=draw(st.sampled_from([0, 8])), cap_gpus=cap),)
        ),
        TenantQuota(TEAMS[1]),
    )
    queue = []
    for i in range(draw(st.integers(1, 4))):
        urgent = draw(st.booleans())
        queue.append(
            GangRequest(
                job_id=JobId(f"j{i}"),
                tenant=draw(st.sampled_from([TEAMS[0], TEAMS[0], TEAMS[1]])),
                priority=3 if urgent else draw(st.integers(0, 3)),
                queued_at_s=float(i),
                replica_gpus=draw(st.sampled_from([(4,), (8,), (8, 8)])),
                gpu_types=(a100,),
                priority_class="urgent" if urgent else "",
                approval_expires_at_s=draw(st.sampled_from([None, NOW - 1, NOW + 1, NOW + 1])),
            )
        )
    policy = PolicyConfig(preemption_limit_gpus=draw(st.sampled_from([None, None, 8])))
    return Snapshot(
        tuple(queue), tuple(running), tenants, (cluster,), priority_classes=CLASSES, policy=policy
    )


@SETTINGS
@given(capped_tenant())
def test_an_approved_class_evicts_only_its_own_lower_priorities_and_stays_under_the_cap(
    snapshot: Snapshot,
) -> None:
    """Issue 30 item 4: the cap is never passed once the victims are gone, only the tenant's own
    lower-priority gangs are evicted for it, and only for an approved class."""
    check_caps_and_gates(snapshot)
    check_preemptions(snapshot)
    check_no_more_victims_while_some_leave(snapshot)
