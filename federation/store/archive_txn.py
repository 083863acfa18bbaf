"""Reading an ended job's keys for the archiver, and removing them once the history store has them.

Why the store room: these are etcd transactions over the store's own keys (jobs, ledger, waits,
idempotency), and the rules that make removal safe belong next to the writes they guard:

* One job's keys are read in one transaction (one revision), so its record, ledger intervals and
  wait reasons agree with each other.
* One job's keys are removed in one transaction that holds only if the leader's fence holds (a
  deposed leader removes nothing), the job is still at the mod revision read (a job changed since is
  left for the next pass), its wait reasons are as read, and its idempotency key still names it.
  Ledger intervals need no compare of their own: they are written only in the same transaction as
  a change of their job's record, so an unchanged record means unchanged intervals. Kept-log keys
  (attempt summaries and tails) are written by another path under their own lease, so each has a
  compare of its own: still at the mod revision read, or already gone (its lease expired).
* Several jobs' removals go in one request (nested transactions), each committing on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from federation.store.intervals import LedgerInterval, interval_from_json, ledger_key
from federation.store.job_store import (
    IDEM,
    WAITS,
    Fence,
    Stored,
    idempotency_key_of,
    job_key,
    waits_from_json,
)
from federation.store.jobs import JobRecord, job_from_json
from federation.store.kv import MAX_TXN_OPS, Compare, Delete, Get, KeyValue, KeyValueStore, Txn
from federation.store.kv_pages import pages
from federation.store.schema_version import loads
from placement.model import JobId, TenantId, WaitReason


@dataclass(frozen=True, slots=True)
class JobKeys:
    """What etcd holds about one job, as read in one transaction."""

    job: Stored[JobRecord]
    intervals: tuple[LedgerInterval, ...]
    # The latest wait reasons and their key's mod revision (0: no key).
    waits: tuple[WaitReason, ...]
    waits_revision: int
    # Extra keys read with the job (the archiver's attempt summaries), by key; None when absent.
    extra: dict[bytes, KeyValue | None]
    # The idempotency key that names this job and its value, if the caller found one.
    idem: KeyValue | None = None
    # Further keys to remove with the job (its kept-log summaries and tails), as read.
    logs: tuple[KeyValue, ...] = ()

    def removal(self, fence: Fence) -> Txn:
        """The fenced, guarded transaction that deletes the job's keys from etcd."""
        job_id = self.job.value.job_id
        compares = [fence.compare(), Compare.mod_revision_is(job_key(job_id), self.job.mod_revision)]
        compares.append(
            Compare.mod_revision_is(WAITS + job_id.encode(), self.waits_revision)
            if self.waits_revision
            else Compare.absent(WAITS + job_id.encode())
        )
        deletes = [Delete(job_key(job_id)), *(Delete(iv.key) for iv in self.intervals)]
        if self.waits_revision:
            deletes.append(Delete(WAITS + job_id.encode()))
        if self.idem is not None:
            compares.append(Compare.value_is(self.idem.key, self.idem.value))
            deletes.append(Delete(self.idem.key))
        for kept in self.logs:
            # Unchanged since read, or gone (a key whose lease expired compares as revision 0).
            compares.append(Compare.mod_revision_less(kept.key, kept.mod_revision + 1))
            deletes.append(Delete(kept.key))
        return Txn(tuple(compares), tuple(deletes))

    def removal_ops(self) -> int:
        """The larger of the removal's compares and deletes: what etcd's MAX_TXN_OPS caps."""
        compares = 3 + (self.idem is not None) + len(self.logs)
        deletes = (
            1 + len(self.intervals) + (self.waits_revision != 0) + (self.idem is not None) + len(self.logs)
        )
        return max(compares, deletes)


def keys_per_job(attempts: int, extra_per_attempt: int) -> int:
    """How many Gets reading one job takes: its record, its waits, and per attempt its interval and
    the caller's extra keys."""
    return 2 + attempts * (1 + extra_per_attempt)


async def read_jobs(
    kv: KeyValueStore,
    jobs: Sequence[tuple[JobId, int]],
    extra: Sequence[Sequence[bytes]] = (),
    known: Sequence[Stored[JobRecord]] = (),
) -> list[JobKeys | None]:
    """For each (job id, attempts) the job's keys, each job read in one transaction; None where the
    job is gone. `extra[i]` are further keys to read with job i (at most MAX_TXN_OPS in all).
    `known[i]`, job i's record as the caller holds it (the job cache's), is taken as read where etcd
    still has it at that mod revision (the same bytes), rather than decoded again."""
    out: list[JobKeys | None] = []
    batch: list[tuple[int, list[bytes]]] = []
    results: dict[int, dict[bytes, KeyValue | None]] = {}

    async def flush() -> None:
        gets = [Get(k) for _, keys in batch for k in keys]
        if not gets:
            return
        result = await kv.txn([], gets)
        it = iter(result.gets)
        for i, keys in batch:
            results[i] = {k: next(it) for k in keys}
        batch.clear()

    for i, (job_id, attempts) in enumerate(jobs):
        keys = [job_key(job_id), WAITS + job_id.encode()]
        keys += [ledger_key(job_id, a) for a in range(1, attempts + 1)]
        keys += list(extra[i]) if i < len(extra) else []
        if len(keys) > MAX_TXN_OPS:
            raise ValueError(f"job {job_id}: {len(keys)} keys to read; one transaction takes {MAX_TXN_OPS}")
        if sum(len(k) for _, k in batch) + len(keys) > MAX_TXN_OPS:
            await flush()
        batch.append((i, keys))
    await flush()

    for i, (job_id, attempts) in enumerate(jobs):
        got = results[i]
        job_kv = got[job_key(job_id)]
        if job_kv is None:
            out.append(None)
            continue
        intervals = []
        for a in range(1, attempts + 1):
            iv = got[ledger_key(job_id, a)]
            if iv is not None:
                intervals.append(interval_from_json(iv.value, iv.key))
        waits_kv = got[WAITS + job_id.encode()]
        extra_keys = list(extra[i]) if i < len(extra) else []
        held = known[i] if i < len(known) else None
        if held is None or held.mod_revision != job_kv.mod_revision or held.value.job_id != job_id:
            held = Stored(job_from_json(job_kv.value, job_kv.key), job_kv.mod_revision)
        out.append(
            JobKeys(
                job=held,
                intervals=tuple(intervals),
                waits=() if waits_kv is None else waits_from_json(waits_kv.value),
                waits_revision=0 if waits_kv is None else waits_kv.mod_revision,
                extra={k: got[k] for k in extra_keys},
            )
        )
    return out


async def idempotency_keys(kv: KeyValueStore, jobs: Sequence[JobRecord]) -> dict[JobId, KeyValue]:
    """The idempotency key of each of `jobs` that has one, by job. A record names its key
    (`JobRecord.idempotency_digest`): those are read by name, many to a request, whatever the
    tenant's other keys. A record written before the field existed does not, and its key holds a hash
    of the client's key, not the job id: those jobs' tenants' keys are read (paged), as every pass
    read them before."""
    found: dict[JobId, KeyValue] = {}
    named = [j for j in jobs if j.idempotency_digest]
    for start in range(0, len(named), MAX_TXN_OPS):
        chunk = named[start : start + MAX_TXN_OPS]
        keys = [idempotency_key_of(j.tenant, j.idempotency_digest) for j in chunk]
        result = await kv.txn((), tuple(Get(k) for k in keys), ())
        for job, got in zip(chunk, result.gets, strict=True):
            # The key is create-only and names the job it created; checked all the same, as the
            # removal deletes what it names.
            if got is not None and loads(got.value, got.key).get("job_id") == job.job_id:
                found[job.job_id] = got
    # A job set's members are written by the set controller, never with an idempotency key.
    unnamed = [j for j in jobs if not j.idempotency_digest and not j.job_set]
    await _listed(kv, [j.tenant for j in unnamed], {j.job_id for j in unnamed}, found)
    return found


async def _listed(
    kv: KeyValueStore, tenants: Sequence[TenantId], job_ids: set[JobId], found: dict[JobId, KeyValue]
) -> None:
    """Into `found`: the keys of `tenants` that name one of `job_ids`, by a paged read of them."""
    if not job_ids:
        return
    for tenant in sorted(set(tenants)):
        prefix = IDEM + tenant.encode() + b"/"
        async with contextlib.aclosing(pages(kv, prefix)) as listing:
            async for page, _ in listing:
                # Decoded on a worker thread: a tenant may hold a key per live job, and a pass must
                # not hold the event loop for all of them.
                found.update(await asyncio.to_thread(_naming, page, job_ids))


def _naming(items: Sequence[KeyValue], job_ids: set[JobId]) -> dict[JobId, KeyValue]:
    out: dict[JobId, KeyValue] = {}
    for item in items:
        job_id = JobId(loads(item.value, item.key)["job_id"])
        if job_id in job_ids:
            out[job_id] = item
    return out


# The most ops one removal may have: it goes nested in a request, alone at the least.
MAX_REMOVAL_OPS = MAX_TXN_OPS - 1


def txn_ops(t: Txn) -> int:
    return max(len(t.compares), len(t.success), len(t.failure))


def batches(removals: Sequence[Txn]) -> list[list[Txn]]:
    """The removals, in order, cut into requests etcd takes: it caps a request's nested
    transactions and each nested one's ops together, at MAX_TXN_OPS minus how many share the
    request (`checkTxnRequest`: 100 nested transactions leave each 28 ops). A removal too large to
    share goes alone (at most MAX_REMOVAL_OPS)."""
    out: list[list[Txn]] = []
    current: list[Txn] = []
    widest = 0
    for t in removals:
        ops = txn_ops(t)
        if current and len(current) + 1 + max(widest, ops) > MAX_TXN_OPS:
            out.append(current)
            current, widest = [], 0
        current.append(t)
        widest = max(widest, ops)
    if current:
        out.append(current)
    return out


async def remove(kv: KeyValueStore, removals: Sequence[Txn]) -> list[bool]:
    """Run the removals, as few requests as etcd's op limits allow; which of them committed."""
    done: list[bool] = []
    for batch in batches(removals):
        results = await kv.txn_many(batch)
        done.extend(r.succeeded for r in results)
    return done


async def fence_holds(kv: KeyValueStore, fence: Fence) -> bool:
    holder = await kv.get(fence.key)
    return holder is not None and holder.create_revision == fence.create_revision
