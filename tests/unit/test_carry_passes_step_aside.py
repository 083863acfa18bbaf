"""The carried cycle's passes over the whole queue give the event loop its turns (issue 33).

A C-level or compiled pass over a million queued jobs holds the GIL to its end: the plan's comparison
of the queue with the last (`queue_carry._changes`, 14 to 18 ms), in which no API call could run,
calls the cycle's `between` every 65,536 places, and gives what the single pass gave (a steady cycle
over the scheduler's carried queue no longer makes it: it takes the queue's edits). The queue's tuple
(`snapshot.GangRequests.carry`, 24 ms at a million, once read in runs) is no longer made: the queue is
handed in chunks.
"""

from __future__ import annotations

import pytest

from federation.scheduling.snapshot import GangRequests, PlacerInputs
from federation.store.records import SchedulingSettings
from placement import queue_chunks
from placement.model import GangRequest, GpuType, JobId, TenantId
from placement.queue_carry import _changes
from placement.queue_chunks import ChunkedQueue
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


def test_the_carried_queue_is_handed_in_chunks_and_a_carry_of_changes_copies_only_those_touched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The queue's tuple is gone: the carried queue is chunks of it (`placement.queue_chunks`), and a
    carry of changes copies the chunks the changes touch, not the queue, so no pass is left to step
    aside in. (The carry of every job still walks them all, with turns every 256.)"""
    monkeypatch.setattr(queue_chunks, "CHUNK", 4)
    inputs = PlacerInputs(settings=SchedulingSettings(), tenants=(), users={}, approvals=())
    jobs = [build_job(f"j{n:03d}", tenant="t0", gpus=8, gpu="A100") for n in range(19)]
    requests = GangRequests()
    calls = []
    queue = requests.carry(None, lambda: jobs, inputs, lambda: calls.append(1))
    assert [r.job_id for r in queue.requests] == [j.job_id for j in jobs]
    assert isinstance(queue.requests, ChunkedQueue)
    assert calls
    copied = requests.queue_copied
    late = build_job("j999", tenant="t0", gpus=8, gpu="A100")
    again = requests.carry({jobs[5].job_id: None, late.job_id: late}, lambda: [*jobs, late], inputs)
    assert [r.job_id for r in again.requests] == [j.job_id for j in [*jobs[:5], *jobs[6:], late]]
    # The chunk that held j005 (4 read) and the tail (its 3 and the new request): not 20 requests.
    assert requests.queue_copied - copied == 4 + 4
    edits = again.requests.edits_from(queue.requests)
    assert edits is not None
    assert [g.job_id for g in edits[0]] == ["j005"]
    assert [g.job_id for g in edits[1]] == ["j999"]
