"""Invariants of the placer over random small snapshots.

The checks replay a plan against the snapshot with the node-list `fit_replicas`, independently of the
histograms the placer works on, so they also catch the two disagreeing.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.fit import fit_replicas
from placement.model import (
    Admission,
    CapacityKind,
    ClusterName,
    ClusterState,
    GangRequest,
    GpuType,
    GpuTypePolicy,
    JobId,
    NodePool,
    Plan,
    Provider,
    RunningGang,
    Snapshot,
    TenantId,
    TenantQuota,
    WaitCode,
    Waiting,
)
from placement.plan import plan
from placement.quota import QuotaBook
from tests.properties import examples
from tests.unit.placement_builders import SkipsOneItemSamples, shuffled

GPU_TYPES = [GpuType("A100"), GpuType("H100"), GpuType("L4")]
KIND_RANK = {CapacityKind.PRIVATE: 0, CapacityKind.ON_DEMAND: 1, CapacityKind.SPOT: 2}
TENANTS = [TenantId("t1"), TenantId("t2"), TenantId("t3")]
PROPERTY_SETTINGS = settings(max_examples=examples(120), deadline=None)


# Strategies are built once: building them inside a composite costs more than the draws themselves.
# Hypothesis's cost is per draw, not per value: independent terms of a pool, gang or running gang are
# one draw from their product, built once here. Each term keeps its weights (its list repeats what it
# favours), and shrinking the index moves the first term first, as shrinking separate draws would.
# gpus per node, GPU type, capacity kind (skewed towards ties on price and kind, so that packing and
# cluster names decide often), price.
POOL_TERMS = st.sampled_from(
    list(
        itertools.product(
            [2, 4, 8, 8],
            GPU_TYPES,
            [CapacityKind.PRIVATE, CapacityKind.PRIVATE, CapacityKind.ON_DEMAND, CapacityKind.SPOT],
            [1.0, 1.0, 2.0],
        )
    )
)
# Mostly whole or half-free nodes, clamped to the node size: enough room to admit, enough to contend for.
FREE_PER_NODE = st.lists(st.sampled_from([0, 2, 4, 8, 8, 8]), max_size=6)
MOSTLY_REACHABLE = st.sampled_from([True, True, True, False])
# tenant (one in seven unknown), priority, queue time, GPU type policy, allow spot
GANG_TERMS = st.sampled_from(
    list(
        itertools.product(
            [*TENANTS, *TENANTS, TenantId("ghost")],
            [0, 1, 2, 3],
            [float(t) for t in range(6)],
            list(GpuTypePolicy),
            [False, True],
        )
    )
)
# Mostly shapes that repeat across the queue, as in real queues (and as the placer's caches assume).
REPLICAS = st.sampled_from([(8,), (4,), (2,), (4, 4), (8, 8), (2, 2, 2)]) | st.lists(
    st.integers(0, 8), min_size=1, max_size=4
).map(tuple)
ACCEPTED_TYPES = st.lists(
    st.sampled_from([*GPU_TYPES, *GPU_TYPES, GpuType("B200")]), min_size=1, max_size=3
).map(tuple)
CAPPED_TYPES = st.lists(st.sampled_from(GPU_TYPES), unique=True, max_size=1)
A_CAP = st.integers(0, 48)
# Every running gang there can be (ids are given by position): tenant, GPU type, GPUs held.
A_RUNNING_GANG = st.sampled_from(
    [
        RunningGang(JobId("running"), tenant, 0, ClusterName("c0"), gpu_type, gpu_count)
        for tenant, gpu_type, gpu_count in itertools.product(TENANTS, GPU_TYPES, range(1, 17))
    ]
)


@st.composite
def pools(draw: st.DrawFn) -> NodePool:
    gpus_per_node, gpu_type, kind, price = draw(POOL_TERMS)
    return NodePool(
        name="pool",
        gpu_type=gpu_type,
        kind=kind,
        usd_per_gpu_hour=price,
        gpus_per_node=gpus_per_node,
        free_gpus_per_node=tuple(min(free, gpus_per_node) for free in draw(FREE_PER_NODE)),
    )


POOLS = st.lists(pools(), min_size=1, max_size=3).map(tuple)


@st.composite
def clusters(draw: st.DrawFn) -> ClusterState:
    return ClusterState(
        name=ClusterName("cluster"),
        provider=Provider.PRIVATE,
        region="local",
        pools=draw(POOLS),
        reachable=draw(MOSTLY_REACHABLE),
    )


@st.composite
def gangs(draw: st.DrawFn) -> GangRequest:
    tenant, priority, queued_at_s, gpu_type_policy, allow_spot = draw(GANG_TERMS)
    return GangRequest(
        job_id=JobId("job"),
        tenant=tenant,
        priority=priority,
        queued_at_s=queued_at_s,
        replica_gpus=draw(REPLICAS),
        gpu_types=draw(ACCEPTED_TYPES),
        gpu_type_policy=gpu_type_policy,
        allow_spot=allow_spot,
    )


CLUSTERS = st.lists(clusters(), min_size=1, max_size=3)
QUEUE = st.lists(gangs(), max_size=12)
RUNNING = st.lists(A_RUNNING_GANG, max_size=3)


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    """Ids and names are given by position after drawing, so that they are unique."""
    tenants = tuple(
        TenantQuota(tenant=tenant, gpu_caps=tuple((gpu_type, draw(A_CAP)) for gpu_type in draw(CAPPED_TYPES)))
        for tenant in TENANTS
    )
    return Snapshot(
        queued=tuple(replace(g, job_id=JobId(f"j{i}")) for i, g in enumerate(draw(QUEUE))),
        running=tuple(replace(r, job_id=JobId(f"r{i}")) for i, r in enumerate(draw(RUNNING))),
        tenants=tenants,
        clusters=tuple(
            replace(
                c,
                name=ClusterName(f"c{i}"),
                pools=tuple(replace(p, name=f"p{k}") for k, p in enumerate(c.pools)),
            )
            for i, c in enumerate(draw(CLUSTERS))
        ),
    )


OfferKey = tuple[str, str, CapacityKind, float]


@dataclass
class Replay:
    """The snapshot's node lists and tenant usage, advanced admission by admission with `fit_replicas`."""

    snapshot: Snapshot

    def __post_init__(self) -> None:
        self.free: dict[OfferKey, list[int]] = {}
        self.reachable = {c.name: c.reachable for c in self.snapshot.clusters}
        for cluster in self.snapshot.clusters:
            for pool in cluster.pools:
                key = (cluster.name, pool.gpu_type, pool.kind, pool.usd_per_gpu_hour)
                self.free.setdefault(key, []).extend(pool.free_gpus_per_node)
        self.usage: dict[tuple[str, str], int] = {}
        for gang in self.snapshot.running:
            self.usage[(gang.tenant, gang.gpu_type)] = (
                self.usage.get((gang.tenant, gang.gpu_type), 0) + gang.gpu_count
            )
        self.caps = {t.tenant: dict(t.gpu_caps) for t in self.snapshot.tenants}

    def cap_allows(self, gang: GangRequest, gpu_type: str) -> bool:
        cap = self.caps[gang.tenant].get(GpuType(gpu_type))
        return cap is None or self.usage.get((gang.tenant, gpu_type), 0) + gang.gpu_count <= cap

    def usable_offers(self, gang: GangRequest, gpu_types: Sequence[str]) -> list[OfferKey]:
        return [
            key
            for key in self.free
            if key[1] in gpu_types
            and self.reachable[ClusterName(key[0])]
            and (gang.allow_spot or key[2] is not CapacityKind.SPOT)
            and self.cap_allows(gang, key[1])
        ]

    def feasible(self, gang: GangRequest, gpu_types: Sequence[str]) -> list[OfferKey]:
        return [
            key
            for key in self.usable_offers(gang, gpu_types)
            if fit_replicas(gang.replica_gpus, self.free[key]) is not None
        ]

    def apply(self, gang: GangRequest, admission: Admission) -> None:
        key = (admission.cluster, admission.gpu_type, admission.kind, admission.usd_per_gpu_hour)
        taken = fit_replicas(gang.replica_gpus, self.free[key])
        assert taken is not None, f"{gang.job_id} does not fit where it was admitted"
        self.free[key] = [free - t for free, t in zip(self.free[key], taken, strict=True)]
        assert min(self.free[key], default=0) >= 0
        usage_key = (gang.tenant, admission.gpu_type)
        self.usage[usage_key] = self.usage.get(usage_key, 0) + gang.gpu_count


def decision_order(snapshot: Snapshot, result: Plan) -> list[GangRequest]:
    """The documented order, replayed naively: the tenant whose next gang stays within its guarantee
    first, then the higher priority, then the lowest weighted dominant share (GPUs held over reachable
    GPUs of the type, largest over types), then queue time and job id; each tenant's gangs by priority
    then queue time; shares and guarantees move with each admission of the plan."""
    admitted = {a.job_id: a for a in result.admissions}
    capacity: dict[str, int] = {}
    for cluster in snapshot.clusters:
        for pool in cluster.pools:
            if cluster.reachable:
                size = sum(max(free, pool.gpus_per_node) for free in pool.free_gpus_per_node)
                capacity[pool.gpu_type] = capacity.get(pool.gpu_type, 0) + size
    load: dict[tuple[str, str], float] = {}
    for running in snapshot.running:
        key = (running.tenant, running.gpu_type)
        load[key] = load.get(key, 0.0) + running.gpu_count
    weight = {t.tenant: t.weight for t in snapshot.tenants}
    # Held GPUs against guarantees: the quota book's own count (quotas are tested elsewhere).
    book = QuotaBook(snapshot.tenants, snapshot.running)

    def share(tenant: str) -> float:
        shares = [load.get((tenant, t), 0.0) / c for t, c in capacity.items() if c > 0]
        return max(shares, default=0.0) / weight.get(TenantId(tenant), 1.0)

    def borrows(gang: GangRequest) -> bool:
        return not any(book.within_guarantee(gang.tenant, t, gang.gpu_count) for t in gang.gpu_types)

    pending: dict[str, list[GangRequest]] = {}
    for gang in sorted(snapshot.queued, key=lambda g: (-g.priority, g.queued_at_s, g.job_id)):
        pending.setdefault(gang.tenant, []).append(gang)
    order = []
    while pending:
        tenant = min(
            pending,
            key=lambda t: (
                borrows(pending[t][0]),
                -pending[t][0].priority,
                share(t),
                pending[t][0].queued_at_s,
                pending[t][0].job_id,
                t,
            ),
        )
        gang = pending[tenant].pop(0)
        if not pending[tenant]:
            del pending[tenant]
        order.append(gang)
        if gang.job_id in admitted:
            gpu_type = admitted[gang.job_id].gpu_type
            key = (gang.tenant, gpu_type)
            load[key] = load.get(key, 0.0) + gang.gpu_count
            book.add(gang.tenant, gpu_type, gang.gpu_count)
    return order


def acceptable_types(gang: GangRequest) -> list[str]:
    return list(dict.fromkeys(gang.gpu_types))


@PROPERTY_SETTINGS
@given(snapshots())
def test_every_queued_job_is_admitted_once_or_waits_with_reasons(snapshot: Snapshot) -> None:
    result = plan(snapshot, now=0.0)
    admitted = [a.job_id for a in result.admissions]
    waiting = [w.job_id for w in result.waiting]
    assert len(admitted) == len(set(admitted))
    assert sorted(admitted + waiting) == sorted(g.job_id for g in snapshot.queued)
    assert all(w.reasons for w in result.waiting)
    order = [g.job_id for g in decision_order(snapshot, result)]
    assert waiting == [j for j in order if j in set(waiting)]
    assert admitted == [j for j in order if j in set(admitted)]


@PROPERTY_SETTINGS
@given(snapshots())
def test_admitted_gangs_fit_their_cluster_and_caps_hold(snapshot: Snapshot) -> None:
    """Replaying admissions never drives a node below zero, and no tenant goes over a cap by them."""
    result = plan(snapshot, now=0.0)
    gangs = {g.job_id: g for g in snapshot.queued}
    replay = Replay(snapshot)
    known = {t.tenant for t in snapshot.tenants}
    for admission in result.admissions:
        gang = gangs[admission.job_id]
        assert gang.tenant in known
        assert admission.gpu_type in gang.gpu_types
        assert gang.allow_spot or admission.kind is not CapacityKind.SPOT
        assert replay.reachable[admission.cluster]
        assert replay.cap_allows(gang, admission.gpu_type)
        replay.apply(gang, admission)


def selection_key(replay: Replay, gang: GangRequest, key: OfferKey) -> tuple[float, int, int, int, str, str]:
    """The placer's documented preference: price, kind, GPUs stranded, nodes touched, cluster, type."""
    free = replay.free[key]
    taken = fit_replicas(gang.replica_gpus, free)
    assert taken is not None
    touched = [i for i, t in enumerate(taken) if t]
    stranded = sum(free[i] - taken[i] for i in touched)
    return (key[3], KIND_RANK[key[2]], stranded, len(touched), key[0], key[1])


@PROPERTY_SETTINGS
@given(snapshots())
def test_a_waiting_gang_had_no_placement_at_its_turn_and_admissions_are_the_best(snapshot: Snapshot) -> None:
    """Priority is respected: capacity a waiting gang could have used alone was not there at its turn.

    Replaying in queue order, a waiting gang fits no usable pool group of any type it accepts, given the
    admissions of the gangs before it only, and its capacity reasons state that replayed capacity. An
    admitted gang got the placement the documented preference ranks first, on the first type that fits
    when its types are ordered.
    """
    result = plan(snapshot, now=0.0)
    admissions = {a.job_id: a for a in result.admissions}
    waiting = {w.job_id: w for w in result.waiting}
    replay = Replay(snapshot)
    known = {t.tenant for t in snapshot.tenants}
    for gang in decision_order(snapshot, result):
        admission = admissions.get(gang.job_id)
        if gang.tenant not in known:
            assert admission is None
            continue
        types = acceptable_types(gang)
        if admission is None:
            assert replay.feasible(gang, types) == [], f"{gang.job_id} waits but fits"
            check_capacity_reasons(replay, gang, waiting[gang.job_id])
            continue
        if gang.gpu_type_policy is GpuTypePolicy.ORDERED:
            first_fitting = next(t for t in types if replay.feasible(gang, [t]))
            assert admission.gpu_type == first_fitting
            types = [first_fitting]
        chosen = (admission.cluster, admission.gpu_type, admission.kind, admission.usd_per_gpu_hour)
        best = min(replay.feasible(gang, types), key=lambda key: selection_key(replay, gang, key))
        assert selection_key(replay, gang, chosen) == selection_key(replay, gang, best)
        replay.apply(gang, admission)


def check_capacity_reasons(replay: Replay, gang: GangRequest, waits: Waiting) -> None:
    for reason in waits.reasons:
        assert reason.gpu_type is None or reason.gpu_type in gang.gpu_types
        if reason.code is not WaitCode.INSUFFICIENT_CAPACITY:
            continue
        usable = [
            free
            for (cluster, gpu_type, kind, _), free in replay.free.items()
            if (cluster, gpu_type) == (reason.cluster, reason.gpu_type)
            and (gang.allow_spot or kind is not CapacityKind.SPOT)
        ]
        nodes = [gpus for free in usable for gpus in free]
        assert reason.message.endswith(f"has {sum(nodes)} free, at most {max(nodes)} on one node"), reason


@PROPERTY_SETTINGS
@given(snapshots(), st.randoms(use_true_random=False))
def test_same_snapshot_in_any_order_gives_the_same_plan(snapshot: Snapshot, rng: random.Random) -> None:
    expected: Plan = plan(snapshot, now=0.0)
    assert plan(shuffled(snapshot, SkipsOneItemSamples(rng)), now=0.0) == expected
    assert plan(snapshot, now=1e9) == expected
