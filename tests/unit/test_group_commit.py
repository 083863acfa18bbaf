"""Group commit: concurrent transactions share requests, yet each behaves as if sent alone."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from federation.errors import StoreUnavailable
from federation.store.group_commit import GroupCommit
from federation.store.kv import Compare, Get, Op, Put, Txn, TxnResult
from federation.store.kv_memory import MemoryKv


class CountingKv(MemoryKv):
    """MemoryKv that counts requests and yields to the loop like a network call would."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[int] = []
        self.fail = False

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        self.requests.append(1)
        await asyncio.sleep(0.001)
        if self.fail:
            raise StoreUnavailable("etcd did not answer")
        return await super().txn(compares, success, failure)

    async def txn_many(self, txns: Sequence[Txn]) -> list[TxnResult]:
        self.requests.append(len(txns))
        await asyncio.sleep(0.001)
        if self.fail:
            raise StoreUnavailable("etcd did not answer")
        return await super().txn_many(txns)


def create(key: bytes, value: bytes = b"v") -> Txn:
    return Txn((Compare.absent(key),), (Put(key, value),), (Get(key),))


async def test_concurrent_transactions_share_requests_and_each_gets_its_own_result() -> None:
    kv = CountingKv()
    group = GroupCommit(kv, max_batch=16)
    await kv.put(b"/k/taken", b"old")
    keys = [f"/k/{i}".encode() for i in range(100)] + [b"/k/taken"]
    results = await asyncio.gather(*(group.run(create(k)) for k in keys))
    assert [r.succeeded for r in results] == [True] * 100 + [False]
    assert results[-1].gets[0] is not None
    assert results[-1].gets[0].value == b"old"
    assert sum(kv.requests) == len(keys)
    assert len(kv.requests) < len(keys) / 4, f"expected batching, got {kv.requests}"
    assert max(kv.requests) <= 16


async def test_a_lone_transaction_is_sent_at_once_on_its_own() -> None:
    kv = CountingKv()
    result = await GroupCommit(kv).run(create(b"/k/alone"))
    assert result.succeeded
    assert kv.requests == [1]


async def test_two_writes_of_one_key_never_share_a_request_and_the_second_sees_the_first() -> None:
    kv = CountingKv()
    group = GroupCommit(kv)
    first, second = await asyncio.gather(
        group.run(create(b"/k/same", b"1")), group.run(create(b"/k/same", b"2"))
    )
    assert first.succeeded
    assert not second.succeeded
    assert second.gets[0] is not None
    assert second.gets[0].value == b"1"


async def test_a_store_error_reaches_every_caller_of_the_batch_and_nothing_is_written() -> None:
    kv = CountingKv()
    kv.fail = True
    group = GroupCommit(kv)
    outcomes = await asyncio.gather(
        *(group.run(create(f"/k/{i}".encode())) for i in range(10)), return_exceptions=True
    )
    assert all(isinstance(o, StoreUnavailable) for o in outcomes)
    kv.fail = False
    assert (await kv.range_prefix(b"/k/")).kvs == ()
    # The group recovers for later callers.
    assert (await group.run(create(b"/k/later"))).succeeded


async def test_a_cancelled_caller_is_not_sent() -> None:
    kv = CountingKv()
    group = GroupCommit(kv)
    first = asyncio.ensure_future(group.run(create(b"/k/a")))
    doomed = asyncio.ensure_future(group.run(create(b"/k/b")))
    await asyncio.sleep(0)
    doomed.cancel()
    assert (await first).succeeded
    with pytest.raises(asyncio.CancelledError):
        await doomed
    # A later transaction through the group has been sent and answered: anything still queued
    # before it (the cancelled write, were it kept) has gone out by then, in its request or earlier.
    assert (await group.run(create(b"/k/c"))).succeeded
    assert kv.requests == [1, 1], "each of the two live writes went alone"
    assert await kv.get(b"/k/b") is None
