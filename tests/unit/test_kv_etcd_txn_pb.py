"""The transactions `EtcdKv` sends are built in place (`kv_etcd._fill_txn`), to the very bytes the
keyword-argument form built: every compare target and operator, puts with and without a lease,
deletes and reads, alone and nested as the group commit nests them."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from aetcd import rpc

from federation.store import kv_etcd
from federation.store.kv import Compare, CompareOp, CompareTarget, Delete, Get, Op, Put, Txn


def _reference(compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> Any:
    """The keyword-argument form `kv_etcd` used before."""

    def op_pb(op: Op) -> Any:
        if isinstance(op, Put):
            return rpc.RequestOp(request_put=rpc.PutRequest(key=op.key, value=op.value, lease=op.lease))
        if isinstance(op, Delete):
            return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=op.key))
        return rpc.RequestOp(request_range=rpc.RangeRequest(key=op.key))

    return rpc.TxnRequest(
        compare=[
            rpc.Compare(
                key=c.key,
                target=kv_etcd._COMPARE_TARGETS[c.target],
                result=kv_etcd._COMPARE_OPS[c.op],
                **{kv_etcd._COMPARE_FIELDS[c.target]: c.operand},
            )
            for c in compares
        ],
        success=[op_pb(op) for op in success],
        failure=[op_pb(op) for op in failure],
    )


def _every_compare() -> list[Compare]:
    out = []
    for n, (target, op) in enumerate(itertools.product(CompareTarget, CompareOp)):
        operand: int | bytes = f"v{n}".encode() if target is CompareTarget.VALUE else n
        out.append(Compare(f"/k/{n}".encode(), target, op, operand))
    out.append(Compare(b"/k/zero", CompareTarget.CREATE, CompareOp.EQUAL, 0))
    out.append(Compare(b"/k/empty", CompareTarget.VALUE, CompareOp.EQUAL, b""))
    return out


TXNS = [
    Txn((), ()),
    Txn(
        (Compare.absent(b"/idem/a"), Compare.absent(b"/jobs/a")),
        (Put(b"/idem/a", b'{"job_id":"a"}'), Put(b"/jobs/a", b"x" * 1500)),
        (Get(b"/idem/a"), Get(b"/jobs/a")),
    ),
    Txn(
        tuple(_every_compare()),
        (Put(b"/p", b"v", lease=7), Put(b"/e", b""), Delete(b"/d"), Get(b"/g")),
        (Delete(b"/f"), Put(b"/q", b"w", lease=0)),
    ),
    # Empty keys and values (etcd refuses an empty key; the request is still the same bytes).
    Txn((), (Put(b"", b""), Delete(b""), Get(b"")), (Get(b""),)),
]


def test_a_transaction_is_built_to_the_bytes_of_the_keyword_form() -> None:
    for t in TXNS:
        built = kv_etcd._txn_to_pb(t.compares, t.success, t.failure)
        reference = _reference(t.compares, t.success, t.failure)
        assert built == reference
        assert built.SerializeToString(deterministic=True) == reference.SerializeToString(deterministic=True)


def test_nested_transactions_are_built_to_the_bytes_of_the_keyword_form() -> None:
    outer = rpc.TxnRequest()
    for t in TXNS:
        kv_etcd._fill_txn(outer.success.add().request_txn, t.compares, t.success, t.failure)
    reference = rpc.TxnRequest(
        compare=[],
        success=[rpc.RequestOp(request_txn=_reference(t.compares, t.success, t.failure)) for t in TXNS],
    )
    assert outer == reference
    assert outer.SerializeToString(deterministic=True) == reference.SerializeToString(deterministic=True)
