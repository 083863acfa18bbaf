"""What one tenant's submissions can do to another's through the group commit, on a real etcd.

Concurrent submissions of every tenant share etcd requests (`federation.store.group_commit`). etcd
refuses a request over its size limit (1.5 MiB by default) as a whole, so a batch that held one
tenant's large records beside another tenant's small ones would fail them all: a tenant could make
another's submissions fail by sending large manifests at the same moment. Batches are bounded in
bytes as well as in count, so each tenant's transaction fails only for what it holds itself.
"""

from __future__ import annotations

import asyncio

from federation.store.group_commit import GroupCommit
from federation.store.kv import Compare, Get, Put, Txn
from federation.store.kv_etcd import EtcdKv
from tests.etcdctl import count_keys

P = b"/gpufed/test-group-commit/"
# A job record may hold a manifest of up to 256 KiB (MAX_MANIFEST_BYTES) and more in its templates.
LARGE_BYTES = 300 * 1024


def create(key: bytes, value: bytes) -> Txn:
    return Txn((Compare.absent(key),), (Put(key, value),), (Get(key),))


async def test_a_tenants_large_records_do_not_fail_another_tenants_submissions(etcd_kv: EtcdKv) -> None:
    group = GroupCommit(etcd_kv)
    large = [create(P + b"alice/%d" % i, b"a" * LARGE_BYTES) for i in range(24)]
    small = [create(P + b"bob/%d" % i, b"b" * 900) for i in range(40)]
    # Interleaved, all at once: without a byte bound they go in requests of up to 64, several MiB.
    mixed = [t for pair in zip(large, small[: len(large)], strict=True) for t in pair] + small[len(large) :]
    results = await asyncio.gather(*(group.run(t) for t in mixed), return_exceptions=True)
    failed = [
        (t.success[0].key, r) for t, r in zip(mixed, results, strict=True) if isinstance(r, BaseException)
    ]
    assert failed == []
    assert all(not isinstance(r, BaseException) and r.succeeded for r in results)
    # etcd, asked directly, holds every record whole.
    for t in mixed:
        put = t.success[0]
        assert isinstance(put, Put)
        stored = await etcd_kv.get(put.key)
        assert stored is not None
        assert stored.value == put.value
    await etcd_kv.delete_prefix(P)


async def test_a_record_too_large_for_etcd_fails_only_its_own_submission(etcd_kv: EtcdKv) -> None:
    group = GroupCommit(etcd_kv)
    too_large = create(P + b"alice/huge", b"a" * (2 * 1024 * 1024))
    small = [create(P + b"bob/%d" % i, b"b" * 900) for i in range(20)]
    results = await asyncio.gather(*(group.run(t) for t in [too_large, *small]), return_exceptions=True)
    assert isinstance(results[0], BaseException)
    assert all(not isinstance(r, BaseException) and r.succeeded for r in results[1:])
    assert await etcd_kv.get(P + b"alice/huge") is None
    await etcd_kv.delete_prefix(P)


async def test_a_wide_transaction_does_not_fail_the_others_it_would_be_nested_with(etcd_kv: EtcdKv) -> None:
    """etcd gives each nested transaction what the request's own count leaves of its ops limit (128):
    a batch of 64 leaves each 64. A commit of 100 records (a scheduler's batch of transitions, a job
    set's release) batched with 63 small submissions would have failed all 64; it must go with few
    enough others, and every one succeed."""
    group = GroupCommit(etcd_kv)
    wide = Txn((), tuple(Put(P + b"wide/%d" % i, b"w") for i in range(100)))
    small = [create(P + b"bob/%d" % i, b"b" * 100) for i in range(63)]
    # The small ones first, then the wide one, then more small ones: all pending together.
    later = [create(P + b"carol/%d" % i, b"c" * 100) for i in range(40)]
    results = await asyncio.gather(*(group.run(t) for t in [*small, wide, *later]), return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    assert failed == []
    assert all(not isinstance(r, BaseException) and r.succeeded for r in results)
    # etcd, asked directly, holds all of them.
    for i in range(100):
        assert await etcd_kv.get(P + b"wide/%d" % i) is not None
    # And etcdctl, a judge of its own, counts every key written: 100 of the wide one, 103 small.
    assert count_keys(etcd_kv.endpoint, (P + b"wide/").decode()) == 100
    assert count_keys(etcd_kv.endpoint, P.decode()) == 203
    await etcd_kv.delete_prefix(P)
