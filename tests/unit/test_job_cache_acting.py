"""The job cache's acting jobs: what the reconciler's tick walks. Another tenant's deep queue is not in
it, so the leader's ticks on the event loop, which every API call shares, cost what is in flight and
not the length of the queue (issue 30, item 15: alice's ListJobs p99 rose up to 4.5 times beside
20,000 of another tenant's queued jobs; bench/listjobs_queue.py)."""

from __future__ import annotations

import dataclasses

from federation.store.job_cache import JobCache
from federation.store.job_store import KvStore
from federation.store.jobs import DispatchRefusal, JobRecord
from placement.model import ClusterName, JobPhase
from tests.conftest import build_job
from tests.unit.job_cache_fixtures import cache_fixture, store_fixture  # noqa: F401 (the `cache` and `store` fixtures)

QUEUE = 2_000


async def _put(store: KvStore, cache: JobCache, job: JobRecord) -> None:
    current = await store.get_job(job.job_id)
    revision: int | None
    if current is None:
        stored, _ = await store.create_job(job, idempotency_key=job.job_id, manifest_digest="d")
        revision = stored.mod_revision
    else:
        revision = await store.commit([(job, current.mod_revision)])
        assert revision is not None
    assert await cache.wait_for_revision(revision)


def _ids(cache: JobCache) -> set[str]:
    return {s.value.job_id for s in cache.acting_jobs()}


async def test_a_deep_queue_is_not_acting_but_jobs_in_flight_cancels_and_refusals_are(
    store: KvStore, cache: JobCache
) -> None:
    for i in range(QUEUE):
        await _put(store, cache, build_job(f"bob-{i:05d}", tenant="nlp"))
    await _put(store, cache, build_job("alice-run", tenant="vision", phase=JobPhase.RUNNING))
    cancel = dataclasses.replace(build_job("alice-cancel", tenant="vision"), cancel_requested=True)
    await _put(store, cache, cancel)
    refusal = DispatchRefusal(ClusterName("onprem"), 1, 1.0, 1.0, 5.0, "refused")
    await _put(
        store, cache, dataclasses.replace(build_job("alice-refused", tenant="vision"), refusals=(refusal,))
    )
    assert len(cache.live_jobs()) == QUEUE + 3
    assert _ids(cache) == {"alice-run", "alice-cancel", "alice-refused"}

    # Through the watch: a queued job admitted joins; an ended one leaves.
    admitted = await store.get_job(build_job("bob-00000").job_id)
    assert admitted is not None
    await _put(store, cache, dataclasses.replace(admitted.value, phase=JobPhase.ADMITTED))
    ran = await store.get_job(build_job("alice-run").job_id)
    assert ran is not None
    await _put(store, cache, dataclasses.replace(ran.value, phase=JobPhase.SUCCEEDED))
    assert _ids(cache) == {"bob-00000", "alice-cancel", "alice-refused"}

    # A new leader's cache, listing what etcd holds, finds the same.
    fresh = JobCache(store)
    await fresh.start()
    try:
        assert _ids(fresh) == {"bob-00000", "alice-cancel", "alice-refused"}
    finally:
        await fresh.stop()
