"""The carried cycle's passes over the whole queue give the event loop its turns (issue 33).

A C-level or compiled pass over a million queued jobs holds the GIL to its end: the queue's tuple
(`snapshot.GangRequests.carry`, 24 ms at a million) and the plan's comparison of the queue with the
last (`queue_carry._changes`, 14 to 18 ms), in which no API call could run. Each now calls the
cycle's `between` every 65,536 places, and gives what the single pass gave.
"""

from __future__ import annotations

import pytest

from federation.scheduling import snapshot as snapshot_module
from federation.scheduling.snapshot import GangRequests, PlacerInputs
from federation.store.records import SchedulingSettings
from placement.model import GangRequest, GpuType, JobId, TenantId
from placement.queue_carry import _changes
from tests.conftest import build_job


def _gangs(count: int, prefix: str = "g") -> list[GangRequest]:
    return [
        GangRequest(JobId(f"{prefix}{n:06d}"), TenantId(f"t{n % 7}"), 0, float(n), (8,), (GpuType("A100"),))
        for n in range(count)
    ]


def test_the_queues_comparison_steps_aside_and_finds_the_same_changes() -> None:
    last = _gangs(70_000)
    new = _gangs(3, "new")
    queued = (*last[:10], *last[11:], *new)
    calls = []
    stepped = _changes(tuple(last), queued, lambda: calls.append(1))
    assert calls, "no turn given over 70,000 places"
    assert stepped == _changes(tuple(last), queued)
    assert stepped is not None
    removed, inserted = stepped
    assert removed == [last[10]]
    assert inserted == new


def test_the_carried_queues_tuple_is_read_in_runs_with_turns_between(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot_module, "_QUEUE_RUN", 4)
    inputs = PlacerInputs(settings=SchedulingSettings(), tenants=(), users={}, approvals=())
    jobs = [build_job(f"j{n:03d}", tenant="t0", gpus=8, gpu="A100") for n in range(19)]
    requests = GangRequests()
    calls = []
    queue = requests.carry(None, lambda: jobs, inputs, lambda: calls.append(1))
    assert [r.job_id for r in queue.requests] == [j.job_id for j in jobs]
    assert isinstance(queue.requests, tuple)
    # One turn per run of 4 (and those of the walk of every job, every 256).
    assert len(calls) >= 19 // 4
    # Without turns (a caller that passes none), the one C-level call.
    again = requests.carry({}, lambda: jobs, inputs)
    assert again.requests == queue.requests
