"""The cycle's per-gang shortcuts for a deep queue plan exactly as without them (issue 33).

- The scheduler's kept requests share one decision key object per kind of gang
  (`snapshot.GangRequests`), and the placer numbers kinds by that object, hashing each distinct key
  once (`plan._Cycle`). Plans over gangs whose equal keys are one object must be the bytes of plans
  over the same gangs with a key object each, and of plans deciding every gang afresh.
- `_Cycle.within_guarantee` keeps its answer per (tenant, types, GPUs) while usage is unchanged:
  plans must be those of asking the quota book every time, including cycles in which admissions
  move tenants past their guarantees.

Each compared over several cycles of bench/placer's federation (30 tenants with guarantees and
borrowing limits), each next snapshot following the last plan with arrivals, ends and admissions.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from federation.scheduling.snapshot import GangRequests, PlacerInputs, gang_request
from federation.store.jobs import JobRecord
from federation.store.records import SchedulingSettings
from placement.model import GangRequest, Plan, Snapshot
from placement.plan import _Cycle, _plan, plan
from tests.conftest import build_job
from tests.unit.plan_cycles import bench_cycles, plan_bytes

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
    built = requests.all(jobs, INPUTS)
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
    requests.all(jobs, INPUTS)
    assert len(requests._kinds) == 3000
    requests.keep_only({jobs[0].job_id})
    assert len(requests._kinds) == 1
    again = requests.get(_job(5000, tenant="t0"), INPUTS)
    assert again.decision_key is requests.get(jobs[0], INPUTS).decision_key
