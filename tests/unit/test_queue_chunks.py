"""The scheduler's queue in chunks, handed to the placer with its edits (issue 33,
`placement/queue_chunks.py`).

Seeded series of edits (submissions, removals, requests replaced, in bursts of every size, and the
chunks made afresh now and then): after each, the queue handed is the requests in the carried map's
order, its edits make it from the queue handed before it (as collections), no older queue changed,
and the requests copied are those of the chunks the edits touched, not the queue's.
"""

from __future__ import annotations

import copy
import pickle
from collections import Counter
from random import Random

import pytest

from placement import queue_chunks
from placement.fairshare import tenant_lists
from placement.model import GangRequest, GpuType, JobId, TenantId
from placement.queue_carry import QueueCarry
from placement.queue_chunks import ChunkedQueue, QueueChunks


def _gang(n: int, at_s: float | None = None) -> GangRequest:
    return GangRequest(
        JobId(f"j{n:06d}"),
        TenantId(f"t{n % 5}"),
        0,
        float(n) if at_s is None else at_s,
        (8,),
        (GpuType("A100"),),
    )


def _ids(items: object) -> Counter[int]:
    return Counter(map(id, items))  # type: ignore[call-overload]


@pytest.mark.parametrize("seed", range(8))
def test_the_chunks_follow_their_edits_and_hand_them_on(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    chunk = 8 if seed % 2 else 64
    monkeypatch.setattr(queue_chunks, "CHUNK", chunk)
    rng = Random(seed)
    chunks = QueueChunks()
    # The carried map's order: a job put in goes last, a replaced request keeps its place.
    expected: dict[JobId, GangRequest] = {}
    made = 0
    for _ in range(rng.randrange(0, 300)):
        g = _gang(made)
        expected[g.job_id] = g
        made += 1
    chunks.reset(list(expected.values()))
    last: ChunkedQueue | None = None
    handed: list[tuple[ChunkedQueue, tuple[GangRequest, ...]]] = []
    took_edits = 0
    for cycle in range(80):
        touched: set[JobId] = set()
        appended = replaced = taken_out = 0
        for _ in range(rng.choice([0, 1, 1, 2, 5, 30, 200])):
            roll = rng.random()
            free = [j for j in expected if j not in touched]
            if roll < 0.4 or not free:
                g = _gang(made)
                made += 1
                expected[g.job_id] = g
                chunks.edit(g.job_id, None, g)
                appended += 1
            elif roll < 0.75:
                job_id = rng.choice(free)
                chunks.edit(job_id, expected.pop(job_id), None)
                taken_out += 1
            else:
                job_id = rng.choice(free)
                old = expected[job_id]
                new = _gang(int(job_id[1:]), at_s=old.queued_at_s + rng.choice([0.0, 0.5]))
                expected[job_id] = new
                chunks.edit(job_id, old, new)
                replaced += 1
            touched.add(job_id if roll >= 0.4 and free else g.job_id)
        afresh = chunks.made_afresh
        if rng.random() < 0.05:
            chunks.reset(list(expected.values()))
            afresh = chunks.made_afresh
        copied = chunks.copied
        queue = chunks.queue()
        assert list(queue) == list(expected.values()), (seed, cycle)
        assert len(queue) == len(expected)
        edits = queue.edits_from(last) if last is not None else None
        if last is not None and chunks.made_afresh == afresh and edits is None:
            # Only a reset since the last queue hands none.
            assert queue.based_on is None
        if edits is not None:
            took_edits += 1
            removed, inserted = edits
            assert len(removed) == taken_out + replaced
            assert len(inserted) == appended + replaced
            # The edits make this queue from the last, as collections.
            assert _ids(last) - _ids(removed) + _ids(inserted) == _ids(queue), (seed, cycle)
            assert not _ids(removed) - _ids(last)
        if chunks.made_afresh == afresh:
            # The chunks the edits touched, and the tail's, are copied: not the queue.
            assert chunks.copied - copied <= chunk * (taken_out + replaced + 1) + appended, (seed, cycle)
        # No queue handed before changed; only the one handed last is what the next edits are from.
        for old_queue, content in handed[-6:]:
            assert tuple(old_queue) == content
            assert queue.edits_from(old_queue) is None or old_queue is last
        handed.append((queue, tuple(expected.values())))
        last = queue
    assert took_edits > 60


def test_many_removals_make_the_chunks_afresh_with_the_edits_still_handed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(queue_chunks, "CHUNK", 4)
    gangs = [_gang(n) for n in range(400)]
    chunks = QueueChunks()
    chunks.reset(gangs)
    first = chunks.queue()
    for g in gangs[::2] + gangs[1:300:2]:
        chunks.edit(g.job_id, g, None)
    afresh = chunks.made_afresh
    queue = chunks.queue()
    assert chunks.made_afresh == afresh + 1
    assert list(queue) == gangs[301::2]
    edits = queue.edits_from(first)
    assert edits is not None
    assert _ids(first) - _ids(edits[0]) == _ids(queue)
    # And edits after that go on from the new chunks.
    late = _gang(999)
    chunks.edit(late.job_id, None, late)
    chunks.edit(gangs[301].job_id, gangs[301], None)
    after = chunks.queue()
    assert list(after) == [*gangs[303::2], late]
    assert after.edits_from(queue) == ([gangs[301]], [late])


def test_a_chunked_queue_reads_as_the_tuple_of_its_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_chunks, "CHUNK", 3)
    gangs = [_gang(n) for n in range(10)]
    chunks = QueueChunks()
    chunks.reset(gangs)
    queue = chunks.queue()
    flat = tuple(gangs)
    assert len(queue) == 10
    assert tuple(queue) == flat
    assert queue[:4] == flat[:4]
    assert queue[:0] == ()
    assert queue[:99] == flat
    assert queue[3] is gangs[3]
    assert queue[-1] is gangs[-1]
    assert queue[2:7:2] == flat[2:7:2]
    assert queue == flat
    assert flat == queue
    assert queue != flat[:-1]
    assert hash(queue) == hash(flat)
    assert list(reversed(queue)) == gangs[::-1]
    assert gangs[5] in queue
    assert queue.index(gangs[5]) == 5
    # Copied and pickled as the tuple of its requests.
    assert pickle.loads(pickle.dumps(queue)) == flat
    assert copy.copy(queue) == flat
    with pytest.raises(IndexError):
        queue[10]


def test_the_placer_takes_the_edits_only_from_the_queue_it_planned_last() -> None:
    """A queue handed but never planned (a cycle that failed between the carry and the plan): the next
    queue's edits are from that one, not from the queue the placer planned last, so the placer compares
    the two queues instead."""
    gangs = [_gang(n) for n in range(300)]
    chunks = QueueChunks()
    chunks.reset(gangs)
    carry = QueueCarry()
    first = chunks.queue()
    carry.begin(first)
    carry.tenant_lists()
    late = _gang(1000)
    chunks.edit(late.job_id, None, late)
    chunks.queue()  # never planned
    chunks.edit(gangs[7].job_id, gangs[7], None)
    third = chunks.queue()
    taken, compared = carry.edits_taken, carry.compared
    carry.begin(third)
    assert carry.tenant_lists() == tenant_lists(third)[0]
    assert (carry.edits_taken, carry.edited) == (taken, 1)
    assert carry.compared == compared + len(first) + len(third)
    # And from the queue it planned, the edits are taken: nothing compared.
    chunks.edit(gangs[8].job_id, gangs[8], None)
    fourth = chunks.queue()
    carry.begin(fourth)
    assert carry.tenant_lists() == tenant_lists(fourth)[0]
    assert (carry.edits_taken, carry.compared) == (taken + 1, compared + len(first) + len(third))
