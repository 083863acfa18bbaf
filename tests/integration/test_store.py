"""The job store and its cache on real etcd, including etcd going away and coming back."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from federation.errors import IdempotencyConflict, StoreUnavailable
from federation.runtime.etcd_process import EtcdProcess
from federation.store.job_cache import JobCache
from federation.store.job_store import PREFIX, KvStore, job_key
from federation.store.jobs import JobRecord, job_from_dict, job_to_dict
from federation.store.kv import ReplyTooLarge
from federation.store.kv_etcd import EtcdKv
from federation.store.kv_pages import FIRST_PAGE_KEYS, pages
from federation.store.records import Role, UserRecord
from placement.model import JobId, JobPhase, TenantId
from tests.procstop import is_stopped

pytestmark = pytest.mark.integration

MakeJob = Callable[..., JobRecord]
_T = TypeVar("_T")


async def test_create_job_is_idempotent_per_key_and_digest(etcd_store: KvStore, make_job: MakeJob) -> None:
    first, created = await etcd_store.create_job(make_job("j1"), idempotency_key="k1", manifest_digest="d1")
    assert created
    again, created_again = await etcd_store.create_job(
        make_job("j2"), idempotency_key="k1", manifest_digest="d1"
    )
    assert not created_again
    assert again == first
    with pytest.raises(IdempotencyConflict, match="k1"):
        await etcd_store.create_job(make_job("j3"), idempotency_key="k1", manifest_digest="other")
    jobs, _ = await etcd_store.list_jobs()
    assert [s.value.job_id for s in jobs] == ["j1"]


async def test_fifty_concurrent_creates_with_one_key_make_exactly_one_job(
    etcd_store: KvStore, make_job: MakeJob
) -> None:
    results = await asyncio.gather(
        *(
            etcd_store.create_job(make_job(f"j{i}"), idempotency_key="same", manifest_digest="d")
            for i in range(50)
        )
    )
    assert sum(created for _, created in results) == 1
    assert len({(s.value.job_id, s.mod_revision) for s, _ in results}) == 1
    jobs, _ = await etcd_store.list_jobs()
    assert len(jobs) == 1


async def test_commit_is_compare_and_swap(etcd_store: KvStore, make_job: MakeJob) -> None:
    stored, _ = await etcd_store.create_job(make_job("j1"), idempotency_key="k", manifest_digest="d")
    admitted = dataclasses.replace(stored.value, phase=JobPhase.ADMITTED)
    revision = await etcd_store.commit([(admitted, stored.mod_revision)])
    assert revision is not None
    current = await etcd_store.get_job(JobId("j1"))
    assert current is not None
    assert (current.value.phase, current.mod_revision) == (JobPhase.ADMITTED, revision)
    # A writer that read before that commit loses.
    assert (
        await etcd_store.commit([(dataclasses.replace(stored.value, message="stale"), stored.mod_revision)])
        is None
    )
    current = await etcd_store.get_job(JobId("j1"))
    assert current is not None
    assert current.value.message == ""


async def test_list_jobs_pages_through_more_than_a_thousand_jobs(
    etcd_store: KvStore, make_job: MakeJob
) -> None:
    total = FIRST_PAGE_KEYS + 200
    sem = asyncio.Semaphore(64)

    async def create(i: int) -> None:
        async with sem:
            await etcd_store.create_job(make_job(f"j{i:05d}"), idempotency_key=f"k{i}", manifest_digest="d")

    await asyncio.gather(*(create(i) for i in range(total)))
    jobs, revision = await etcd_store.list_jobs()
    assert [s.value.job_id for s in jobs] == [f"j{i:05d}" for i in range(total)]
    assert revision >= max(s.mod_revision for s in jobs)


async def test_a_reply_past_the_clients_cap_is_reply_too_large_and_paging_reads_it_in_halves(
    etcd_process: EtcdProcess, etcd_kv: EtcdKv
) -> None:
    # gRPC refuses a reply larger than the channel's cap with RESOURCE_EXHAUSTED, which also means
    # an overloaded member; this one is ours, the same on every member, so it must not fail over.
    prefix = PREFIX + b"pages/"
    for i in range(0, 120, 40):
        await asyncio.gather(*(etcd_kv.put(prefix + b"%04d" % n, b"x" * 2_000) for n in range(i, i + 40)))
    small = await EtcdKv.connect(etcd_process.endpoint, max_reply_bytes=64 * 1024)
    try:
        with pytest.raises(ReplyTooLarge):
            await small.range_prefix(prefix)
        got: list[bytes] = []
        async for page, _ in pages(small, prefix):
            got.extend(kv.key for kv in page)
        assert got == [prefix + b"%04d" % n for n in range(120)]
    finally:
        await small.close()


async def test_tokens_are_never_stored_in_plaintext(etcd_store: KvStore, etcd_kv: EtcdKv) -> None:
    token = "gpufed_0123456789abcdef-plaintext"
    await etcd_store.put_user(UserRecord("bob", TenantId("nlp"), Role.MEMBER))
    await etcd_store.put_token(token, "bob")
    assert await etcd_store.resolve_token(token) == UserRecord("bob", TenantId("nlp"), Role.MEMBER)
    stored = (await etcd_kv.range_prefix(PREFIX)).kvs
    assert stored
    assert not any(token.encode() in kv.key or token.encode() in kv.value for kv in stored)
    assert await etcd_store.revoke_token(token)
    assert await etcd_store.resolve_token(token) is None


async def test_cache_lists_then_watches_creates_and_updates(etcd_store: KvStore, make_job: MakeJob) -> None:
    before, _ = await etcd_store.create_job(make_job("before"), idempotency_key="k0", manifest_digest="d")
    cache = JobCache(etcd_store)
    await cache.start()
    try:
        assert cache.get(JobId("before")) == before
        changes = cache.subscribe()
        after, _ = await etcd_store.create_job(make_job("after"), idempotency_key="k1", manifest_digest="d")
        admitted = dataclasses.replace(before.value, phase=JobPhase.ADMITTED)
        revision = await etcd_store.commit([(admitted, before.mod_revision)])
        assert revision is not None
        assert await cache.wait_for_revision(revision)
        assert cache.get(JobId("after")) == after
        current = cache.get(JobId("before"))
        assert current is not None
        assert current.value.phase is JobPhase.ADMITTED
        seen = [changes.get_nowait(), changes.get_nowait()]
        assert [(e.job_id, e.mod_revision) for e in seen if e is not None] == [
            ("after", after.mod_revision),
            ("before", revision),
        ]
    finally:
        await cache.stop()


async def _once_etcd_answers(call: Callable[[], Awaitable[_T]], within_s: float = 20.0) -> _T:
    """`call`'s result once etcd answers it; UNAVAILABLE only until `within_s` has passed."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await call()
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_a_dead_etcd_fails_fast_and_its_data_survives_a_restart(
    tmp_path: Path, make_job: MakeJob
) -> None:
    etcd = EtcdProcess(tmp_path / "etcd")
    etcd.start()
    kv = await EtcdKv.connect(etcd.endpoint, timeout_s=2.0)
    cache: JobCache | None = None
    try:
        store = KvStore(kv)
        stored, _ = await store.create_job(make_job("survivor"), idempotency_key="k", manifest_digest="d")
        cache = JobCache(store)
        await cache.start()

        etcd.kill()
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "get_job": lambda: store.get_job(JobId("survivor")),
            "create_job": lambda: store.create_job(make_job("j2"), idempotency_key="k2", manifest_digest="d"),
            "list_jobs": store.list_jobs,
            "commit": lambda: store.commit([(stored.value, stored.mod_revision)]),
            "grant_lease": lambda: kv.grant_lease(5),
        }
        for call in calls.values():
            # Fails rather than waits for etcd to come back: within the client's 2 s deadline, but
            # bounded here at ten times that, so that a busy machine does not fail a behaviour by
            # its speed (a call that waited for etcd would never end, and meets the bound).
            with pytest.raises(StoreUnavailable, match=etcd.endpoint):
                async with asyncio.timeout(20):
                    await call()
        for _ in range(400):  # 20 s at most
            if not cache.synced:
                break
            await asyncio.sleep(0.05)
        assert not cache.synced, "the cache should notice its watch broke"

        etcd.start()  # same data dir, same ports
        # Recovery, not its latency, is the promise: the channel may still be between reconnect
        # attempts when etcd is back, so the first calls may fail UNAVAILABLE for a moment.
        again = await _once_etcd_answers(lambda: store.get_job(JobId("survivor")))
        assert again == stored
        later, _ = await store.create_job(make_job("later"), idempotency_key="k3", manifest_digest="d")
        assert await cache.wait_for_revision(later.mod_revision, timeout_s=10)
        assert cache.synced
        assert cache.get(JobId("later")) == later
    finally:
        if cache is not None:
            await cache.stop()
        await kv.close()
        etcd.stop()

    # `gpufed up` again: a new process on the same data dir, with whatever ports are free now.
    with EtcdProcess(tmp_path / "etcd") as reborn:
        kv = await EtcdKv.connect(reborn.endpoint)
        try:
            assert await _once_etcd_answers(lambda: KvStore(kv).get_job(JobId("survivor"))) == stored
        finally:
            await kv.close()


async def test_the_cache_follows_an_etcd_that_came_back_without_its_last_writes(
    tmp_path: Path, make_job: MakeJob
) -> None:
    """A single-member etcd before 3.5.5 may lose writes it had acknowledged when it is killed
    (etcd-io/etcd#14370; the embedded default's 3.5.1 did so under test_etcd_outage), and an etcd
    put back to an earlier copy does the same: its revisions count again from an earlier one. The
    cache must follow the new history. Here etcd comes back on a copy of its data dir taken before
    two writes, which is what such a crash leaves."""
    etcd = EtcdProcess(tmp_path / "etcd")
    etcd.start()
    kv = await EtcdKv.connect(etcd.endpoint, timeout_s=2.0)
    cache: JobCache | None = None
    try:
        store = KvStore(kv)
        kept, _ = await store.create_job(make_job("kept"), idempotency_key="k1", manifest_digest="d")
        etcd.stop()
        shutil.copytree(etcd.data_dir / "member", tmp_path / "earlier")
        etcd.start()
        cache = JobCache(store)
        await cache.start()
        # Two writes the crash will lose, seen by the cache.
        admitted = dataclasses.replace(kept.value, phase=JobPhase.ADMITTED)
        lost_revision = await _once_etcd_answers(lambda: store.commit([(admitted, kept.mod_revision)]))
        assert lost_revision is not None
        lost, _ = await store.create_job(make_job("lost"), idempotency_key="k2", manifest_digest="d")
        assert await cache.wait_for_revision(lost.mod_revision)

        etcd.kill()
        shutil.rmtree(etcd.data_dir / "member")
        shutil.copytree(tmp_path / "earlier", etcd.data_dir / "member")
        etcd.start()  # same ports, the earlier data
        again = await _once_etcd_answers(lambda: store.get_job(JobId("kept")))
        assert again == kept
        # Once the cache has listed the earlier data again, the new history writes at revisions the
        # cache had already passed.
        deadline = time.monotonic() + 20
        while not (cache.synced and cache.get(JobId("lost")) is None):
            assert time.monotonic() < deadline, "the cache never listed etcd's data again"
            await asyncio.sleep(0.05)
        assert cache.get(JobId("kept")) == kept
        running = dataclasses.replace(kept.value, phase=JobPhase.RUNNING)
        revision = await store.commit([(running, kept.mod_revision)])
        assert revision is not None
        assert revision <= lost.mod_revision

        def follows() -> bool:
            assert cache is not None
            now = cache.get(JobId("kept"))
            return (
                cache.synced
                and now is not None
                and (now.value.phase, now.mod_revision) == (JobPhase.RUNNING, revision)
                and cache.get(JobId("lost")) is None
            )

        deadline = time.monotonic() + 20
        while not follows():
            assert time.monotonic() < deadline, (cache.get(JobId("kept")), cache.revision)
            await asyncio.sleep(0.05)
        assert cache.revision == revision
        # And the cache's view is one a commit can start from.
        later = cache.get(JobId("kept"))
        assert later is not None
        assert await store.commit(
            [(dataclasses.replace(later.value, phase=JobPhase.SUCCEEDED), later.mod_revision)]
        )
    finally:
        if cache is not None:
            await cache.stop()
        await kv.close()
        etcd.stop()


async def test_a_hung_etcd_fails_calls_at_the_deadline_instead_of_hanging(tmp_path: Path) -> None:
    with EtcdProcess(tmp_path / "etcd") as etcd:
        kv = await EtcdKv.connect(etcd.endpoint, timeout_s=1.0)
        assert etcd.pid is not None
        try:
            os.kill(etcd.pid, signal.SIGSTOP)  # alive, connected, silent: only a deadline helps
            # The signal lands asynchronously; on a busy machine etcd could still answer one more call.
            await _stopped(etcd.pid)
            # The client's deadline ends it (DEADLINE_EXCEEDED, not a wait until etcd answers);
            # bounded here at twenty times that rather than timed, which a busy machine would fail.
            with pytest.raises(StoreUnavailable, match="DEADLINE_EXCEEDED"):
                async with asyncio.timeout(20):
                    await kv.get(b"/gpufed/jobs/x")
        finally:
            os.kill(etcd.pid, signal.SIGCONT)
            await kv.close()


async def _stopped(pid: int, timeout_s: float = 5.0) -> None:
    """Wait until every thread of `pid` is stopped (state T in /proc)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if is_stopped(pid):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"etcd {pid} did not stop")


async def test_the_cache_over_etcd_holds_what_decoding_every_record_eagerly_gives(
    etcd_store: KvStore, make_job: MakeJob
) -> None:
    """Ended jobs are listed undecoded (issue 19, restart to serving), live ones decoded, records
    of an older shape by the dict codec: read back, each is what `job_from_dict` makes of etcd's
    bytes, over more than a page."""
    raws: dict[str, bytes] = {}
    for n in range(FIRST_PAGE_KEYS + 50):
        job = dataclasses.replace(
            make_job(f"r{n:05d}"),
            phase=(JobPhase.SUCCEEDED, JobPhase.QUEUED, JobPhase.FAILED)[n % 3],
            submitted_at_s=float(n % 97),
            attempt=2,
            retries_used=1,
        )
        d = job_to_dict(job)
        if n % 10 == 0:
            del d["retries_used"], d["refusals"], d["reason"]  # as written before they existed
        raws[job.job_id] = json.dumps(d).encode()
    items = list(raws.items())
    for i in range(0, len(items), 100):
        await asyncio.gather(*(etcd_store.kv.put(job_key(job_id), raw) for job_id, raw in items[i : i + 100]))
    cache = JobCache(etcd_store)
    await cache.start()
    try:
        got = {s.value.job_id: s.value for s in cache.jobs()}
        assert got == {job_id: job_from_dict(json.loads(raw)) for job_id, raw in raws.items()}
        assert [s.value.job_id for s in cache.ordered()] == sorted(
            raws, key=lambda job_id: (got[JobId(job_id)].submitted_at_s, job_id)
        )
    finally:
        await cache.stop()
