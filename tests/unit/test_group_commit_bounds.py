"""Group commit's bounds: a request holds at most about 1 MiB of transactions, and no transaction
overtakes an earlier one, left for a later request, that writes a key it writes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from federation.store.group_commit import DEFAULT_MAX_BATCH_BYTES, GroupCommit, request_bytes
from federation.store.kv import Compare, Get, Put, Txn, TxnResult
from tests.unit.test_group_commit import CountingKv


def put(key: bytes, value: bytes) -> Txn:
    return Txn((), (Put(key, value),))


class SizedKv(CountingKv):
    """Counts each request's bytes as the group commit estimates them."""

    def __init__(self) -> None:
        super().__init__()
        self.request_sizes: list[int] = []

    async def txn_many(self, txns: Sequence[Txn]) -> list[TxnResult]:
        self.request_sizes.append(sum(request_bytes(t) for t in txns))
        return await super().txn_many(txns)


async def test_a_request_holds_at_most_the_byte_bound_of_transactions() -> None:
    kv = SizedKv()
    group = GroupCommit(kv)
    txns = [put(b"/k/%d" % i, b"x" * (300 * 1024)) for i in range(20)]
    results = await asyncio.gather(*(group.run(t) for t in txns))
    assert all(r.succeeded for r in results)
    assert sum(kv.requests) == 20
    assert max(kv.requests) == 3  # 3 x 300 KiB fit in 1 MiB, 4 do not
    assert max(kv.request_sizes) <= DEFAULT_MAX_BATCH_BYTES


async def test_a_transaction_larger_than_the_bound_goes_alone() -> None:
    kv = SizedKv()
    group = GroupCommit(kv, max_batch_bytes=1000)
    huge = put(b"/k/huge", b"x" * 5000)
    small = [put(b"/k/%d" % i, b"s") for i in range(5)]
    await asyncio.gather(group.run(huge), *(group.run(t) for t in small))
    assert kv.requests[0] == 1  # the huge one, first in line, on its own
    assert sum(kv.requests) == 6


async def test_a_later_write_of_a_key_never_overtakes_an_earlier_one_left_waiting() -> None:
    kv = CountingKv()
    group = GroupCommit(kv, max_batch_bytes=1000)
    first = put(b"/k/x", b"x" * 600)
    earlier = put(b"/k/shared", b"earlier" + b"e" * 600)  # does not fit beside the first
    later = put(b"/k/shared", b"later")  # would fit, but writes the key the earlier one waits with
    other = put(b"/k/other", b"o")
    results = await asyncio.gather(*(group.run(t) for t in (first, earlier, later, other)))
    assert all(r.succeeded for r in results)
    stored = await kv.get(b"/k/shared")
    assert stored is not None
    assert stored.value == b"later"  # written in the callers' order, as lone txns would be


async def test_create_only_transactions_keep_their_own_outcomes_across_requests() -> None:
    kv = CountingKv()
    group = GroupCommit(kv, max_batch_bytes=2000)
    creates = [
        Txn((Compare.absent(b"/k/c"),), (Put(b"/k/c", b"%d" % i + b"v" * 900),), (Get(b"/k/c"),))
        for i in range(6)
    ]
    results = await asyncio.gather(*(group.run(t) for t in creates))
    assert [r.succeeded for r in results] == [True, False, False, False, False, False]
    stored = await kv.get(b"/k/c")
    assert stored is not None
    assert stored.value.startswith(b"0")
