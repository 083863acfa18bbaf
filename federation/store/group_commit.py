"""Group commit: concurrent, independent etcd transactions share one request.

Under load most of a submission's CPU went into its own round trip to etcd (a Python gRPC call
costs far more than the work it carries), and each transaction is a raft entry of its own. Here
transactions that arrive while a batch is in flight wait for it and then go together as nested
transactions of one request. Each still commits or fails on its own compares, so callers see
exactly what a lone `txn` would give them. A lone caller on an idle server is sent at once: batching
adds no delay, it only collects what queues up anyway.

Under load it waits a moment longer (`LINGER_S`, 1 ms): once a request has gone and more callers
came while it was in flight, the flusher lingers before the next batch, unless `LINGER_UNTIL`
callers already wait (or come meanwhile: it goes at once then). A lone caller on an idle server is
still sent at once. In the server under bench/submit.py (8 in flight, the leader's own writes
sharing the group) the step back alone left batches of 2.0 transactions: a gRPC call to etcd costs
the server 200 to 300 µs of CPU, so that was about 125 µs a submission. Lingering, 4.7 to 4.9,
and 0.64 to 0.68 ms of server CPU a submission against 0.80 to 0.85 (issue 33); the latency went
down with it (p50 5.0 to 5.4 ms against 6.3 to 7.1), the cores being the bound.

Before it takes each batch the flusher steps back once to the end of the event loop's queue, so
that the callers already woken in this turn of the loop (replies read off the same socket, a
batch's callers resumed together) join it rather than the next. That is one pass of the loop, a
few microseconds; measured with 8 submissions in flight it made batches 7.2 on average instead of
4.4, and took a quarter off etcd's CPU and a tenth off the server's per submission (issue 33).

A batch is bounded in bytes as well as in count. etcd refuses a request over its size limit as a
whole, and a batch mixes every tenant's transactions: 64 records of a few hundred KiB (large
manifests) beside another tenant's small ones failed them all. A transaction that does not fit
waits for a later batch, and one larger than the bound goes alone, failing, if etcd refuses it,
only for its own caller. So in ops: etcd gives each nested transaction only what the batch's own
count leaves of its ops limit, so a wide transaction goes with few enough others (or alone). A
transaction never overtakes an earlier one that writes a key it writes.
"""

from __future__ import annotations

import asyncio

from federation.store.kv import MAX_TXN_OPS, Compare, Get, KeyValueStore, Put, Txn, TxnResult, txn_ops

# Keep batches well under etcd's request size limit as well as its ops limit.
DEFAULT_MAX_BATCH = min(64, MAX_TXN_OPS)
# etcd's default --max-request-bytes is 1.5 MiB; the rest is room for protobuf's framing.
DEFAULT_MAX_BATCH_BYTES = 1024 * 1024
# Under load, how long the flusher waits for more callers before it takes the next batch, and how
# many waiting callers make it go at once (see the module's docstring).
LINGER_S = 0.001
LINGER_UNTIL = 16
# Framing of each compare and operation in the request, beyond its key and value (an estimate on
# the large side: a batch of many small transactions stays far under the bound anyway).
_OP_OVERHEAD_BYTES = 32


def request_bytes(txn: Txn) -> int:
    """About what the transaction adds to an etcd request: its keys, values and their framing."""
    size = 0
    for op in (*txn.compares, *txn.success, *txn.failure):
        size += len(op.key) + _OP_OVERHEAD_BYTES
        if isinstance(op, Put):
            size += len(op.value)
        elif isinstance(op, Compare) and isinstance(op.operand, bytes):
            size += len(op.operand)
    return size


class GroupCommit:
    def __init__(
        self,
        kv: KeyValueStore,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        linger_s: float = LINGER_S,
        linger_until: int = LINGER_UNTIL,
    ) -> None:
        self._kv = kv
        self._max_batch = max_batch
        self._max_batch_bytes = max_batch_bytes
        self._linger_s = linger_s
        self._linger_until = linger_until
        self._pending: list[tuple[Txn, asyncio.Future[TxnResult]]] = []
        self._flusher: asyncio.Task[None] | None = None
        # Set while the flusher lingers: done when it should go (its time is up, or enough wait).
        self._lingering: asyncio.Future[None] | None = None

    async def run(self, txn: Txn) -> TxnResult:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[TxnResult] = loop.create_future()
        self._pending.append((txn, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush(), name="gpufed-group-commit")
        elif (
            self._lingering is not None
            and not self._lingering.done()
            and len(self._pending) >= self._linger_until
        ):
            self._lingering.set_result(None)
        return await future

    def _take_batch(self) -> list[tuple[Txn, asyncio.Future[TxnResult]]]:
        """The oldest transactions that fit in one request, in count and in bytes (the first one
        always goes); two writing one key never share one, nor does one go before an earlier one
        left waiting that writes a key it writes."""
        batch: list[tuple[Txn, asyncio.Future[TxnResult]]] = []
        rest: list[tuple[Txn, asyncio.Future[TxnResult]]] = []
        written: set[bytes] = set()
        waiting: set[bytes] = set()
        size = 0
        widest = 0
        for txn, future in self._pending:
            if future.done():  # the caller gave up (cancelled): do not send its write
                continue
            keys = {op.key for op in (*txn.success, *txn.failure) if not isinstance(op, Get)}
            txn_bytes = request_bytes(txn)
            ops = txn_ops(txn)
            fits = not batch or (
                len(batch) < self._max_batch
                and size + txn_bytes <= self._max_batch_bytes
                # etcd leaves each nested transaction MAX_TXN_OPS less the batch's count: a wide one
                # (a commit of a hundred records) beside 63 others failed all 64.
                and max(widest, ops) <= MAX_TXN_OPS - (len(batch) + 1)
            )
            if fits and not keys & written and not keys & waiting:
                batch.append((txn, future))
                written |= keys
                size += txn_bytes
                widest = max(widest, ops)
            else:
                rest.append((txn, future))
                waiting |= keys
        self._pending = rest
        return batch

    async def _linger(self) -> None:
        """Until `linger_s` has passed or `linger_until` callers wait, whichever is first."""
        loop = asyncio.get_running_loop()
        lingering = self._lingering = loop.create_future()
        timer = loop.call_later(self._linger_s, _settle, lingering)
        try:
            await lingering
        finally:
            timer.cancel()
            self._lingering = None

    async def _flush(self) -> None:
        sent = False
        while self._pending:
            await asyncio.sleep(0)  # the callers woken in this turn of the loop join this batch
            if sent and self._linger_s > 0 and len(self._pending) < self._linger_until:
                # Callers came while the last request was in flight: under load, wait for more.
                await self._linger()
            batch = self._take_batch()
            if not batch:
                continue
            sent = True
            try:
                if len(batch) == 1:
                    only = batch[0][0]
                    results = [await self._kv.txn(only.compares, only.success, only.failure)]
                else:
                    results = await self._kv.txn_many([txn for txn, _ in batch])
            except Exception as error:  # every caller of the batch gets the store's error
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
