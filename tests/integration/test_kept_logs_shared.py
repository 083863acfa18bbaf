"""Kept logs of attempts that end together share etcd requests (`LogArchive`'s group commit),
against a real etcd: every attempt is kept whole, each job's bytes under its own keys only, and no
request goes over what etcd takes, however large one tenant's tails are beside another's."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from federation.joblogs.archive import KeptAttempt, KeptReplica, LogArchive, LogsSettings
from federation.store.group_commit import request_bytes
from federation.store.kv import Compare, Op, Txn, TxnResult
from federation.store.kv_etcd import EtcdKv
from tests.history_builders import a_finished_replica, a_kept_attempt

pytestmark = pytest.mark.integration

# etcd's default --max-request-bytes.
ETCD_REQUEST_LIMIT = 1536 * 1024


class CountingKv:
    """The real etcd client, with each request's transactions and bytes noted."""

    def __init__(self, kv: EtcdKv) -> None:
        self._kv = kv
        self.requests: list[tuple[int, int]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._kv, name)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        self.requests.append((1, request_bytes(Txn(tuple(compares), tuple(success), tuple(failure)))))
        return await self._kv.txn(compares, success, failure)

    async def txn_many(self, txns: Sequence[Txn]) -> list[TxnResult]:
        self.requests.append((len(txns), sum(request_bytes(t) for t in txns)))
        return await self._kv.txn_many(txns)


def attempt(job_id: str, replicas: int, size: int) -> tuple[KeptAttempt, dict[tuple[str, int], bytes]]:
    state = a_finished_replica(f"{job_id}-pod", "worker", 0, finished_at_s=1000.0)
    logs = {("worker", i): (f"{job_id} worker {i}\n".encode() * size)[:size] for i in range(replicas)}
    kept = a_kept_attempt(
        1,
        tuple(KeptReplica("worker", i, state, size) for i in range(replicas)),
        started_at_s=900.0,
        finished_at_s=1000.0,
    )
    return kept, logs


async def test_large_and_small_tails_of_two_tenants_kept_together_each_whole_and_its_own(
    etcd_kv: EtcdKv,
) -> None:
    kv = CountingKv(etcd_kv)
    archive = LogArchive(kv, LogsSettings(keep_kib=1024))  # type: ignore[arg-type]
    # Tenant a's gangs keep 700 KiB a replica; tenant b's one-pod jobs a line each.
    wanted = {f"a-{i}": attempt(f"a-{i}", 3, 700 * 1024) for i in range(4)}
    wanted |= {f"b-{i}": attempt(f"b-{i}", 1, 40) for i in range(40)}

    await asyncio.gather(*(archive.keep(job_id, kept, logs) for job_id, (kept, logs) in wanted.items()))

    for job_id, (kept, logs) in wanted.items():
        assert await archive.summary(job_id, 1, now_s=1000.0) == kept
        for (task, replica), data in logs.items():
            assert await archive.log(job_id, 1, task, replica) == data
    # Shared: fewer requests than transactions (a's 3 a gang, b's 1 a job).
    transactions = sum(n for n, _ in kv.requests)
    assert transactions == 4 * 3 + 40
    assert len(kv.requests) < transactions / 2, kv.requests
    # Bounded: no request over etcd's limit (etcd would have refused it, and every attempt in it).
    assert max(size for _, size in kv.requests) < ETCD_REQUEST_LIMIT


async def test_attempts_kept_together_after_their_lease_went_share_one_new_grant(etcd_kv: EtcdKv) -> None:
    """etcd refuses a whole shared request whose lease is gone: every attempt in it is kept again
    under one new lease (one grant, not one per attempt), none lost."""
    kv = CountingKv(etcd_kv)
    grants: list[int] = []

    async def grant_lease(ttl_s: int) -> int:
        lease = await etcd_kv.grant_lease(ttl_s)
        grants.append(lease)
        return lease

    kv.grant_lease = grant_lease  # type: ignore[attr-defined]
    archive = LogArchive(kv, LogsSettings())  # type: ignore[arg-type]
    first, first_logs = attempt("first", 1, 40)
    await archive.keep("first", first, first_logs)
    await etcd_kv.revoke_lease(grants[0])  # as etcd would once it ran out, with the leader away
    wanted = {f"j-{i}": attempt(f"j-{i}", 1, 40) for i in range(20)}

    await asyncio.gather(*(archive.keep(job_id, kept, logs) for job_id, (kept, logs) in wanted.items()))

    assert len(grants) == 2
    for job_id, (kept, logs) in wanted.items():
        assert await archive.summary(job_id, 1, now_s=1000.0) == kept
        found = await etcd_kv.get(b"/gpufed/logs/" + f"{job_id}/1/worker-0".encode())
        assert found is not None
        assert found.value == logs[("worker", 0)]
        assert found.lease == grants[1]
