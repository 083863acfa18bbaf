"""Group commit under load: once a request has gone and more callers came while it was in flight,
the flusher lingers for more (`LINGER_S`), unless `linger_until` callers wait; a lone caller on an
idle server is sent at once. Lingers here are an hour long, so that a test that passes cannot have
waited one out: what ends a linger is the callers."""

from __future__ import annotations

import asyncio

from federation.store.group_commit import GroupCommit
from federation.store.kv import TxnResult
from tests.unit.test_group_commit import CountingKv, create

HOUR = 3600.0


async def in_flight(kv: CountingKv) -> None:
    """Until the first request is sent (a few turns of the loop; at most ten)."""
    for _ in range(10):
        if kv.requests:
            break
        await asyncio.sleep(0)
    assert kv.requests == [1]


async def test_a_lone_caller_on_an_idle_server_is_sent_at_once() -> None:
    kv = CountingKv()
    group = GroupCommit(kv, linger_s=HOUR)
    async with asyncio.timeout(30):  # a guard: it would linger an hour
        for i in range(3):
            assert (await group.run(create(f"/k/{i}".encode()))).succeeded
    assert kv.requests == [1, 1, 1]


async def test_callers_that_come_while_a_request_is_in_flight_wait_for_more_and_go_together() -> None:
    kv = CountingKv()
    group = GroupCommit(kv, linger_s=HOUR, linger_until=4)
    first = asyncio.create_task(group.run(create(b"/k/first")))
    await in_flight(kv)
    during = [asyncio.create_task(group.run(create(f"/k/during{i}".encode()))) for i in range(2)]
    assert (await first).succeeded
    # The first's answer is in: the flusher lingers with two callers, under the four it goes at.
    for _ in range(5):
        await asyncio.sleep(0)
    assert kv.requests == [1]
    later = [asyncio.create_task(group.run(create(f"/k/later{i}".encode()))) for i in range(2)]
    async with asyncio.timeout(30):  # a guard: it would linger an hour
        results: list[TxnResult] = await asyncio.gather(*during, *later)
    assert all(r.succeeded for r in results)
    assert kv.requests == [1, 4]


async def test_enough_waiting_callers_go_at_once_without_lingering() -> None:
    kv = CountingKv()
    group = GroupCommit(kv, linger_s=HOUR, linger_until=4)
    first = asyncio.create_task(group.run(create(b"/k/first")))
    await in_flight(kv)
    during = [asyncio.create_task(group.run(create(f"/k/during{i}".encode()))) for i in range(6)]
    async with asyncio.timeout(30):  # a guard: it would linger an hour
        results = await asyncio.gather(first, *during)
    assert all(r.succeeded for r in results)
    assert kv.requests == [1, 6]
