"""The job store, its cache and leader election over the in-memory kv: fast, and no etcd needed.

The same KvStore runs in production over etcd (tests/integration/test_store.py); MemoryKv is held to
etcd's semantics by tests/integration/test_kv.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace

import pytest

from federation.errors import Conflict, IdempotencyConflict, NotLeader
from federation.scheduling.leader import LeaderElection
from federation.store.job_cache import JobCache
from federation.store.job_store import (
    LEADER_KEY,
    PREFIX,
    Fence,
    InMemoryJobStore,
    JobEvent,
    JobEventType,
    KvStore,
    Stored,
    job_key,
)
from federation.store.jobs import JobRecord, job_to_dict
from federation.store.kv import WatchEvent
from federation.store.kv_memory import MemoryKv
from federation.store.kv_pages import FIRST_PAGE_KEYS
from federation.store.records import ClusterRecord, PoolConfig, Role, TenantRecord, UserRecord
from placement.model import (
    CapacityKind,
    ClusterName,
    GpuType,
    JobId,
    JobPhase,
    Provider,
    TenantId,
    WaitCode,
    WaitReason,
)
from tests.unit.job_cache_fixtures import cache_fixture  # noqa: F401 (the `cache` fixture)
from tests.waits import LoopClock, until

MakeJob = Callable[..., JobRecord]


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def leader_watches(kv: MemoryKv, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Set when an election starts watching the leader key: a standby that found the key held is
    then waiting for it to change, which is what a test must know before the leader goes."""
    watching = asyncio.Event()
    real_watch = kv.watch_prefix

    def watch_and_tell(prefix: bytes, *, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
        if prefix == LEADER_KEY:
            watching.set()
        return real_watch(prefix, start_revision=start_revision)

    monkeypatch.setattr(kv, "watch_prefix", watch_and_tell)
    return watching


@pytest.fixture
def kv(clock: FakeClock) -> MemoryKv:
    return MemoryKv(clock=clock)


@pytest.fixture
def store(kv: MemoryKv) -> KvStore:
    return InMemoryJobStore(kv)


# ---- create_job and idempotency


async def test_create_job_stores_the_job_and_reports_it_new(store: KvStore, make_job: MakeJob) -> None:
    stored, created = await store.create_job(make_job("j1"), idempotency_key="k1", manifest_digest="d1")
    assert created
    # The record as given, naming its idempotency key (the key's SHA-256), for the archiver.
    assert stored.value == replace(make_job("j1"), idempotency_digest=hashlib.sha256(b"k1").hexdigest())
    again = await store.get_job(JobId("j1"))
    assert again == stored


async def test_create_job_with_a_used_key_and_same_manifest_returns_the_first_job(
    store: KvStore, make_job: MakeJob
) -> None:
    first, _ = await store.create_job(make_job("j1"), idempotency_key="k1", manifest_digest="d1")
    # A retry generates a new job id; the key still leads back to the job created first.
    again, created = await store.create_job(make_job("j2"), idempotency_key="k1", manifest_digest="d1")
    assert not created
    assert again == first
    assert await store.get_job(JobId("j2")) is None


async def test_create_job_with_a_used_key_and_other_manifest_is_a_conflict_naming_the_key(
    store: KvStore, make_job: MakeJob
) -> None:
    await store.create_job(make_job("j1"), idempotency_key="retry-7", manifest_digest="d1")
    with pytest.raises(IdempotencyConflict, match="retry-7"):
        await store.create_job(make_job("j2"), idempotency_key="retry-7", manifest_digest="d2")


async def test_idempotency_keys_are_scoped_to_the_tenant(store: KvStore, make_job: MakeJob) -> None:
    _, a = await store.create_job(make_job("j1", tenant="t1"), idempotency_key="k", manifest_digest="d1")
    _, b = await store.create_job(make_job("j2", tenant="t2"), idempotency_key="k", manifest_digest="d2")
    assert a
    assert b


async def test_create_job_with_an_existing_job_id_is_a_conflict(store: KvStore, make_job: MakeJob) -> None:
    await store.create_job(make_job("j1"), idempotency_key="k1", manifest_digest="d1")
    with pytest.raises(Conflict, match="j1"):
        await store.create_job(make_job("j1"), idempotency_key="k2", manifest_digest="d1")


async def test_concurrent_creates_with_one_key_make_one_job(store: KvStore, make_job: MakeJob) -> None:
    results = await asyncio.gather(
        *(store.create_job(make_job(f"j{i}"), idempotency_key="k", manifest_digest="d") for i in range(50))
    )
    assert sum(created for _, created in results) == 1
    assert len({stored.value.job_id for stored, _ in results}) == 1
    jobs, _ = await store.list_jobs()
    assert len(jobs) == 1


# ---- commit (compare-and-swap, fenced)


async def test_commit_writes_when_revisions_match_and_nothing_when_one_is_stale(
    store: KvStore, make_job: MakeJob
) -> None:
    a, _ = await store.create_job(make_job("a"), idempotency_key="ka", manifest_digest="d")
    b, _ = await store.create_job(make_job("b"), idempotency_key="kb", manifest_digest="d")
    cancel_a = dataclasses.replace(a.value, cancel_requested=True)
    revision = await store.commit([(cancel_a, a.mod_revision)])
    assert revision is not None
    assert await store.get_job(JobId("a")) == type(a)(cancel_a, revision)
    # a's revision is now stale: the whole commit fails, b included.
    cancel_b = dataclasses.replace(b.value, cancel_requested=True)
    assert await store.commit([(cancel_b, b.mod_revision), (cancel_a, a.mod_revision)]) is None
    stored_b = await store.get_job(JobId("b"))
    assert stored_b is not None
    assert not stored_b.value.cancel_requested


async def test_commit_of_too_many_updates_is_refused_before_etcd_would(
    store: KvStore, make_job: MakeJob
) -> None:
    with pytest.raises(ValueError, match="updates in one commit"):
        await store.commit([(make_job(f"j{i}"), 0) for i in range(200)])


async def test_a_fenced_commit_fails_once_the_fence_key_is_gone(
    store: KvStore, kv: MemoryKv, make_job: MakeJob
) -> None:
    stored, _ = await store.create_job(make_job("j1"), idempotency_key="k", manifest_digest="d")
    created = await kv.put(PREFIX + b"leader", b"me")
    fence = Fence(PREFIX + b"leader", created)
    updated = dataclasses.replace(stored.value, message="first")
    revision = await store.commit([(updated, stored.mod_revision)], fence=fence)
    assert revision is not None
    await kv.delete(PREFIX + b"leader")
    await kv.put(PREFIX + b"leader", b"someone else")
    assert await store.commit([(dataclasses.replace(updated, message="late"), revision)], fence=fence) is None


# ---- listing


async def test_list_jobs_pages_through_more_than_one_page(store: KvStore, make_job: MakeJob) -> None:
    for i in range(FIRST_PAGE_KEYS + 50):
        await store.create_job(make_job(f"j{i:05d}"), idempotency_key=f"k{i}", manifest_digest="d")
    jobs, revision = await store.list_jobs()
    assert len(jobs) == FIRST_PAGE_KEYS + 50
    assert len({s.value.job_id for s in jobs}) == FIRST_PAGE_KEYS + 50
    assert revision == max(s.mod_revision for s in jobs)


async def test_list_jobs_reads_every_page_at_the_first_pages_revision(
    store: KvStore, kv: MemoryKv, make_job: MakeJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(FIRST_PAGE_KEYS + 10):
        await store.create_job(make_job(f"j{i:05d}"), idempotency_key=f"k{i}", manifest_digest="d")
    real_range = kv.range_prefix
    pages = 0

    async def range_with_a_write_between_pages(prefix: bytes, **kw: int | bytes | None) -> object:
        nonlocal pages
        pages += 1
        if pages == 2:  # someone submits while we are between pages
            await store.create_job(make_job("j99999"), idempotency_key="late", manifest_digest="d")
        return await real_range(prefix, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(kv, "range_prefix", range_with_a_write_between_pages)
    jobs, revision = await store.list_jobs()
    assert len(jobs) == FIRST_PAGE_KEYS + 10, "a job created after the first page must wait for the watch"
    assert revision < kv.revision


# ---- wait reasons, configuration and tokens


async def test_wait_reasons_round_trip_and_none_clears_them(store: KvStore) -> None:
    reasons = (
        WaitReason(WaitCode.INSUFFICIENT_CAPACITY, "needs 8 H100", ClusterName("c1"), GpuType("H100")),
        WaitReason(WaitCode.TENANT_CAP_REACHED, "cap 16"),
    )
    await store.put_wait_reasons(JobId("j1"), reasons)
    assert await store.get_wait_reasons(JobId("j1")) == reasons
    await store.put_wait_reasons(JobId("j1"), ())
    assert await store.get_wait_reasons(JobId("j1")) == ()


async def test_fenced_wait_reasons_from_a_deposed_leader_raise_not_leader(store: KvStore) -> None:
    with pytest.raises(NotLeader):
        await store.put_wait_reasons(
            JobId("j1"),
            (WaitReason(WaitCode.UNKNOWN_TENANT, "no tenant"),),
            fence=Fence(PREFIX + b"leader", 5),
        )
    assert await store.get_wait_reasons(JobId("j1")) == ()


async def test_tenants_clusters_and_users_round_trip(store: KvStore) -> None:
    tenant = TenantRecord(TenantId("vision"), gpu_caps=((GpuType("H100"), 16),))
    cluster = ClusterRecord(
        ClusterName("c1"),
        Provider.AWS,
        "us-east-1",
        (PoolConfig("p1", GpuType("H100"), CapacityKind.ON_DEMAND, 4.5, 8, 2),),
    )
    user = UserRecord("alice", TenantId("vision"), Role.MEMBER)
    await store.put_tenant(tenant)
    await store.put_cluster(cluster)
    await store.put_user(user)
    assert await store.get_tenant("vision") == tenant
    assert await store.list_tenants() == [tenant]
    assert await store.get_cluster("c1") == cluster
    assert await store.list_clusters() == [cluster]
    assert await store.get_user("alice") == user
    assert await store.list_users() == [user]
    assert await store.get_tenant("nope") is None


async def test_tokens_resolve_to_the_current_user_and_are_stored_only_hashed(
    store: KvStore, kv: MemoryKv
) -> None:
    token = "gpufed_s3cret-token-value"
    await store.put_user(UserRecord("alice", TenantId("vision"), Role.MEMBER))
    await store.put_token(token, "alice")
    assert await store.resolve_token(token) == UserRecord("alice", TenantId("vision"), Role.MEMBER)
    await store.put_user(UserRecord("alice", TenantId("vision"), Role.ADMIN))
    resolved = await store.resolve_token(token)
    assert resolved is not None
    assert resolved.role is Role.ADMIN
    everything = (await kv.range_prefix(b"/")).kvs
    assert not any(token.encode() in kv.key or token.encode() in kv.value for kv in everything)
    assert await store.revoke_token(token) is True
    assert await store.resolve_token(token) is None
    assert await store.revoke_token(token) is False


# ---- the cache


async def test_cache_lists_then_follows_creates_and_updates(
    store: KvStore, cache: JobCache, make_job: MakeJob
) -> None:
    assert cache.synced
    events = cache.subscribe()
    stored, _ = await store.create_job(make_job("j1"), idempotency_key="k", manifest_digest="d")
    admitted = dataclasses.replace(stored.value, phase=JobPhase.ADMITTED)
    revision = await store.commit([(admitted, stored.mod_revision)])
    assert revision is not None
    assert await cache.wait_for_revision(revision, timeout_s=2)
    assert cache.get(JobId("j1")) == type(stored)(admitted, revision)
    first, second = events.get_nowait(), events.get_nowait()
    assert first is not None
    assert second is not None
    assert (first.type, first.mod_revision) == (JobEventType.PUT, stored.mod_revision)
    assert second.job == admitted


async def test_cache_start_sees_jobs_that_existed_before(store: KvStore, make_job: MakeJob) -> None:
    await store.create_job(make_job("old"), idempotency_key="k", manifest_digest="d")
    c = JobCache(store)
    await c.start()
    try:
        assert [s.value.job_id for s in c.jobs()] == ["old"]
    finally:
        await c.stop()


async def test_cache_recovers_from_a_compacted_watch_by_relisting(
    store: KvStore, kv: MemoryKv, cache: JobCache, make_job: MakeJob, loop_clock: LoopClock
) -> None:
    first, _ = await store.create_job(make_job("j1"), idempotency_key="k", manifest_digest="d")
    assert await cache.wait_for_revision(first.mod_revision, timeout_s=3)
    events = cache.subscribe()
    # MemoryKv.put does not yield to the loop, so the cache's watch has not seen this write yet when
    # the history under it is compacted away: its next read of history fails with WatchCompacted.
    updated = dataclasses.replace(first.value, message="changed behind the watch")
    revision = await kv.put(job_key(JobId("j1")), json.dumps(job_to_dict(updated)).encode())
    stored = Stored(updated, revision)
    await kv.put(PREFIX + b"tenants/other", b"{}")
    await kv.compact(kv.revision)
    assert stored.mod_revision < kv.revision
    await until(lambda: not cache.synced, "the cache's watch broke on the compacted history")
    assert not cache.synced, "backing off before the relist"
    # The backoff before the relist (0.2 s at first) passes on the loop's clock, not the wall's.
    loop_clock.advance(1.0)
    assert await cache.wait_for_revision(stored.mod_revision, timeout_s=3)
    assert cache.synced
    assert cache.get(JobId("j1")) == stored
    relisted = events.get_nowait()
    assert relisted == JobEvent(JobEventType.PUT, JobId("j1"), stored.value, stored.mod_revision)
    # ...and follows the watch again afterwards.
    later = await store.commit([(dataclasses.replace(stored.value, message="x"), stored.mod_revision)])
    assert later is not None
    assert await cache.wait_for_revision(later, timeout_s=2)


async def test_a_subscriber_that_falls_behind_is_dropped_with_none(store: KvStore, make_job: MakeJob) -> None:
    c = JobCache(store, queue_size=3)
    await c.start()
    try:
        slow = c.subscribe()
        last = 0
        for i in range(5):
            stored, _ = await store.create_job(
                make_job(f"j{i}"), idempotency_key=f"k{i}", manifest_digest="d"
            )
            last = stored.mod_revision
        assert await c.wait_for_revision(last, timeout_s=2)
        assert slow.get_nowait() is None
        assert slow.empty()
    finally:
        await c.stop()


async def test_wait_for_revision_times_out_for_a_revision_not_yet_written(cache: JobCache) -> None:
    assert await cache.wait_for_revision(cache.revision + 100, timeout_s=0.05) is False


# ---- leader election


async def test_a_standby_takes_over_when_the_leaders_lease_runs_out(
    kv: MemoryKv,
    clock: FakeClock,
    loop_clock: LoopClock,
    leader_watches: asyncio.Event,
    store: KvStore,
    make_job: MakeJob,
) -> None:
    first = LeaderElection(kv, "first", ttl_s=2)
    second = LeaderElection(kv, "second", ttl_s=2)
    old_fence = await first.acquire()
    assert first.is_leader
    standby = asyncio.create_task(second.acquire())
    await asyncio.wait_for(leader_watches.wait(), timeout=10)  # refused: it waits for the key to change
    assert not standby.done()
    # The first leader's process dies: no more keepalives, no revoke.
    assert first._keepalive_task is not None
    first._keepalive_task.cancel()
    clock.now_s += 3
    # The in-memory kv drops an expired lease only when called: the standby calls again once its
    # watch has waited a third of the TTL, on the loop's clock. A whole TTL, at once:
    loop_clock.advance(2.0)
    new_fence = await asyncio.wait_for(standby, timeout=3)
    assert new_fence.create_revision > old_fence.create_revision
    stored, _ = await store.create_job(make_job("j1"), idempotency_key="k", manifest_digest="d")
    job = dataclasses.replace(stored.value, message="scheduled")
    assert await store.commit([(job, stored.mod_revision)], fence=old_fence) is None
    assert await store.commit([(job, stored.mod_revision)], fence=new_fence) is not None
    await second.close()
    await first.close()


async def test_resign_frees_the_key_for_a_standby_at_once(
    kv: MemoryKv, leader_watches: asyncio.Event
) -> None:
    first = LeaderElection(kv, "first", ttl_s=30)
    second = LeaderElection(kv, "second", ttl_s=30)
    await first.acquire()
    standby = asyncio.create_task(second.acquire())
    await asyncio.wait_for(leader_watches.wait(), timeout=10)  # the standby waits for the key to change
    await first.resign()
    assert first.lost().is_set()
    assert not first.is_leader
    await asyncio.wait_for(standby, timeout=2)
    assert second.is_leader
    await second.close()


async def test_a_leader_whose_key_is_taken_sets_lost(kv: MemoryKv, loop_clock: LoopClock) -> None:
    election = LeaderElection(kv, "me", ttl_s=1)
    fence = await election.acquire()
    await kv.delete(fence.key)
    # Its next keepalive (every third of the TTL, on the loop's clock) finds the key gone: that time
    # passes at once. The yield lets the keepalive task that `acquire` created start that wait
    # first; were it to start later, the test would only take the third of a second again.
    await asyncio.sleep(0)
    loop_clock.advance(1.0)
    await asyncio.wait_for(election.lost().wait(), timeout=2)
    assert not election.is_leader
    assert election.fence is None
    await election.close()


async def test_live_jobs_leave_the_index_when_they_finish(
    store: KvStore, cache: JobCache, make_job: MakeJob
) -> None:
    await store.create_job(make_job("live"), idempotency_key="a", manifest_digest="d")
    done, _ = await store.create_job(make_job("done"), idempotency_key="b", manifest_digest="d")
    finished = dataclasses.replace(done.value, phase=JobPhase.CANCELLED)
    revision = await store.commit([(finished, done.mod_revision)])
    assert revision is not None
    assert await cache.wait_for_revision(revision, timeout_s=3)
    assert {s.value.job_id for s in cache.live_jobs()} == {JobId("live")}
    assert {s.value.job_id for s in cache.jobs()} == {JobId("live"), JobId("done")}
