"""A plan's waits in chunks shared with the last plan's, and the scheduler's comparison of the two by
their chunks (issue 33, `placement/chunks.py`, `scheduler._aligned_by_chunks`).

A deep queue's stretches keep their waits in chunks (`stretch_carry`), which the plan hands on as its
waits; the scheduler finds the waits unchanged since the last cycle by the chunks the two plans share,
and aligns only the places between them wait by wait. Seeded series of edits: chunks kept, copied with
waits put in or taken out, made anew, dropped; each run found must hold the very same objects in both
lists, every shared chunk must be in a run, and only the places between shared chunks are compared.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from random import Random

import pytest

from federation.scheduling import scheduler as scheduler_module
from federation.scheduling.scheduler import _aligned, _aligned_items
from federation.store.job_store import InMemoryJobStore
from placement.chunks import Chunks, same_chunks
from placement.model import JobId, WaitCode, Waiting, WaitReason
from tests.unit.reconcile_world import reasons_scheduler


def _wait(n: int) -> Waiting:
    return Waiting(JobId(f"j{n:06d}"), ())


def test_chunks_read_as_the_tuple_of_their_items_with_empty_chunks_between() -> None:
    items = [_wait(n) for n in range(9)]
    chunks = Chunks(((), tuple(items[:3]), (), (), tuple(items[3:4]), tuple(items[4:]), ()))
    flat = tuple(items)
    assert len(chunks) == 9
    assert tuple(chunks) == flat
    assert [chunks[n] for n in range(-9, 9)] == [*items, *items]
    assert [chunks.span(a, b) for a in range(10) for b in range(10)] == [
        flat[a:b] for a in range(10) for b in range(10)
    ]
    assert chunks[2:7] == flat[2:7]
    assert chunks[::2] == flat[::2]
    assert chunks == flat
    assert Chunks(()) == ()
    with pytest.raises(IndexError):
        chunks[9]


def _check_runs(runs: list[tuple[int, int, int]], these: Chunks[Waiting], those: Chunks[Waiting]) -> None:
    a, b = these.as_tuple(), those.as_tuple()
    ends = (0, 0)
    for start, stop, from_those in runs:
        assert start >= ends[0]
        assert from_those >= ends[1]
        assert stop > start
        assert all(
            x is y for x, y in zip(a[start:stop], b[from_those : from_those + stop - start], strict=True)
        )
        ends = (stop, from_those + stop - start)


@pytest.mark.parametrize("seed", range(10))
def test_the_waits_unchanged_are_found_by_the_chunks_both_plans_hold(seed: int) -> None:
    rng = Random(seed)
    made = 0

    def chunk(size: int) -> tuple[Waiting, ...]:
        nonlocal made
        made += size
        return tuple(_wait(n) for n in range(made - size, made))

    last = Chunks(tuple(chunk(rng.randrange(1, 40)) for _ in range(rng.randrange(1, 60))))
    for _ in range(30):
        shared = 0
        out: list[tuple[Waiting, ...]] = []
        for kept in last.chunks:
            roll = rng.random()
            if roll < 0.6:
                out.append(kept)
                shared += 1
            elif roll < 0.75 and kept:
                # Copied with a wait taken out and one put in (a stretch's edits).
                items = list(kept)
                del items[rng.randrange(len(items))]
                items.insert(rng.randrange(len(items) + 1), _wait(10**6 + made))
                made += 1
                out.append(tuple(items))
            elif roll < 0.85:
                out.append(chunk(rng.randrange(1, 20)))  # made anew (gangs decided one by one)
            elif roll < 0.9:
                out.append(())
            # else: dropped (a stretch gone)
            if rng.random() < 0.1:
                out.append(chunk(rng.randrange(1, 5)))
        these = Chunks(tuple(out))
        runs, compared = _aligned(these, last, lambda: None)
        assert runs is not None
        _check_runs(runs, these, last)
        covered = sum(stop - start for start, stop, _ in runs)
        assert covered >= sum(len(c) for c in these.chunks if any(c is k for k in last.chunks) and c)
        # Only the places between shared chunks are compared wait by wait (not those put in where the
        # last had nothing between the same two chunks).
        assert compared <= len(these) - sum(
            len(c) for c in these.chunks if c and any(c is k for k in last.chunks)
        )
        # As many waits found unchanged as the item-by-item alignment finds, or more.
        item_runs = _aligned_items(these.as_tuple(), last.as_tuple(), lambda: None)
        if item_runs is not None:
            assert covered >= sum(stop - start for start, stop, _ in item_runs) - len(these) // 4
        last = these
    assert made


def test_the_chunks_shared_are_found_in_order_only() -> None:
    a, b, c = (_wait(0),), (_wait(1), _wait(2)), (_wait(3),)
    # `c` comes before `a` in the last: only the runs in order in both count.
    assert same_chunks(Chunks((a, b, c)), Chunks((c, a, b))) == [(0, 3, 1)]
    assert same_chunks(Chunks(((), a)), Chunks(((), a))) == [(0, 1, 0)]
    assert same_chunks(Chunks((a,)), Chunks((b,))) == []


@pytest.mark.parametrize("chunked", [True, False])
async def test_a_new_leaders_first_writing_compares_the_places_left_and_the_changes_only(
    chunked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new leader writes a bounded share of the reasons a cycle (`WAIT_WRITES_PER_CYCLE`). The
    cycle's waits are kept with the places it left unwritten, so the next cycle compares those and
    what changed, not every wait; every reason is written in the end, as a scheduler that writes them
    all at once writes them."""
    monkeypatch.setattr(scheduler_module, "WAIT_WRITES_PER_CYCLE", 40)
    rng = Random(7)
    reasons = [(WaitReason(WaitCode.NO_CLUSTER_HAS_GPU_TYPE, f"no room {n}"),) for n in range(3)]
    waits = [Waiting(JobId(f"j{n:04d}"), rng.choice(reasons)) for n in range(300)]
    store, whole = InMemoryJobStore(), InMemoryJobStore()
    bounded, at_once = reasons_scheduler(store), reasons_scheduler(whole)
    semaphore = asyncio.Semaphore(4)

    def handed(items: list[Waiting]) -> Sequence[Waiting]:
        return (
            Chunks(tuple(tuple(items[at : at + 16]) for at in range(0, len(items), 16)))
            if chunked
            else tuple(items)
        )

    last = handed(waits)
    compared, cycles = [], 0
    while True:
        cycles += 1
        # Between cycles a wait is made anew here and there, and one job leaves for another.
        if cycles > 1:
            at = rng.randrange(len(waits))
            waits[at] = Waiting(waits[at].job_id, rng.choice(reasons))
            waits.append(Waiting(JobId(f"k{cycles:04d}"), reasons[0]))
        these = handed(waits)
        if chunked and isinstance(last, Chunks):
            # The chunks that hold the same waits are the last plan's objects, as a stretch's are.
            kept = {tuple(map(id, c)): c for c in last.chunks}
            chunks = these.chunks if isinstance(these, Chunks) else ()
            these = Chunks(tuple(kept.get(tuple(map(id, c)), c) for c in chunks))
        last = these
        before = bounded.waits_compared
        later = await bounded._write_reasons(these, None, semaphore, None)
        compared.append(bounded.waits_compared - before)
        if not later:
            break
        assert cycles < 20
    monkeypatch.setattr(scheduler_module, "WAIT_WRITES_PER_CYCLE", 16_384)
    assert not await at_once._write_reasons(last, None, semaphore, None)
    assert await store.list_wait_reasons() == await whole.list_wait_reasons()
    assert len(await store.list_wait_reasons()) == len(waits)
    # The first cycle read every wait; the next ones, kept with the places left, read few.
    assert compared[0] == 300
    if chunked:
        assert max(compared[1:]) < 100, compared
