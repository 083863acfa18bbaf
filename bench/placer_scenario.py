"""The benchmark's snapshot: a busy federation, seeded, so every run plans the same cycle.

10,000 waiting gangs, 50 clusters (20 private, 30 cloud with on-demand, spot and growable pools),
6 GPU types with relative speeds, 30 tenants (5 organisations of 5 teams) with guarantees, borrowing
and lending limits, caps, budgets and usage history, four priority classes (one needing approval),
datasets in several object stores, deadlines, and running gangs placed on known nodes with run-time
limits, so that every rule of the policy has work to do. One cluster in five runs no Volcano (gangs
whose replicas differ may not go there), and one gang in twelve has placement rules (a region, a
cloud excluded, or a list of clusters). Those are drawn from a generator of their own, so the rest
of the scenario is the one earlier runs measured.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace

from placement.fit import fit_replicas
from placement.model import (
    NO_PINNING,
    Admission,
    CapacityKind,
    ClusterName,
    ClusterState,
    EgressRate,
    GangRequest,
    GpuQuota,
    GpuType,
    GpuTypePolicy,
    JobId,
    NodePool,
    NodeShare,
    Pinning,
    Plan,
    PolicyConfig,
    PriorityClass,
    Provider,
    RunningGang,
    ScalablePool,
    Snapshot,
    TenantId,
    TenantQuota,
)

REGIONS = ("us-east", "us-west", "eu-west")

NOW = 1_000_000.0
TYPES = [GpuType(t) for t in ("H100", "A100", "L40S", "A10G", "L4", "V100")]
SPEEDS = {"H100": 2.0, "A100": 1.0, "L40S": 0.8, "A10G": 0.45, "L4": 0.35, "V100": 0.5}
PRIVATE_PRICE = {"H100": 1.6, "A100": 0.9, "L40S": 0.6, "A10G": 0.35, "L4": 0.25, "V100": 0.3}
CLOUD_PRICE = {"H100": 4.5, "A100": 2.9, "L40S": 1.9, "A10G": 1.0, "L4": 0.8, "V100": 1.2}
STORES = ["dc-east", "dc-west", "s3-use1", "gcs-us", "blob-eu"]
SHAPES = [(1,), (2,), (4,), (8,), (4, 4), (8, 8), (8,) * 4, (8,) * 8, (1, 8, 8), (2, 2, 2, 2)]
SHAPE_WEIGHTS = [18, 14, 14, 16, 6, 12, 8, 4, 4, 4]
CLASSES = (
    PriorityClass("low", 0),
    PriorityClass("normal", 100),
    PriorityClass("high", 500),
    PriorityClass("urgent", 1000, preemptible=False, needs_approval=True),
)


def _clusters(rng: random.Random) -> tuple[list[ClusterState], dict[tuple[str, str], list[int]]]:
    clusters = []
    nodes: dict[tuple[str, str], list[int]] = {}
    for i in range(50):
        private = i < 20
        name = ClusterName(f"{'dc' if private else 'cloud'}-{i:02d}")
        provider = Provider.PRIVATE if private else [Provider.AWS, Provider.GCP, Provider.AZURE][i % 3]
        store = STORES[i % 2] if private else STORES[2 + i % 3]
        types = rng.sample(TYPES, 2 if private else 3)
        pools = []
        scalable = []
        for gpu_type in types:
            count = rng.randint(16, 48) if private else rng.randint(4, 16)
            kinds = [CapacityKind.PRIVATE] if private else [CapacityKind.ON_DEMAND, CapacityKind.SPOT]
            for kind in kinds:
                pool_name = f"{gpu_type.lower()}-{kind.value}"
                price = PRIVATE_PRICE[gpu_type] if private else CLOUD_PRICE[gpu_type]
                if kind is CapacityKind.SPOT:
                    price *= 0.4
                free = [8] * count
                nodes[(name, pool_name)] = free
                pools.append(
                    NodePool(
                        pool_name,
                        gpu_type,
                        kind,
                        round(price * (1 + rng.random() * 0.1), 3),
                        8,
                        (),
                        restart_risk_per_hour=0.1 if kind is CapacityKind.SPOT else 0.0,
                    )
                )
            if not private:
                scalable.append(
                    ScalablePool(
                        f"{gpu_type.lower()}-grow",
                        gpu_type,
                        CapacityKind.ON_DEMAND,
                        CLOUD_PRICE[gpu_type] * 1.05,
                        8,
                        0,
                        rng.randint(2, 8),
                    )
                )
        clusters.append(
            ClusterState(
                name, provider, "r", tuple(pools), object_store=store, scalable_pools=tuple(scalable)
            )
        )
    return clusters, nodes


def _tenants(rng: random.Random) -> list[TenantQuota]:
    tenants = []
    for org in range(5):
        org_id = TenantId(f"org{org}")
        tenants.append(TenantQuota(org_id, quotas=tuple(GpuQuota(t, 0, None, None, 1600) for t in TYPES)))
        for team in range(5):
            quotas = tuple(
                GpuQuota(
                    t,
                    guaranteed_gpus=rng.choice([0, 16, 32, 64]),
                    borrowing_limit_gpus=rng.choice([None, 64, 256]),
                    lending_limit_gpus=rng.choice([None, None, 16]),
                    cap_gpus=rng.choice([None, 512]),
                )
                for t in TYPES
            )
            budget = rng.choice([None, None, 50_000.0])
            spent = 60_000.0 if (org, team) == (4, 4) else rng.random() * 10_000
            tenants.append(
                TenantQuota(
                    TenantId(f"org{org}-team{team}"),
                    parent=org_id,
                    quotas=quotas,
                    weight=rng.choice([1.0, 1.0, 2.0]),
                    monthly_budget_gpu_hours=budget,
                    spent_gpu_hours=spent,
                    usage_history_gpu_hours=tuple((t, rng.random() * 2000) for t in rng.sample(TYPES, 2)),
                    max_priority=rng.choice([500, 1000]),
                )
            )
    return tenants


def _running(
    rng: random.Random,
    clusters: list[ClusterState],
    nodes: dict[tuple[str, str], list[int]],
    teams: list[TenantId],
) -> list[RunningGang]:
    """Fill private pools to about 70%, cloud pools to about 40%, with gangs on known nodes."""
    running: list[RunningGang] = []
    for cluster in clusters:
        for pool in cluster.pools:
            free = nodes[(cluster.name, pool.name)]
            target = 0.7 if pool.kind is CapacityKind.PRIVATE else 0.4
            for index in range(len(free)):
                if rng.random() < target:
                    used = rng.choice([8, 8, 4, 2])
                    free[index] -= used
                    job = JobId(f"run-{len(running):05d}")
                    priority = rng.choice([0, 100, 100, 500])
                    running.append(
                        RunningGang(
                            job,
                            rng.choice(teams),
                            priority,
                            cluster.name,
                            pool.gpu_type,
                            used,
                            queued_at_s=NOW - rng.random() * 86400,
                            ends_at_s=NOW + rng.random() * 36000,
                            nodes=(NodeShare(pool.name, index, used),),
                            priority_class={0: "low", 100: "normal", 500: "high"}[priority],
                        )
                    )
    return running


def _gangs(rng: random.Random, count: int, teams: list[TenantId]) -> list[GangRequest]:
    gangs = []
    for i in range(count):
        shape = rng.choices(SHAPES, SHAPE_WEIGHTS)[0]
        roll = rng.random()
        types: tuple[GpuType, ...]
        if roll < 0.5:
            types, policy = (rng.choice(TYPES),), GpuTypePolicy.ORDERED
        elif roll < 0.8:
            types, policy = tuple(rng.sample(TYPES, 2)), GpuTypePolicy.ORDERED
        else:
            types, policy = tuple(rng.sample(TYPES, 3)), GpuTypePolicy.ANY
        priority_class = rng.choices(CLASSES, [30, 55, 13, 2])[0]
        dataset = rng.random() < 0.3
        gangs.append(
            GangRequest(
                job_id=JobId(f"job-{i:05d}"),
                tenant=rng.choice(teams),
                priority=priority_class.value,
                queued_at_s=NOW - rng.randint(0, 7200),
                replica_gpus=shape,
                gpu_types=types,
                gpu_type_policy=policy,
                allow_spot=rng.random() < 0.3,
                max_runtime_s=rng.choice([0, 1800, 3600, 4 * 3600]),
                priority_class=priority_class.name,
                approval_expires_at_s=NOW + 3600 if rng.random() < 0.5 else None,
                deadline_at_s=NOW + rng.choice([3600, 8 * 3600]) if rng.random() < 0.1 else None,
                expected_runtime_s=rng.choice([1800.0, 3600.0, 7200.0]),
                dataset_size_bytes=rng.choice([50, 500, 2000]) * 10**9 if dataset else 0,
                dataset_store=rng.choice(STORES) if dataset else None,
            )
        )
    return gangs


def build(seed: int = 7, gangs: int = 10_000) -> Snapshot:
    rng = random.Random(seed)
    clusters, nodes = _clusters(rng)
    tenants = _tenants(rng)
    teams = [t.tenant for t in tenants if t.parent is not None]
    running = _running(rng, clusters, nodes, teams)
    clusters = [
        ClusterState(
            c.name,
            c.provider,
            c.region,
            tuple(
                NodePool(
                    p.name,
                    p.gpu_type,
                    p.kind,
                    p.usd_per_gpu_hour,
                    p.gpus_per_node,
                    tuple(nodes[(c.name, p.name)]),
                    p.restart_risk_per_hour,
                )
                for p in c.pools
            ),
            object_store=c.object_store,
            scalable_pools=c.scalable_pools,
        )
        for c in clusters
    ]
    queued = _gangs(rng, gangs, teams)
    clusters, queued = _with_rules(random.Random(seed * 1000 + 32), clusters, queued)
    egress = tuple(
        EgressRate(a, b, 0.02 if a.startswith("dc") and b.startswith("dc") else 0.09)
        for a in STORES
        for b in STORES
        if a != b
    )
    return Snapshot(
        queued=tuple(queued),
        running=tuple(running),
        tenants=tuple(tenants),
        clusters=tuple(clusters),
        priority_classes=CLASSES,
        gpu_speeds=tuple((GpuType(t), s) for t, s in SPEEDS.items()),
        egress_rates=egress,
        policy=PolicyConfig(
            preemption_limit_gpus=256,
            wait_value_usd_per_hour=5.0,
            private_wait_s_per_gpu_hour=60.0,
            fair_share_history=True,
        ),
    )


def _with_rules(
    rng: random.Random, clusters: list[ClusterState], gangs: list[GangRequest]
) -> tuple[list[ClusterState], list[GangRequest]]:
    """Regions, clusters without Volcano, and gangs with placement rules or differing replicas."""
    clusters = [
        replace(c, region=REGIONS[i % len(REGIONS)], runs_mixed_gangs=rng.random() >= 0.2)
        for i, c in enumerate(clusters)
    ]
    names = [c.name for c in clusters]
    ruled = []
    for g in gangs:
        pinning = NO_PINNING
        draw = rng.random()
        if draw < 1 / 36:
            pinning = Pinning(regions=(rng.choice(REGIONS),))
        elif draw < 2 / 36:
            pinning = Pinning(exclude_clouds=(rng.choice(("private", "aws", "gcp", "azure")),))
        elif draw < 3 / 36:
            pinning = Pinning(clusters=tuple(sorted(rng.sample(names, 6))))
        ruled.append(replace(g, pinning=pinning, uniform=len(set(g.replica_gpus)) == 1))
    return clusters, ruled


def advance(
    snapshot: Snapshot, plan: Plan, now: float, rng: random.Random, *, step_s: float = 10.0, churn: int = 20
) -> tuple[Snapshot, float]:
    """The snapshot the server builds for the next cycle after `plan`, `step_s` later.

    As the scheduler sees it: admitted gangs hold their nodes (placed best-fit, as a cluster would),
    victims are gone and requeued at their old place, requested nodes are counted as asked for, running
    gangs whose limit has passed (and `churn` others, drawn from `rng`) ended and freed their nodes, and
    `churn` new gangs were submitted. Seeded, so a sequence of cycles is the same every run.
    """
    later = now + step_s
    admitted = {a.job_id: a for a in plan.admissions}
    victims = {p.victim: p for p in plan.preemptions}
    clusters = {c.name: c for c in snapshot.clusters}
    free = {(c.name, p.name): list(p.free_gpus_per_node) for c in snapshot.clusters for p in c.pools}
    running: list[RunningGang] = []
    ending = set(rng.sample(range(len(snapshot.running)), min(churn, len(snapshot.running))))
    requeued: list[GangRequest] = []
    for index, held in enumerate(snapshot.running):
        ended = index in ending or (held.ends_at_s is not None and held.ends_at_s <= later)
        victim = victims.get(held.job_id)
        if ended or victim is not None:
            for share in held.nodes:
                free[(held.cluster, share.pool)][share.node_index] += share.gpus
            if victim is not None:
                requeued.append(_requeued(held, victim.requeue_queued_at_s))
            continue
        running.append(held)
    queued: list[GangRequest] = []
    for gang in snapshot.queued:
        admission = admitted.get(gang.job_id)
        if admission is None:
            queued.append(gang)
            continue
        placed = _place(clusters[admission.cluster], admission, gang, free)
        if placed is None:  # freed GPUs moved under it: it waits again (the server's lost race)
            queued.append(gang)
            continue
        running.append(
            RunningGang(
                gang.job_id,
                gang.tenant,
                gang.priority,
                admission.cluster,
                admission.gpu_type,
                gang.gpu_count,
                priority_class=gang.priority_class,
                queued_at_s=gang.queued_at_s,
                ends_at_s=later + (gang.max_runtime_s or gang.expected_runtime_s or 3600.0),
                nodes=placed,
            )
        )
    teams = sorted({t.tenant for t in snapshot.tenants if t.parent is not None})
    fresh = _gangs(rng, churn, teams)
    stamp = int(later)
    queued.extend(replace(g, job_id=JobId(f"{g.job_id}-t{stamp}"), queued_at_s=later) for g in fresh)
    queued.extend(requeued)
    asked: dict[tuple[ClusterName, str], int] = {}
    for request in plan.capacity_requests:
        asked[(request.cluster, request.pool)] = asked.get((request.cluster, request.pool), 0) + request.nodes
    states = tuple(
        replace(
            c,
            pools=tuple(replace(p, free_gpus_per_node=tuple(free[(c.name, p.name)])) for p in c.pools),
            scalable_pools=tuple(
                replace(s, requested_nodes=s.requested_nodes + asked.get((c.name, s.name), 0))
                for s in c.scalable_pools
            ),
        )
        for c in snapshot.clusters
    )
    return replace(snapshot, queued=tuple(queued), running=tuple(running), clusters=states), later


def _requeued(gang: RunningGang, queued_at_s: float) -> GangRequest:
    return GangRequest(
        job_id=gang.job_id,
        tenant=gang.tenant,
        priority=gang.priority,
        queued_at_s=queued_at_s,
        replica_gpus=tuple(s.gpus for s in gang.nodes) or (gang.gpu_count,),
        gpu_types=(gang.gpu_type,),
        priority_class=gang.priority_class,
    )


def _place(
    cluster: ClusterState,
    admission: Admission,
    gang: GangRequest,
    free: dict[tuple[ClusterName, str], list[int]],
) -> tuple[NodeShare, ...] | None:
    """Best-fit the gang into the admitted pools' nodes (as `reserve_pending` does) and take them."""
    pools = [p for p in cluster.pools if p.gpu_type == admission.gpu_type and p.kind == admission.kind]
    nodes = [(p.name, i) for p in pools for i in range(len(free[(cluster.name, p.name)]))]
    taken = fit_replicas(gang.replica_gpus, [free[(cluster.name, name)][i] for name, i in nodes])
    if taken is None:
        return None
    shares = []
    for (name, index), gpus in zip(nodes, taken, strict=True):
        if gpus:
            free[(cluster.name, name)][index] -= gpus
            shares.append(NodeShare(name, index, gpus))
    return tuple(shares)


def plan_bytes(plan: Plan) -> bytes:
    """Every part of the plan, in order, as text: two plans are the same when these are equal."""
    parts = [
        *(repr((a, a.choice)) for a in plan.admissions),
        *(repr((w.job_id, w.reasons, [r.message for r in w.reasons])) for w in plan.waiting),
        *(repr(p) for p in plan.preemptions),
        *(repr(c) for c in plan.capacity_requests),
        *(repr(r) for r in plan.reservations),
        *(repr(m) for m in plan.moves),
        repr(sorted(plan.bursts.items())),
    ]
    return "\n".join(parts).encode()


def digest(plan: Plan) -> str:
    return hashlib.sha256(plan_bytes(plan)).hexdigest()
