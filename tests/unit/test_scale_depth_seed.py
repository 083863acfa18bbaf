"""bench/scale_depth.py loads its queue straight into etcd instead of through SubmitJob (a million
submissions would take the benchmark's whole budget). Its figures stand for a real queue only if
what it writes is what a submission writes: the same keys with the same bytes, under the same
compares, and a record the server reads back as a queued job of its tenant (issue 33).
"""

from __future__ import annotations

from bench import scale_depth
from federation.store.job_store import KvStore, job_key
from federation.store.kv import Compare, Put
from federation.store.kv_memory import MemoryKv
from placement.model import JobPhase

NOW = 1_800_000_000.0


async def test_a_seeded_job_is_stored_as_create_job_stores_its_submission() -> None:
    seeded_kv, submitted_kv = MemoryKv(), MemoryKv()
    txn = scale_depth._queued_txn(42, NOW)
    (result,) = await seeded_kv.txn_many([txn])
    assert result.succeeded
    record = scale_depth.queued_record(42, NOW)
    _, created = await KvStore(submitted_kv).create_job(
        record, idempotency_key="seed-42", manifest_digest=scale_depth.SEED_DIGEST
    )
    assert created

    seeded = (await seeded_kv.range_prefix(b"/")).kvs
    submitted = (await submitted_kv.range_prefix(b"/")).kvs
    assert len(seeded) == 2
    assert [(kv.key, kv.value) for kv in seeded] == [(kv.key, kv.value) for kv in submitted]
    # Create-only, as a submission: the idempotency key and the record must both be absent.
    assert all(isinstance(c, Compare) for c in txn.compares)
    assert len(txn.compares) == 2
    assert {op.key for op in txn.success if isinstance(op, Put)} == {c.key for c in txn.compares}

    stored = await KvStore(seeded_kv).get_job(record.job_id)
    assert stored is not None
    job = stored.value
    assert (job.phase, job.tenant, job.user) == (JobPhase.QUEUED, "t42", "u42")
    assert job_key(job.job_id) in {kv.key for kv in seeded}


async def test_seeding_twice_writes_nothing_the_second_time() -> None:
    kv = MemoryKv()
    (first,) = await kv.txn_many([scale_depth._queued_txn(7, NOW)])
    (again,) = await kv.txn_many([scale_depth._queued_txn(7, NOW)])
    assert first.succeeded
    assert not again.succeeded
