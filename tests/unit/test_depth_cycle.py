"""The cycle's per-gang shortcuts for a deep queue plan exactly as without them (issue 33).

- The scheduler's kept requests share one decision key object per kind of gang
  (`snapshot.GangRequests`), and the placer numbers kinds by that object, hashing each distinct key
  once (`plan._Cycle`). Plans over gangs whose equal keys are one object must be the bytes of plans
  over the same gangs with a key object each, and of plans deciding every gang afresh.
- A stretch of the queue whose gangs all take their kind's wait as decided on the cycle's state is
  decided at once, in the order the fair walk would take them (`_Cycle.take_in_bulk`). Plans must be
  the bytes of plans without it, and of plans deciding every gang afresh, with the question asked
  after every gang (so that it is asked where it could go wrong: tenants settled and not, standings
  of guarantees, priorities and shares, the walk's last tenant).
- `_Cycle.within_guarantee` keeps its answer per (tenant, types, GPUs) while usage is unchanged:
  plans must be those of asking the quota book every time, including cycles in which admissions
  move tenants past their guarantees.

The checks that patch the placer (`Bulk`, the guarantee answers) test nothing where the placer runs
compiled (mypyc: compiled modules call each other directly, `placement/_compiled.py`); there they
run again in a process of the interpreted sources.

Each compared over several cycles of bench/placer's federation (30 tenants with guarantees and
borrowing limits), each next snapshot following the last plan with arrivals, ends and admissions.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.scheduling.snapshot import GangRequests, PlacerInputs, gang_request
from federation.store.jobs import JobRecord
from federation.store.records import SchedulingSettings
from placement import plan as plan_module
from placement.fairshare import FairOrder
from placement.model import (
    CapacityKind,
    ClusterName,
    ClusterState,
    GangRequest,
    GpuQuota,
    GpuType,
    JobId,
    NodePool,
    Plan,
    Provider,
    Snapshot,
    TenantId,
    TenantQuota,
)
from placement.plan import _Cycle, _plan, plan
from tests.conftest import build_job
from tests.properties import examples
from tests.unit.plan_cycles import bench_cycles, patches_sources, plan_bytes
from tests.unit.test_plan_reuse import _copies, deep_queues

ROOT = Path(__file__).resolve().parents[2]

INPUTS = PlacerInputs(settings=SchedulingSettings(), tenants=(), users={}, approvals=())


def _shared_keys(snapshot: Snapshot) -> Snapshot:
    """The snapshot with every queued gang's key replaced by one object per distinct key, as the
    scheduler's kept requests hold them."""
    kinds: dict[tuple[object, ...], tuple[object, ...]] = {}
    queued = []
    for gang in snapshot.queued:
        copy = replace(gang)
        object.__setattr__(copy, "decision_key", kinds.setdefault(gang.decision_key, gang.decision_key))
        queued.append(copy)
    assert len(kinds) < len(queued)  # the federation's queue repeats kinds: the shortcut is exercised
    return replace(snapshot, queued=tuple(queued))


def test_plans_are_the_same_bytes_whether_equal_keys_are_one_object_or_many() -> None:
    checked = 0

    def both(snapshot: Snapshot, now: float) -> Plan:
        nonlocal checked
        separate = plan(snapshot, now=now)
        shared = _shared_keys(snapshot)
        assert plan_bytes(plan(shared, now=now)) == plan_bytes(separate)
        assert plan_bytes(_plan(shared, now, reuse=False)) == plan_bytes(separate)
        checked += 1
        return separate

    for _ in bench_cycles(1500, 4, both):
        pass
    assert checked == 4


@patches_sources
def test_the_kept_guarantee_answers_plan_as_asking_the_book_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cycles = list(bench_cycles(1500, 4, lambda s, now: plan(s, now=now)))
    admitted = [len(p.admissions) for _, _, p in cycles]
    assert all(admitted), admitted  # usage moves during each cycle: the kept answers are dropped

    def asked(self: _Cycle, gang: GangRequest) -> bool:
        return self.book.within_any_guarantee(gang.tenant, gang.gpu_types, gang.gpu_count)

    monkeypatch.setattr(_Cycle, "within_guarantee", asked)
    for snapshot, now, kept in cycles:
        assert plan_bytes(plan(snapshot, now=now)) == plan_bytes(kept)


def _job(n: int, *, gpus: int = 8, tenant: str = "vision") -> JobRecord:
    return build_job(f"j{n}", tenant=tenant, gpus=gpus, gpu="A100")


def test_kept_requests_share_one_key_object_per_kind_and_equal_a_fresh_build() -> None:
    requests = GangRequests()
    jobs = [_job(n, gpus=8 if n % 2 else 4) for n in range(6)]
    built, placed = requests.split(jobs, INPUTS, ())
    assert placed == []  # every job is queued
    assert built[0].decision_key is built[2].decision_key is built[4].decision_key
    assert built[1].decision_key is built[3].decision_key is built[5].decision_key
    assert built[0].decision_key is not built[1].decision_key
    for job, request in zip(jobs, built, strict=True):
        fresh = gang_request(job, INPUTS)
        assert request == fresh
        assert request.decision_key == fresh.decision_key
        assert requests.get(job, INPUTS) is request  # kept: the same object next cycle


def test_kinds_no_kept_request_has_are_forgotten() -> None:
    requests = GangRequests()
    jobs = [_job(n, tenant=f"t{n}") for n in range(3000)]  # a kind each (the tenant is in the key)
    requests.split(jobs, INPUTS, ())
    assert len(requests._kinds) == 3000
    requests.keep_only({jobs[0].job_id})
    assert len(requests._kinds) == 1
    again = requests.get(_job(5000, tenant="t0"), INPUTS)
    assert again.decision_key is requests.get(jobs[0], INPUTS).decision_key


class Bulk:
    """The bulk question asked after every gang, with what it took counted, or never asked."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.taken: list[int] = []
        self.off = False
        asked = _Cycle.take_in_bulk

        def counted(cycle: _Cycle, order: FairOrder, between: object) -> int:
            if self.off:
                return 0
            took = asked(cycle, order, between)  # type: ignore[arg-type]
            self.taken.append(took)
            return took

        monkeypatch.setattr(plan_module, "_BULK_FIRST_CHECK", 1)
        monkeypatch.setattr(plan_module, "_BULK_PER_KIND", 0)
        monkeypatch.setattr(_Cycle, "take_in_bulk", counted)

    def without(self, snapshot: Snapshot, now: float) -> Plan:
        self.off = True
        try:
            return plan(snapshot, now=now)
        finally:
            self.off = False


@pytest.fixture
def bulk(monkeypatch: pytest.MonkeyPatch) -> Bulk:
    return Bulk(monkeypatch)


def _alike(bulk: Bulk, snapshot: Snapshot, now: float) -> Plan:
    taken = plan(snapshot, now=now)
    expected = plan_bytes(taken)
    assert plan_bytes(bulk.without(snapshot, now)) == expected
    assert plan_bytes(_plan(snapshot, now, reuse=False)) == expected
    return taken


@patches_sources
def test_the_busy_federations_cycles_plan_alike_with_stretches_taken_in_bulk(bulk: Bulk) -> None:
    """bench/placer's federation cycle after cycle (30 tenants, guarantees, borrowing, priorities,
    preemption, backfill), as built and with each queued gang three times."""
    seen = 0

    def both(snapshot: Snapshot, now: float) -> Plan:
        nonlocal seen
        seen += 1
        _alike(bulk, _copies(snapshot, 3), now)
        return _alike(bulk, snapshot, now)

    for _ in bench_cycles(800, 4, both):
        pass
    # Its tenants each have kinds of their own and standings that differ, so few stretches settle
    # here: this is the check that asking changes nothing; the next test takes stretches.
    assert seen == 4
    assert bulk.taken, "never asked"


A100, H100 = GpuType("A100"), GpuType("H100")


def _depth(tenants: int, per_tenant: int, free: int, arrivals: int = 0) -> Snapshot:
    """bench/scale_depth's kind of queue, more mixed: tenants of two priorities (a few with some of
    each), some with guarantees they can run within and borrowing limits, two GPU types, clusters
    mostly full (`free` nodes with room), so that a few gangs are admitted and most wait."""
    clusters = tuple(
        ClusterState(
            ClusterName(f"c{c:02d}"),
            Provider.PRIVATE,
            "dc1",
            (
                NodePool("a100", A100, CapacityKind.PRIVATE, 1.4, 8, (8 if c < free else 0, 0)),
                NodePool("h100", H100, CapacityKind.PRIVATE, 2.8, 8, (0, 4 if c % 3 == 0 else 0)),
            ),
        )
        for c in range(10)
    )
    quotas = tuple(
        TenantQuota(
            TenantId(f"t{t}"),
            quotas=(GpuQuota(A100, guaranteed_gpus=16, borrowing_limit_gpus=24),) if t % 4 == 0 else (),
        )
        for t in range(tenants)
    )
    queued = []
    for n in range(tenants * per_tenant + arrivals):
        t = n % tenants
        priority = 10 if t % 5 == 1 or (t % 5 == 2 and n % 7 == 0) else 0
        gpus = 8 if t % 3 else 4
        types = (A100,) if t % 2 else (A100, H100)
        queued.append(GangRequest(JobId(f"q{n:05d}"), TenantId(f"t{t}"), priority, 100.0 + n, (gpus,), types))
    return Snapshot(tuple(queued), (), quotas, clusters)


@patches_sources
@pytest.mark.parametrize("free", [0, 3])
def test_a_deep_mixed_queue_plans_alike_cycle_after_cycle(bulk: Bulk, free: int) -> None:
    """Cycles with arrivals between them: the plans are the same bytes as without stretches taken
    in bulk. Tenants with gangs of two priorities never settle and end stretches, so a fifth or so
    of this queue is taken in bulk (bench/scale_depth's queue, of one standing a tenant: nearly all)."""
    for cycle in range(3):
        _alike(bulk, _depth(tenants=24, per_tenant=60, free=free, arrivals=7 * cycle), 5000.0 + cycle)
    assert sum(bulk.taken) > 24 * 20


@patches_sources
@settings(max_examples=examples(120), deadline=None)
@given(deep_queues(), st.sampled_from([0.0, 50.0, 1e4]))
def test_any_deep_queue_plans_alike_with_stretches_taken_in_bulk(snapshot: Snapshot, now: float) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        _alike(Bulk(monkeypatch), snapshot, now)
