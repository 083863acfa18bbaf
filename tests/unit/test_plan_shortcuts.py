"""Shortcuts of the scheduler's cycle at queue depth (issue 33), each compared with what it stands for,
made the plain way, on the same inputs.

- A wait handed to another job (`Waiting.for_job`) is made without `Waiting`'s guard and then takes
  its class: it is the same value as one made by `Waiting(...)`, and as immutable.
- A stretch of the queue taken in bulk is put in queue order by sorting the positions on the list of
  queue times when no two gangs share one (`stretch_carry.by_queue_order`): the sort on (time, id).
- The scheduler maps by id only the jobs the plan names (`scheduler._named`), not every live job:
  the same entries as the full map had for those ids.
"""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.scheduling.scheduler import _named
from federation.store.job_store import Stored
from placement.model import (
    Admission,
    Alternative,
    CapacityKind,
    ClusterName,
    GangRequest,
    GpuType,
    JobId,
    Move,
    Plan,
    Preemption,
    PreemptionReason,
    TenantId,
    Waiting,
    WaitReason,
)
from placement.model import WaitCode as Code
from placement.model_plan import wait_for_job
from placement.stretch_carry import by_queue_order
from tests.conftest import build_job
from tests.properties import examples


def test_a_wait_for_another_job_is_the_value_waiting_makes() -> None:
    reasons = (WaitReason(Code.INSUFFICIENT_CAPACITY, "full", ClusterName("c1"), GpuType("A100")),)
    made = wait_for_job(Waiting(JobId("j1"), reasons), JobId("j2"))
    plain = Waiting(JobId("j2"), reasons)
    assert type(made) is Waiting
    assert (made == plain, hash(made) == hash(plain), made.key == plain.key) == (True, True, True)
    assert pickle.loads(pickle.dumps(made)) == plain
    assert copy.deepcopy(made) == plain
    with pytest.raises(AttributeError, match="immutable"):
        made.job_id = JobId("j3")
    assert made.job_id == "j2"


def test_the_jobs_by_id_are_the_ones_the_plan_names_as_the_snapshot_read_them() -> None:
    records = [build_job(f"job-{n}") for n in range(40)]
    live = [Stored(record, 100 + n) for n, record in enumerate(records)]
    result = Plan(
        admissions=(
            Admission(JobId("job-3"), ClusterName("c1"), GpuType("A100"), CapacityKind.PRIVATE, 1.0, 1.0),
        ),
        preemptions=(
            _preemption("job-7"),
            # A victim the snapshot did not read (gone meanwhile) is not in the map, as before.
            _preemption("gone"),
        ),
        moves=(_move("job-11"),),
        bursts={JobId("job-39"): _alternative()},
    )
    everything = {s.value.job_id: s for s in live}
    named = _named(result, everything)
    assert named == {JobId(j): everything[JobId(j)] for j in ("job-3", "job-7", "job-11", "job-39")}
    assert all(named[j] is everything[j] for j in named)
    assert _named(Plan(), everything) == {}


def _preemption(victim: str) -> Preemption:
    return Preemption(
        JobId(victim),
        TenantId("t1"),
        ClusterName("c1"),
        GpuType("A100"),
        8,
        PreemptionReason.LOWER_PRIORITY,
        30.0,
        JobId("job-3"),
        0.0,
    )


def _alternative() -> Alternative:
    return Alternative(ClusterName("c9"), GpuType("A100"), CapacityKind.ON_DEMAND, 3.0, 24.0)


def _move(job_id: str) -> Move:
    return Move(
        JobId(job_id),
        TenantId("t1"),
        8,
        ClusterName("c9"),
        GpuType("A100"),
        3.0,
        ClusterName("c1"),
        GpuType("A100"),
        CapacityKind.PRIVATE,
        1.0,
        *(3600.0, 3600.0, 60.0, 24.0, 8.0, 0.5, 15.5, 7200.0),
    )


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 1.0, 1.5, 2.0, 7.25, 1e9]) | st.floats(0, 1e6), max_size=40),
    st.permutations(list(range(40))),
)
def test_a_stretch_in_queue_order_is_the_sort_on_time_and_id(times: list[float], ids: list[int]) -> None:
    """`stretch_carry.by_queue_order` (the positions sorted on the times, when no two gangs share one) is the
    sort on (queue time, job id): with ties of time and without, in any order."""
    gangs = [
        GangRequest(
            job_id=JobId(f"j{job}"),
            tenant=TenantId(f"t{job % 3}"),
            priority=0,
            queued_at_s=at,
            replica_gpus=(8,),
            gpu_types=(GpuType("A100"),),
        )
        for at, job in zip(times, ids, strict=False)
    ]
    plain = sorted(gangs, key=lambda g: (g.queued_at_s, g.job_id))
    ordered, numbers = by_queue_order(gangs)
    assert [g.job_id for g in ordered] == [g.job_id for g in plain]
    assert numbers == all(g.queued_at_s == g.queued_at_s for g in gangs)
