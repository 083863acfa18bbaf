"""Answers the placer keeps within a cycle (issue 33, the steady cycle's third round), each compared
with the answer worked out afresh on the same state.

- `QuotaBook.limit_reason` keeps its answer per (tenant, type, GPUs) while usage is unchanged
  (`QuotaBook.changes`): the same as `limit_reason_now` after every admission of a run.
- `QuotaBook.budget_reason` keeps each tenant's answer for the cycle: the same as a fresh book's.
- `Inventory.eligible` looks the rules up by their object first: equal rules in other objects, and
  rules that differ, get the answer `Pinning.allows` gives cluster by cluster.
- `FairOrder` keeps the heap's top when the tenant just served still goes before both its children:
  the order is the one a plain walk gives (each step, the least of the tenants' entries, the
  served tenant's read afresh), with standings that move as gangs are handed out.
- `Growth` ranks every scalable pool once by its price per unit of work and takes each list of
  types' pools from that ranking: the order sorting each list gives, with ties (a pool named twice
  in a cluster), repeated types and spot pools among them.
- `FairOrder` sorts each tenant's queue on the queue times alone, then each run of equal times by
  job id: the order of the (time, id) sort, with ties, repeated ids and times that are not numbers.
- `_Cycle` numbers only the kinds that may be queued more than once (by a count of the keys'
  hashes): the same kinds as numbering every key by value.

The plans themselves are held to the recorded bytes by `test_plan_cycles` (compiled and
interpreted); these tests say which shortcut broke if one does.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.placer_scenario import NOW, build
from placement.capacity import Growth
from placement.fairshare import Entry, FairOrder, FairShare, _sort_by_queue_order
from placement.fit import gang_shape
from placement.inventory import Inventory
from placement.model import (
    CapacityKind,
    ClusterName,
    GangRequest,
    GpuQuota,
    GpuType,
    JobId,
    Pinning,
    PolicyConfig,
    ScalablePool,
    TenantId,
    TenantQuota,
)
from placement.plan import _Cycle
from placement.quota import QuotaBook
from placement.reasons import Tables
from tests.properties import examples

A100, H100 = GpuType("A100"), GpuType("H100")


def _tree() -> list[TenantQuota]:
    """An organisation with two teams: caps and borrowing limits at both levels, one budget spent."""
    return [
        TenantQuota(
            TenantId("org"),
            gpu_caps=((A100, 40),),
            quotas=(GpuQuota(H100, guaranteed_gpus=8, borrowing_limit_gpus=8),),
        ),
        TenantQuota(
            TenantId("nlp"),
            parent=TenantId("org"),
            quotas=(GpuQuota(A100, guaranteed_gpus=8, borrowing_limit_gpus=4),),
        ),
        TenantQuota(
            TenantId("vision"),
            parent=TenantId("org"),
            gpu_caps=((H100, 12),),
            monthly_budget_gpu_hours=100.0,
            spent_gpu_hours=120.0,
        ),
        TenantQuota(TenantId("solo"), quotas=(GpuQuota(A100, guaranteed_gpus=4, borrowing_limit_gpus=0),)),
    ]


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_a_kept_limit_is_the_limit_worked_out_now(seed: int) -> None:
    rng = random.Random(seed)
    book = QuotaBook(_tree(), ())
    tenants = [TenantId(t) for t in ("org", "nlp", "vision", "solo")]
    for _ in range(60):
        tenant, gpu_type, need = rng.choice(tenants), rng.choice((A100, H100)), rng.choice((0, 1, 2, 4, 8))
        # Asked twice between changes: the second answer is the kept one.
        for _ in range(2):
            assert book.limit_reason(tenant, gpu_type, need) == book.limit_reason_now(tenant, gpu_type, need)
        if rng.random() < 0.4:
            book.add(rng.choice(tenants), rng.choice((A100, H100)), rng.choice((1, 2, 4)))


def test_a_kept_budget_is_a_fresh_books_answer() -> None:
    book = QuotaBook(_tree(), ())
    for tenant in ("vision", "nlp", "org", "solo"):
        first = book.budget_reason(TenantId(tenant))
        assert book.budget_reason(TenantId(tenant)) is first
        assert first == QuotaBook(_tree(), ()).budget_reason(TenantId(tenant))
    assert book.budget_reason(TenantId("vision")) is not None
    assert book.budget_reason(TenantId("nlp")) is None


def test_rules_looked_up_by_object_are_the_rules_answer() -> None:
    snapshot = build(gangs=50)
    inventory = Inventory(snapshot.clusters, snapshot.policy)
    names = sorted(inventory.sites)
    rules = [
        Pinning(clusters=tuple(names[:5])),
        Pinning(exclude_clusters=tuple(names[:3])),
        Pinning(regions=(inventory.sites[names[0]][0],)),
        Pinning(exclude_clouds=("private",)),
        Pinning(clusters=tuple(names[:5]), exclude_clusters=(names[1],)),
    ]
    base = snapshot.queued[0]
    for rule in rules:
        for uniform in (True, False):
            expected = frozenset(
                name
                for name, (region, cloud, mixed) in inventory.sites.items()
                if (uniform or mixed) and rule.allows(name, region, cloud)
            )
            # The same rules in three objects: the first asks by value, the others by their objects.
            for pinning in (rule, replace(rule), replace(rule)):
                gang = replace(base, pinning=pinning, uniform=uniform)
                for _ in range(2):
                    found = inventory.eligible(gang)
                    assert (found if found is not None else frozenset(names)) == expected


def _queue(rng: random.Random, tenants: int, gangs: int) -> list[GangRequest]:
    return [
        GangRequest(
            JobId(f"j{n:04d}"),
            TenantId(f"t{rng.randrange(tenants)}"),
            rng.choice((0, 0, 0, 5, 10)),
            float(rng.randrange(100)),
            (rng.choice((1, 2, 4, 8)),),
            (A100,),
        )
        for n in range(gangs)
    ]


def _plain_walk(
    queued: list[GangRequest], fair: FairShare, within: dict[JobId, bool], served: list[GangRequest]
) -> Iterator[GangRequest]:
    """FairOrder's order without a heap: each step the least of every tenant's entry, the entry of
    the tenant just served read afresh (the others as they were read when their gang became next)."""
    order = FairOrder(queued, fair, lambda g: within[g.job_id])  # for its per-tenant order only
    positions = dict.fromkeys(order.by_tenant, 0)
    entries: dict[TenantId, Entry] = {t: order.entry(t, 0) for t in order.by_tenant}
    while entries:
        tenant = min(entries, key=entries.__getitem__)
        gangs = order.by_tenant[tenant]
        gang = gangs[positions[tenant]]
        yield gang
        served.append(gang)
        positions[tenant] += 1
        if positions[tenant] == len(gangs):
            del entries[tenant]
        else:
            entries[tenant] = order.entry(tenant, positions[tenant])


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1), st.integers(min_value=1, max_value=12))
def test_the_fair_order_is_the_plain_walks(seed: int, tenants: int) -> None:
    queued = _queue(random.Random(seed), tenants, 120)

    def walk(plain: bool) -> list[JobId]:
        # Standings that move as gangs are handed out, the same way in both walks: every third gang
        # handed out is "admitted" (its tenant's share grows), and a tenant's later gangs borrow once
        # it has had four.
        rng = random.Random(seed + 1)
        names = sorted({g.tenant for g in queued})
        fair = FairShare(
            {TenantId(t): TenantQuota(TenantId(t)) for t in names}, {}, {A100: 64}, PolicyConfig()
        )
        within = {g.job_id: True for g in queued}
        had: dict[TenantId, int] = {}
        served: list[GangRequest] = []
        walker = (
            _plain_walk(queued, fair, within, served)
            if plain
            else iter(FairOrder(queued, fair, lambda g: within[g.job_id]))
        )
        out = []
        for gang in walker:
            out.append(gang.job_id)
            had[gang.tenant] = had.get(gang.tenant, 0) + 1
            if had[gang.tenant] >= 4:
                for g in queued:
                    if g.tenant == gang.tenant:
                        within[g.job_id] = False
            if rng.random() < 1 / 3:
                fair.add(gang.tenant, A100, gang.replica_gpus[0])
        return out

    assert walk(plain=False) == walk(plain=True)


def _kinds(cycle: _Cycle, queued: Sequence[GangRequest]) -> set[frozenset[JobId]]:
    """The numbered kinds as sets of jobs."""
    by_kind: dict[int, set[JobId]] = {}
    for g in queued:
        kind = cycle._kind_by_object.get(id(g.decision_key))
        if kind is not None:
            by_kind.setdefault(kind, set()).add(g.job_id)
    return {frozenset(jobs) for jobs in by_kind.values()}


def _kinds_by_value(queued: Sequence[GangRequest]) -> set[frozenset[JobId]]:
    by_value: dict[tuple[object, ...], set[JobId]] = {}
    for g in queued:
        by_value.setdefault(g.decision_key, set()).add(g.job_id)
    return {frozenset(jobs) for jobs in by_value.values() if len(jobs) > 1}


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_guarantee_headroom_answers_as_the_book_and_holds_while_its_tenant_is_unchanged(seed: int) -> None:
    """`_Cycle.within_guarantee` keeps each (tenant, types)'s headroom while the tenant's count of
    changes is unchanged: the headroom must answer as `within_any_guarantee` for every size, and a
    kept one must still be right whenever that count did not move (an add anywhere else in the tree,
    a variant counted against its family)."""
    rng = random.Random(seed)
    variant = GpuType("A100-80GB")
    book = QuotaBook(_tree(), (), families=((variant, A100),))
    tenants = [TenantId(t) for t in ("org", "nlp", "vision", "solo", "stranger")]
    lists = [(), (A100,), (H100,), (A100, H100), (variant,), (H100, variant)]
    kept: dict[tuple[TenantId, tuple[GpuType, ...]], tuple[int, int | None]] = {}
    for _ in range(200):
        if rng.random() < 0.4:
            book.add(rng.choice(tenants), rng.choice([A100, H100, variant]), rng.randint(1, 6))
        tenant, types = rng.choice(tenants), rng.choice(lists)
        headroom = book.guarantee_headroom(tenant, types)
        for need in range(12):
            assert (headroom is not None and need <= headroom) == book.within_any_guarantee(
                tenant, types, need
            )
        changed = book.tenant_changes.get(tenant, 0)
        before = kept.get((tenant, types))
        if before is not None and before[0] == changed:
            assert before[1] == headroom
        kept[(tenant, types)] = (changed, headroom)


def test_tables_kept_at_the_types_version_have_the_figures_of_now() -> None:
    """`Tables.table` hands back a table without looking at the figures while the type's version is
    the one its figures were found current at: through a cycle's admissions, every table it hands
    back must carry the figures a fresh look finds."""
    snapshot = build(gangs=600)
    cycle = _Cycle(snapshot, NOW)
    asked = [(g.gpu_types[0], gang_shape(g.replica_gpus), g.allow_spot) for g in snapshot.queued[:40]]
    for index, gang in enumerate(FairOrder(snapshot.queued, cycle.fair, cycle.within_guarantee)):
        cycle.decide(gang)
        if index % 7:
            continue
        for gpu_type, shape, spot in asked:
            table = cycle.tables.table(gpu_type, shape, spot, False)
            assert table.figures == Tables(cycle.inventory)._figures_now(gpu_type, spot)
    assert cycle.admissions  # the figures moved during the walk


def test_each_requests_kept_hash_is_its_keys() -> None:
    """`decision_hash` is what the cycle's setup counts in place of hashing each key: it must be the
    key's hash for every request, however made (built, replaced, copied)."""
    snapshot = build(gangs=300)
    for g in snapshot.queued:
        for request in (g, replace(g, job_id=JobId(f"{g.job_id}-copy")), copy.deepcopy(g)):
            assert request.decision_hash == hash(request.decision_key)
        # Any deciding field changed changes the key, and the hash with it (here, the run time).
        changed = replace(g, expected_runtime_s=g.expected_runtime_s + 1.0)
        assert changed.decision_key != g.decision_key
        assert changed.decision_hash == hash(changed.decision_key)


def test_kinds_are_those_numbering_every_key_by_value_gives() -> None:
    snapshot = build(gangs=400)
    rng = random.Random(7)
    picked = rng.sample(snapshot.queued, 60)
    # Equal gangs in other objects (their own key objects) and gangs sharing one key object (as the
    # scheduler's requests do), among the scenario's gangs of a kind of their own.
    copies = [
        replace(g, job_id=JobId(f"{g.job_id}-copy"), queued_at_s=g.queued_at_s + 1) for g in picked[:30]
    ]
    shared = []
    for g in picked[30:]:
        twin = replace(g, job_id=JobId(f"{g.job_id}-twin"))
        object.__setattr__(twin, "decision_key", g.decision_key)
        shared.append(twin)
    # Key objects apart at the queue's start (the setup tells kinds apart by the kept hashes first),
    # and a key object shared at once (it looks at every gang per key object).
    twin_first = (picked[30], shared[0], *(g for g in snapshot.queued if g is not picked[30]))
    for queued in ((*snapshot.queued, *copies, *shared), (*twin_first, *copies, *shared[1:])):
        cycle = _Cycle(replace(snapshot, queued=queued), NOW)
        expected = _kinds_by_value(queued)
        assert len(expected) == 60
        assert _kinds(cycle, queued) == expected
        assert cycle.kinds == len(expected)
        # Every gang of no numbered kind is counted for its tenant as one left to decide.
        numbered = {j for kind in expected for j in kind}
        left: dict[TenantId, int] = {}
        for g in queued:
            if g.job_id not in numbered:
                left[g.tenant] = left.get(g.tenant, 0) + 1
        assert cycle._unnumbered_left == left
    # The scenario as built: its few equal gangs (if any) are its only kinds.
    alone = _Cycle(snapshot, NOW)
    assert _kinds(alone, snapshot.queued) == _kinds_by_value(snapshot.queued)


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_pools_ranked_once_are_in_each_lists_sorted_order(seed: int) -> None:
    rng = random.Random(seed)
    types = [GpuType(t) for t in ("A100", "H100", "L4", "B200")]
    pools = []
    for index in range(rng.randint(0, 30)):
        # Few names and prices, so that keys tie now and then (the same name twice in a cluster).
        pool = ScalablePool(
            name=f"pool-{rng.randint(0, 3)}",
            gpu_type=rng.choice(types),
            kind=rng.choice(list(CapacityKind)),
            usd_per_gpu_hour=rng.choice((1.0, 2.0, 2.5)),
            gpus_per_node=8,
            node_count=0,
            max_nodes=rng.randint(0, 4),
            restart_risk_per_hour=rng.choice((0.0, 0.1)),
        )
        pools.append((ClusterName(f"c{rng.randint(0, 3 if index % 2 else 30)}"), pool))
    speed = {t: rng.choice((1.0, 2.0)) for t in types}

    def work_price(pool: ScalablePool) -> float:
        return pool.usd_per_gpu_hour * (1.0 + pool.restart_risk_per_hour) / speed[pool.gpu_type]

    growth = Growth(pools, work_price)
    for _ in range(20):
        asked = tuple(rng.sample(types, rng.randint(1, 4)))
        if rng.random() < 0.2:
            asked = (*asked, asked[0])
        spot = rng.random() < 0.5
        plain = sorted(
            (
                (cluster, pool)
                for gpu_type in asked
                for cluster, pool in pools
                if pool.gpu_type == gpu_type and (spot or pool.kind is not CapacityKind.SPOT)
            ),
            key=lambda item: (work_price(item[1]), item[0], item[1].name),
        )
        assert growth._in_order(asked, spot, work_price) == plain


@settings(max_examples=examples(80), deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_a_queue_sorted_on_times_then_ties_is_in_time_and_id_order(seed: int) -> None:
    rng = random.Random(seed)
    base = build(gangs=60).queued
    times = [0.0, -0.0, 1.5, 2.0, 1e9] + ([math.nan] if rng.random() < 0.15 else [])
    gangs = [
        replace(
            rng.choice(base),
            job_id=JobId(f"job-{rng.randint(0, 40)}"),  # repeated ids now and then
            queued_at_s=rng.choice(times),
        )
        for _ in range(rng.randint(0, 40))
    ]
    sorted_here = list(gangs)
    _sort_by_queue_order(sorted_here)
    plain = sorted(gangs, key=lambda g: (g.queued_at_s, g.job_id))
    assert [id(g) for g in sorted_here] == [id(g) for g in plain]
