"""The archiver finds an ended job's idempotency key by the name its record carries
(`JobRecord.idempotency_digest`), without reading the tenant's other keys; a record written before
the field existed is still found, by the paged read of its tenant's keys it always had.

Issue 33: "each stage ... does no per-job scan of all jobs". Every archive pass read every
idempotency key of every tenant with a job due (one key per live job of that tenant)."""

from __future__ import annotations

from dataclasses import replace

from federation.store.archive_txn import idempotency_keys
from federation.store.job_store import IDEM, KvStore, idempotency_key_of
from federation.store.jobs import JobRecord, job_from_dict, job_to_dict
from federation.store.kv import RangeResult
from federation.store.kv_memory import MemoryKv
from placement.model import JobId, TenantId
from tests.conftest import build_job


class CountingKv(MemoryKv):
    """The in-memory etcd, counting the prefix reads of the idempotency keys."""

    def __init__(self) -> None:
        super().__init__()
        self.idem_listings = 0

    async def range_prefix(
        self, prefix: bytes, *, limit: int = 0, start: bytes | None = None, revision: int = 0
    ) -> RangeResult:
        if prefix.startswith(IDEM):
            self.idem_listings += 1
        return await super().range_prefix(prefix, limit=limit, start=start, revision=revision)


def job(job_id: str, tenant: str = "vision") -> JobRecord:
    return replace(build_job(job_id), tenant=TenantId(tenant))


async def test_a_created_job_names_its_key_and_the_archiver_reads_it_by_that_name() -> None:
    kv = CountingKv()
    store = KvStore(kv)
    created = []
    for n in range(300):  # more than one request's worth of reads (128 to a transaction)
        stored, made = await store.create_job(
            job(f"j{n}"), idempotency_key=f"client-{n}", manifest_digest="d"
        )
        assert made
        created.append(stored.value)
    first = created[0]
    assert first.idempotency_digest
    assert await kv.get(idempotency_key_of(first.tenant, first.idempotency_digest)) is not None
    # The record as etcd holds it names the key too, and reads back equal.
    stored_first = await store.get_job(first.job_id)
    assert stored_first is not None
    assert stored_first.value.idempotency_digest == first.idempotency_digest
    assert job_from_dict(job_to_dict(first)) == first

    due = created[:200]
    found = await idempotency_keys(kv, due)
    assert sorted(found) == sorted(j.job_id for j in due)
    assert kv.idem_listings == 0, "found by name, without reading the tenant's keys"


async def test_a_record_written_before_the_field_is_found_by_reading_its_tenants_keys() -> None:
    kv = CountingKv()
    store = KvStore(kv)
    old, _ = await store.create_job(job("old"), idempotency_key="k-old", manifest_digest="d")
    new, _ = await store.create_job(job("new", tenant="nlp"), idempotency_key="k-new", manifest_digest="d")
    as_before = replace(old.value, idempotency_digest="")  # as a record of an earlier release reads
    assert "idempotency_digest" not in job_to_dict(as_before)
    found = await idempotency_keys(kv, [as_before, new.value])
    assert set(found) == {JobId("old"), JobId("new")}
    assert kv.idem_listings >= 1


async def test_a_set_members_record_has_no_key_and_nothing_is_read_for_it() -> None:
    kv = CountingKv()
    member = replace(job("shard-0"), job_set="shard", array_index=0)
    assert await idempotency_keys(kv, [member]) == {}
    assert kv.idem_listings == 0


async def test_a_key_that_names_another_job_is_not_taken() -> None:
    kv = CountingKv()
    store = KvStore(kv)
    first, _ = await store.create_job(job("first"), idempotency_key="same", manifest_digest="d")
    # A record claiming the first's key (it cannot be created so: the key is create-only) is not
    # given it, since the removal would delete a key that names another job.
    impostor = replace(job("impostor"), idempotency_digest=first.value.idempotency_digest)
    assert await idempotency_keys(kv, [impostor]) == {}
