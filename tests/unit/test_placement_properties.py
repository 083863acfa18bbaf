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

import itertools
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

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
from placement.stretch_carry import PlanCarry
from tests.properties import examples
from tests.unit.placement_builders import SkipsOneItemSamples, shuffled

SETTINGS = settings(max_examples=examples(120), deadline=None)
TYPES = [GpuType("A100"), GpuType("H100")]
TEAMS = [TenantId("t1"), TenantId("t2"), TenantId("t3")]
ORG = TenantId("org")
NOW = 1000.0
CLASSES = (PriorityClass("urgent", 3, preemptible=False, needs_approval=True), PriorityClass("batch", 0))
KINDS = [CapacityKind.PRIVATE, CapacityKind.PRIVATE, CapacityKind.ON_DEMAND, CapacityKind.SPOT]
SHAPES = [(8,), (4,), (4, 4), (8, 8), (2, 2, 2), (8, 8, 8), (1, 8)]
OPTIONAL_LIMITS = [None, None, 0, 8, 16, 32]
MOSTLY_FALSE = [False, False, False, True]
MOSTLY_TRUE = [True, True, True, False]
MAX_PRIORITIES = [None, None, None, 2]
PRIORITIES = [0, 1, 2, 3]
QUEUE_TIMES = [float(t) for t in range(10)]
# Both orders of both types: the order of a gang's types matters to the ordered policy.
TYPE_LISTS = [(TYPES[0],), (TYPES[1],), tuple(TYPES), tuple(reversed(TYPES))]


def one_of_each(*fields: Sequence[object]) -> st.SearchStrategy[tuple[Any, ...]]:
    """A value for each field in one draw, from every combination built once at import.

    Hypothesis's cost is per draw, not per value: one draw of an index into the product replaces one
    draw per field. Each field keeps its weights (its list repeats the values it favours), and shrinking
    the index moves the first field first, as shrinking separate draws in order would.
    """
    return st.sampled_from(list(itertools.product(*fields)))


# Every strategy is built once, here: a new `sampled_from` or `lists` per draw, validated and labelled
# anew each time, cost more than the draws themselves.
QUOTA_TYPES = st.sampled_from([(), *TYPE_LISTS])
QUOTA_OF = {
    gpu_type: st.sampled_from(
        [
            GpuQuota(gpu_type, guaranteed, borrowing_limit_gpus=borrow, lending_limit_gpus=lend, cap_gpus=cap)
            for guaranteed, borrow, lend, cap in itertools.product(
                [0, 8, 16, 24], OPTIONAL_LIMITS, OPTIONAL_LIMITS, [None, None, 16, 32]
            )
        ]
    )
    for gpu_type in TYPES
}
# weight, monthly budget, spent GPU hours, max priority
TENANT_TERMS = one_of_each([1.0, 2.0], [None, None, None, 10.0], [0.0, 20.0], MAX_PRIORITIES)
CLUSTER_COUNT = st.integers(1, 3)
POOL_COUNT = st.integers(1, 2)
A_NODE_SIZE = st.sampled_from([4, 8, 8])
NODE_COUNT = st.integers(1, 4)
GANGS_ON_A_NODE = st.integers(0, 2)
# A running gang's GPUs, whether it is terminating, and the queued gang an outstanding order evicts it
# for (j0, j1 or one gone; read only when it is terminating).
RUNNING_START = one_of_each([2, 4, 8], MOSTLY_FALSE, [None, JobId("j0"), JobId("j1"), JobId("gone")])
# tenant, priority, preemptible, queued_at_s, ends_at_s
RUNNING_TERMS = one_of_each(TEAMS, PRIORITIES, MOSTLY_TRUE, QUEUE_TIMES, [None, NOW + 50, NOW + 500])
# kind, GPU type, price
POOL_TERMS = one_of_each(KINDS, TYPES, [1.0, 2.0])
SCALABLE_COUNT = st.integers(0, 1)
A_TYPE = st.sampled_from(TYPES)
SCALABLE_NODES = st.integers(1, 3)
# urgent, tenant, priority (read unless urgent), queued_at_s
GANG_WHO = one_of_each(MOSTLY_FALSE, TEAMS, PRIORITIES, QUEUE_TIMES)
# replica GPUs, GPU types, type policy, allow spot
GANG_WHAT = one_of_each(SHAPES, TYPE_LISTS, list(GpuTypePolicy), [False, True])
# max runtime, approval expiry, deadline, user's max priority
GANG_LIMITS = one_of_each(
    [0, 100, 3600], [None, NOW - 1, NOW + 1], [None, None, None, NOW + 1800, NOW + 7200], MAX_PRIORITIES
)
POLICIES = st.sampled_from(
    [
        PolicyConfig(
            preemption_limit_gpus=limit,
            preempted_gpus_this_interval=preempted,
            backfill=backfill,
            private_wait_s_per_gpu_hour=wait,
        )
        for limit, preempted, backfill, wait in itertools.product(
            [None, None, 8, 16], [0, 0, 4], [False, True], [0.0, 0.0, 600.0]
        )
    ]
)


@st.composite
def quotas(draw: st.DrawFn, tenant: TenantId, parent: TenantId | None) -> TenantQuota:
    gpu_quotas = tuple(draw(QUOTA_OF[gpu_type]) for gpu_type in draw(QUOTA_TYPES))
    weight, budget, spent, max_priority = draw(TENANT_TERMS)
    return TenantQuota(
        tenant=tenant,
        parent=parent,
        quotas=gpu_quotas,
        weight=weight,
        monthly_budget_gpu_hours=budget,
        spent_gpu_hours=spent,
        max_priority=max_priority,
    )


TENANT_QUOTAS = st.tuples(quotas(ORG, None), *(quotas(t, ORG if t != "t3" else None) for t in TEAMS))


@st.composite
def layout(draw: st.DrawFn) -> tuple[list[ClusterState], list[RunningGang]]:
    """Gangs sit on known nodes of each pool; each is built once, when its pool's GPU type is drawn."""
    clusters: list[ClusterState] = []
    running: list[RunningGang] = []
    for c in range(draw(CLUSTER_COUNT)):
        name = ClusterName(f"c{c}")
        pools = []
        for p in range(draw(POOL_COUNT)):
            pool_name = f"p{p}"
            size = draw(A_NODE_SIZE)
            free = []
            drawn = []  # (node, gpus, terminating, evicted_for, the gang's other terms), in order
            for node in range(draw(NODE_COUNT)):
                left = size
                for _ in range(draw(GANGS_ON_A_NODE)):
                    wanted, terminating, ordered = draw(RUNNING_START)
                    gpus = min(left, wanted)
                    if gpus == 0:
                        break
                    left -= gpus
                    drawn.append(
                        (node, gpus, terminating, ordered if terminating else None, draw(RUNNING_TERMS))
                    )
                free.append(left)
            kind, gpu_type, price = draw(POOL_TERMS)
            first = len(running)  # ids by position in the whole layout, so unique
            running.extend(
                RunningGang(
                    job_id=JobId(f"r{first + i}"),
                    tenant=tenant,
                    priority=priority,
                    cluster=name,
                    gpu_type=gpu_type,
                    gpu_count=gpus,
                    preemptible=preemptible,
                    queued_at_s=queued_at_s,
                    ends_at_s=ends_at_s,
                    nodes=(NodeShare(pool_name, node, gpus),),
                    terminating=terminating,
                    evicted_for=evicted_for,
                )
                for i, (
                    node,
                    gpus,
                    terminating,
                    evicted_for,
                    (tenant, priority, preemptible, queued_at_s, ends_at_s),
                ) in enumerate(drawn)
            )
            pools.append(NodePool(pool_name, gpu_type, kind, price, size, tuple(free)))
        scalable = tuple(
            ScalablePool("grow", draw(A_TYPE), CapacityKind.ON_DEMAND, 3.0, 8, 0, draw(SCALABLE_NODES))
            for _ in range(draw(SCALABLE_COUNT))
        )
        clusters.append(ClusterState(name, Provider.PRIVATE, "r", tuple(pools), scalable_pools=scalable))
    return clusters, running


@st.composite
def gangs(draw: st.DrawFn, index: int) -> GangRequest:
    urgent, tenant, priority, queued_at_s = draw(GANG_WHO)
    replica_gpus, gpu_types, gpu_type_policy, allow_spot = draw(GANG_WHAT)
    max_runtime_s, approval_expires_at_s, deadline_at_s, user_max_priority = draw(GANG_LIMITS)
    return GangRequest(
        job_id=JobId(f"j{index}"),
        tenant=tenant,
        priority=3 if urgent else priority,
        queued_at_s=queued_at_s,
        replica_gpus=replica_gpus,
        gpu_types=gpu_types,
        gpu_type_policy=gpu_type_policy,
        allow_spot=allow_spot,
        max_runtime_s=max_runtime_s,
        priority_class="urgent" if urgent else "",
        approval_expires_at_s=approval_expires_at_s,
        deadline_at_s=deadline_at_s,
        user_max_priority=user_max_priority,
    )


LAYOUT = layout()
# One strategy per queue position, built once: job ids are given by position.
QUEUED = [gangs(i) for i in range(6)]


@st.composite
def snapshots(draw: st.DrawFn, max_queue: int = 6) -> Snapshot:
    clusters, running = draw(LAYOUT)
    tenants = draw(TENANT_QUOTAS)
    queue = [draw(QUEUED[i]) for i in range(draw(st.integers(1, max_queue)))]
    return Snapshot(
        tuple(queue),
        tuple(running),
        tenants,
        tuple(clusters),
        priority_classes=CLASSES,
        policy=draw(POLICIES),
    )


def limits(snapshot: Snapshot) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
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
    for request, gpu_type in added_by_plan(snapshot, result):
        for node in path(snapshot, request.tenant):
            new[(node, gpu_type)] += request.gpu_count
            quota = tenants[TenantId(node)]
            budget = quota.monthly_budget_gpu_hours
            assert budget is None or quota.spent_gpu_hours < budget, (
                f"{request.job_id}: budget of {node} is spent"
            )
        tenant = tenants[request.tenant]
        assert tenant.max_priority is None or request.priority <= tenant.max_priority
        assert request.user_max_priority is None or request.priority <= request.user_max_priority
        if request.priority_class == "urgent":
            assert request.approval_expires_at_s is not None
            assert request.approval_expires_at_s > NOW
    # An approved class makes room under its tenant's cap by evicting the tenant's own gangs: what it
    # adds is judged once they are gone.
    for p in result.preemptions:
        if p.reason is PreemptionReason.TENANT_CAP:
            for node in path(snapshot, p.tenant):
                held[(node, p.gpu_type)] -= p.gpu_count
    for key, limit in limits(snapshot).items():
        assert new[key] == 0 or held[key] + new[key] <= limit, f"{key}: {held[key]} + {new[key]} > {limit}"


Offer = tuple[ClusterName, GpuType, CapacityKind, float]


def offer_nodes(snapshot: Snapshot) -> dict[Offer, list[int]]:
    nodes: dict[Offer, list[int]] = {}
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
    used: Counter[Offer] = Counter()
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
    for request, gpu_type in added_by_plan(snapshot, result):
        added[(request.tenant, gpu_type)] += request.gpu_count
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
    offsets: dict[str, int] = {}
    nodes: list[int] = []
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
    assert plan(shuffled(snapshot, SkipsOneItemSamples(rng)), now=NOW) == expected


@SETTINGS
@given(snapshots(), st.randoms(use_true_random=False))
def test_a_plan_given_the_last_plans_carry_is_the_plan_made_afresh(
    snapshot: Snapshot, rng: random.Random
) -> None:
    """`placement.stretch_carry`: what one plan keeps changes no later plan, over the same snapshot in
    another order, or over a queue with a gang gone."""
    carry = PlanCarry()
    expected = plan(snapshot, now=NOW)
    assert plan(snapshot, now=NOW, carry=carry) == expected
    assert plan(shuffled(snapshot, SkipsOneItemSamples(rng)), now=NOW, carry=carry) == expected
    fewer = replace(snapshot, queued=snapshot.queued[1:])
    assert plan(fewer, now=NOW, carry=carry) == plan(fewer, now=NOW)


A100 = GpuType("A100")
CAPPED_NODE_COUNT = st.integers(2, 5)
MOSTLY_THE_CAPPED_TEAM = [TEAMS[0], TEAMS[0], TEAMS[1]]
# A gang's GPUs, and the queued gang it is ordered out for: some are leaving already (their tenant's own
# victims of an earlier cycle).
CAPPED_RUNNING_START = one_of_each([4, 8], [None, None, None, JobId("j0"), JobId("j1")])
# tenant, priority, preemptible, queued_at_s
CAPPED_RUNNING_TERMS = one_of_each(MOSTLY_THE_CAPPED_TEAM, PRIORITIES, [True, True, False], QUEUE_TIMES)
# The capped tenant (its guarantee and cap of A100) and one without quotas.
CAPPED_TENANTS = st.sampled_from(
    [
        (
            TenantQuota(TEAMS[0], quotas=(GpuQuota(A100, guaranteed_gpus=guaranteed, cap_gpus=cap),)),
            TenantQuota(TEAMS[1]),
        )
        for cap, guaranteed in itertools.product([8, 16, 24], [0, 8])
    ]
)
CAPPED_QUEUE_LENGTH = st.integers(1, 4)
# urgent, tenant, priority (read unless urgent), replica GPUs, approval expiry
CAPPED_GANG = one_of_each(
    [False, True], MOSTLY_THE_CAPPED_TEAM, PRIORITIES, [(4,), (8,), (8, 8)], [None, NOW - 1, NOW + 1, NOW + 1]
)
CAPPED_POLICIES = st.sampled_from([PolicyConfig(preemption_limit_gpus=limit) for limit in [None, None, 8]])


@st.composite
def capped_tenant(draw: st.DrawFn) -> Snapshot:
    """One tenant near its cap of A100, its own gangs of mixed priorities on known nodes, another
    tenant's gangs beside them, and a queue where some gangs are of the approved urgent class."""
    nodes = draw(CAPPED_NODE_COUNT)
    free: list[int] = []
    running: list[RunningGang] = []
    for node in range(nodes):
        left = 8
        for _ in range(draw(GANGS_ON_A_NODE)):
            wanted, ordered = draw(CAPPED_RUNNING_START)
            gpus = min(left, wanted)
            if gpus == 0:
                break
            left -= gpus
            tenant, priority, preemptible, queued_at_s = draw(CAPPED_RUNNING_TERMS)
            running.append(
                RunningGang(
                    job_id=JobId(f"r{len(running)}"),
                    terminating=ordered is not None,
                    evicted_for=ordered,
                    tenant=tenant,
                    priority=priority,
                    cluster=ClusterName("c0"),
                    gpu_type=A100,
                    gpu_count=gpus,
                    preemptible=preemptible,
                    queued_at_s=queued_at_s,
                    nodes=(NodeShare("p0", node, gpus),),
                )
            )
        free.append(left)
    pool = NodePool("p0", A100, CapacityKind.PRIVATE, 1.0, 8, tuple(free))
    cluster = ClusterState(ClusterName("c0"), Provider.PRIVATE, "r", (pool,))
    tenants = draw(CAPPED_TENANTS)
    queue = []
    for i in range(draw(CAPPED_QUEUE_LENGTH)):
        urgent, tenant, priority, replica_gpus, approval_expires_at_s = draw(CAPPED_GANG)
        queue.append(
            GangRequest(
                job_id=JobId(f"j{i}"),
                tenant=tenant,
                priority=3 if urgent else priority,
                queued_at_s=float(i),
                replica_gpus=replica_gpus,
                gpu_types=(A100,),
                priority_class="urgent" if urgent else "",
                approval_expires_at_s=approval_expires_at_s,
            )
        )
    return Snapshot(
        tuple(queue),
        tuple(running),
        tenants,
        (cluster,),
        priority_classes=CLASSES,
        policy=draw(CAPPED_POLICIES),
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
