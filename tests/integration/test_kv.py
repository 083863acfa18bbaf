"""One contract for both key-value stores: the in-memory twin must behave as real etcd does.

Every test runs against `MemoryKv` (with a fake clock) and against `EtcdKv` on the session's etcd (real
time). A difference between the two is a bug in MemoryKv, which unit tests of the layers above rely on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

import pytest

from federation.runtime.etcd_process import EtcdProcess
from federation.store.kv import (
    MAX_TXN_OPS,
    Compare,
    CompareOp,
    CompareTarget,
    Delete,
    EventType,
    Get,
    KeyValueStore,
    KvError,
    LeaseNotFound,
    Put,
    Txn,
    WatchCompacted,
    WatchEvent,
)
from federation.store.kv_etcd import EtcdKv
from federation.store.kv_memory import MemoryKv

P = b"/gpufed/kvtest/"


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@dataclass
class Kv:
    """The store under test, and how to let time pass for its leases."""

    store: KeyValueStore
    clock: FakeClock | None

    async def advance(self, seconds: float) -> None:
        if self.clock is not None:
            self.clock.now_s += seconds
        else:
            await asyncio.sleep(seconds)


@pytest.fixture(
    params=[pytest.param("memory"), pytest.param("etcd", marks=pytest.mark.integration)],
)
async def kv(request: pytest.FixtureRequest) -> AsyncIterator[Kv]:
    if request.param == "memory":
        clock = FakeClock()
        memory = MemoryKv(clock=clock)
        yield Kv(memory, clock)
        await memory.close()
    else:
        # Not the etcd_kv fixture: an async fixture cannot be requested from inside another one.
        process: EtcdProcess = request.getfixturevalue("etcd_process")
        etcd = await EtcdKv.connect(process.endpoint)
        await etcd.delete_prefix(P)
        yield Kv(etcd, None)
        await etcd.close()


async def take(events: AsyncGenerator[WatchEvent, None], n: int, timeout_s: float = 5.0) -> list[WatchEvent]:
    out: list[WatchEvent] = []
    async with asyncio.timeout(timeout_s), contextlib.aclosing(events):
        async for ev in events:
            out.append(ev)
            if len(out) == n:
                break
    return out


async def test_put_then_get_tracks_revisions_and_versions(kv: Kv) -> None:
    s = kv.store
    r1 = await s.put(P + b"a", b"1")
    r2 = await s.put(P + b"a", b"2")
    assert r2 == r1 + 1
    got = await s.get(P + b"a")
    assert got is not None
    assert (got.value, got.create_revision, got.mod_revision, got.version) == (b"2", r1, r2, 2)
    assert await s.get(P + b"missing") is None


async def test_delete_reports_whether_the_key_existed_and_resets_its_version(kv: Kv) -> None:
    s = kv.store
    await s.put(P + b"a", b"1")
    assert await s.delete(P + b"a") is True
    assert await s.delete(P + b"a") is False
    rev = await s.put(P + b"a", b"again")
    got = await s.get(P + b"a")
    assert got is not None
    assert (got.version, got.create_revision) == (1, rev)


async def test_range_prefix_is_sorted_and_stays_inside_the_prefix(kv: Kv) -> None:
    s = kv.store
    for k in (b"c", b"a", b"b"):
        await s.put(P + b"r/" + k, k)
    last = await s.put(P + b"r0", b"outside")  # shares the string prefix "r" but not "r/"
    result = await s.range_prefix(P + b"r/")
    assert [kv.key for kv in result.kvs] == [P + b"r/a", P + b"r/b", P + b"r/c"]
    assert result.revision == last
    assert result.more is False


async def test_range_pages_with_limit_and_start_at_a_pinned_revision(kv: Kv) -> None:
    s = kv.store
    for i in range(5):
        await s.put(P + b"p/%d" % i, b"old")
    first = await s.range_prefix(P + b"p/", limit=2)
    assert [kv.key for kv in first.kvs] == [P + b"p/0", P + b"p/1"]
    assert first.more
    # Writes after the first page must not show in the later pages read at its revision.
    await s.put(P + b"p/3", b"new")
    await s.delete(P + b"p/4")
    latest = await s.put(P + b"p/5", b"created later")
    rest = await s.range_prefix(P + b"p/", start=first.kvs[-1].key + b"\0", revision=first.revision)
    assert [(kv.key, kv.value) for kv in rest.kvs] == [
        (P + b"p/2", b"old"),
        (P + b"p/3", b"old"),
        (P + b"p/4", b"old"),
    ]
    assert rest.revision == latest, "etcd reports the current revision even for a read at an older one"
    now = await s.range_prefix(P + b"p/", start=P + b"p/3")
    assert [(kv.key, kv.value) for kv in now.kvs] == [(P + b"p/3", b"new"), (P + b"p/5", b"created later")]


async def test_delete_prefix_removes_only_the_prefix(kv: Kv) -> None:
    s = kv.store
    await s.put(P + b"d/1", b"x")
    await s.put(P + b"d/2", b"x")
    await s.put(P + b"e/1", b"x")
    assert await s.delete_prefix(P + b"d/") == 2
    assert [kv.key for kv in (await s.range_prefix(P)).kvs] == [P + b"e/1"]


COMPARE_CASES = [
    # (id, compare on key "k" which holds b"v" at version 2 / on "missing", expected)
    ("absent-on-missing", Compare.absent(P + b"missing"), True),
    ("absent-on-present", Compare.absent(P + b"k"), False),
    ("version-greater", Compare(P + b"k", CompareTarget.VERSION, CompareOp.GREATER, 1), True),
    ("version-less", Compare(P + b"k", CompareTarget.VERSION, CompareOp.LESS, 2), False),
    ("value-equal", Compare.value_is(P + b"k", b"v"), True),
    ("value-not-equal", Compare(P + b"k", CompareTarget.VALUE, CompareOp.NOT_EQUAL, b"v"), False),
    (
        "value-on-missing-never-holds",
        Compare(P + b"missing", CompareTarget.VALUE, CompareOp.NOT_EQUAL, b"x"),
        False,
    ),
    ("mod-of-missing-is-zero", Compare.mod_revision_is(P + b"missing", 0), True),
    ("create-of-missing-is-zero", Compare.created_at(P + b"missing", 0), True),
]


@pytest.mark.parametrize(
    ("compare", "expected"), [c[1:] for c in COMPARE_CASES], ids=[c[0] for c in COMPARE_CASES]
)
async def test_txn_compare(kv: Kv, compare: Compare, expected: bool) -> None:
    await kv.store.put(P + b"k", b"old")
    await kv.store.put(P + b"k", b"v")
    result = await kv.store.txn([compare], [Put(P + b"ran", b"success")], [Put(P + b"ran", b"failure")])
    assert result.succeeded is expected
    ran = await kv.store.get(P + b"ran")
    assert ran is not None
    assert ran.value == (b"success" if expected else b"failure")


async def test_txn_compares_mod_and_create_revisions_of_a_present_key(kv: Kv) -> None:
    s = kv.store
    created = await s.put(P + b"k", b"1")
    modified = await s.put(P + b"k", b"2")
    assert (await s.txn([Compare.mod_revision_is(P + b"k", created)], [])).succeeded is False
    assert (await s.txn([Compare.mod_revision_is(P + b"k", modified)], [])).succeeded is True
    assert (await s.txn([Compare.created_at(P + b"k", created)], [])).succeeded is True
    assert (
        await s.txn([Compare(P + b"k", CompareTarget.MOD, CompareOp.LESS, modified)], [])
    ).succeeded is False


async def test_txn_failure_branch_gets_in_order_without_a_new_revision(kv: Kv) -> None:
    s = kv.store
    rev = await s.put(P + b"k", b"taken")
    result = await s.txn(
        [Compare.absent(P + b"k")],
        [Put(P + b"k", b"mine")],
        [Get(P + b"missing"), Get(P + b"k")],
    )
    assert result.succeeded is False
    assert result.revision == rev
    missing, present = result.gets
    assert missing is None
    assert present is not None
    assert present.value == b"taken"
    assert present.mod_revision == rev


async def test_txn_writes_of_one_branch_share_one_revision(kv: Kv) -> None:
    s = kv.store
    await s.put(P + b"gone", b"x")
    result = await s.txn([], [Put(P + b"a", b"1"), Put(P + b"b", b"2"), Delete(P + b"gone"), Get(P + b"a")])
    assert result.succeeded
    a, b = await s.get(P + b"a"), await s.get(P + b"b")
    assert a is not None
    assert b is not None
    assert a.mod_revision == b.mod_revision == result.revision
    assert await s.get(P + b"gone") is None
    assert result.gets[0] is not None
    assert result.gets[0].value == b"1"


async def test_txn_over_etcds_op_limit_is_refused(kv: Kv) -> None:
    puts = [Put(P + b"many/%d" % i, b"x") for i in range(MAX_TXN_OPS + 1)]
    with pytest.raises(KvError, match="at most"):
        await kv.store.txn([], puts)
    assert (await kv.store.range_prefix(P + b"many/")).kvs == ()


async def test_a_key_on_a_lease_lives_while_kept_alive_and_goes_when_it_expires(kv: Kv) -> None:
    s = kv.store
    lease = await s.grant_lease(2)
    await s.put(P + b"leased", b"x", lease=lease)
    got = await s.get(P + b"leased")
    assert got is not None
    assert got.lease == lease
    await kv.advance(1.2)
    assert await s.keepalive(lease) > 0
    await kv.advance(1.2)
    assert await s.get(P + b"leased") is not None, "the keepalive should have renewed the lease"
    # etcd checks for expired leases every 500 ms, so allow for that on top of the TTL.
    for _ in range(20):
        await kv.advance(0.5)
        if await s.get(P + b"leased") is None:
            break
    assert await s.get(P + b"leased") is None
    assert await s.keepalive(lease) <= 0


async def test_revoking_a_lease_deletes_its_keys_and_is_idempotent(kv: Kv) -> None:
    s = kv.store
    lease = await s.grant_lease(30)
    await s.put(P + b"l/1", b"x", lease=lease)
    await s.put(P + b"l/2", b"x", lease=lease)
    await s.revoke_lease(lease)
    await s.revoke_lease(lease)
    assert (await s.range_prefix(P + b"l/")).kvs == ()


async def test_a_write_with_an_unknown_lease_is_refused(kv: Kv) -> None:
    lease = await kv.store.grant_lease(30)
    await kv.store.revoke_lease(lease)
    with pytest.raises(LeaseNotFound):
        await kv.store.put(P + b"x", b"x", lease=lease)
    with pytest.raises(LeaseNotFound):
        await kv.store.txn([], [Put(P + b"x", b"x", lease=lease)])
    assert await kv.store.get(P + b"x") is None


async def test_watch_replays_history_from_a_revision_then_follows_live_writes(kv: Kv) -> None:
    s = kv.store
    start = await s.put(P + b"w/a", b"1")
    await s.put(P + b"elsewhere", b"not watched")
    await s.delete(P + b"w/a")
    watch = s.watch_prefix(P + b"w/", start_revision=start)
    async with asyncio.timeout(5), contextlib.aclosing(watch):
        # The history first: once it has arrived the watch exists, so the writes after are live.
        events = [await anext(watch), await anext(watch)]
        txn = await s.txn([], [Put(P + b"w/b", b"2"), Put(P + b"w/c", b"3")])
        events += [await anext(watch), await anext(watch)]
    assert [(e.type, e.kv.key) for e in events] == [
        (EventType.PUT, P + b"w/a"),
        (EventType.DELETE, P + b"w/a"),
        (EventType.PUT, P + b"w/b"),
        (EventType.PUT, P + b"w/c"),
    ]
    deleted = events[1].kv
    assert deleted.value == b""
    assert deleted.mod_revision == start + 2
    assert events[2].kv.mod_revision == events[3].kv.mod_revision == txn.revision


async def test_watch_from_a_compacted_revision_raises_watch_compacted(kv: Kv) -> None:
    s = kv.store
    first = await s.put(P + b"c/a", b"1")
    await s.put(P + b"c/a", b"2")
    now = await s.put(P + b"c/a", b"3")
    await s.compact(now)
    with pytest.raises(WatchCompacted):
        await take(s.watch_prefix(P + b"c/", start_revision=first), 1)
    with pytest.raises(WatchCompacted):
        await s.range_prefix(P + b"c/", revision=first)
    # From the compaction revision on, history is still there.
    events = await take(s.watch_prefix(P + b"c/", start_revision=now), 1)
    assert events[0].kv.value == b"3"


async def test_txn_many_commits_each_transaction_on_its_own_compares_at_one_revision(kv: Kv) -> None:
    s = kv.store
    await s.put(P + b"taken", b"old")
    results = await s.txn_many(
        [
            Txn((Compare.absent(P + b"new"),), (Put(P + b"new", b"1"),), (Get(P + b"new"),)),
            Txn((Compare.absent(P + b"taken"),), (Put(P + b"taken", b"2"),), (Get(P + b"taken"),)),
            Txn((Compare.absent(P + b"other"),), (Put(P + b"other", b"3"),)),
        ]
    )
    assert [r.succeeded for r in results] == [True, False, True]
    # The failed one ran its failure branch and wrote nothing.
    taken = results[1].gets[0]
    assert taken is not None
    assert taken.value == b"old"
    assert (await s.get(P + b"taken")).value == b"old"  # type: ignore[union-attr]
    new, other = await s.get(P + b"new"), await s.get(P + b"other")
    assert new is not None
    assert other is not None
    # Like etcd's nested transactions: every write of the batch shares one revision.
    assert new.mod_revision == other.mod_revision == results[0].revision == results[2].revision


async def test_txn_many_refuses_two_transactions_writing_one_key(kv: Kv) -> None:
    with pytest.raises(KvError, match="same key"):
        await kv.store.txn_many(
            [
                Txn((), (Put(P + b"k", b"1"),)),
                Txn((), (Put(P + b"k", b"2"),)),
            ]
        )
    assert await kv.store.get(P + b"k") is None
