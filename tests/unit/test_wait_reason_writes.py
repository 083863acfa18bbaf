"""How the scheduler stores wait reasons (federation.store.job_store, federation.scheduling.scheduler):
compressed, many jobs to a fenced transaction, each distinct wait worded and encoded once and its
reasons shared by every job that waits for them. A deep queue waits for a handful of reasons, 50
of them a job at 50 clusters: one JSON document and one transaction a job were most of a first
pass, 10 GiB of etcd at a million queued jobs, and a third of the server's memory a job (issue 33)."""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from typing import Any

import grpc
import pytest

from federation.api.v1 import gpufed_pb2 as pb
from federation.errors import NotLeader
from federation.scheduling import scheduler as scheduler_module
from federation.store.job_store import (
    WAIT_WRITES_PER_TXN,
    WAITS,
    Fence,
    InMemoryJobStore,
    cut_wait_writes,
    encode_wait_reasons,
    wait_to_dict,
    waits_from_json,
)
from federation.store.records import Role, TenantRecord, UserRecord
from placement.model import ClusterName, GpuType, JobId, JobPhase, TenantId, WaitCode, WaitReason
from tests.unit.job_service import job_service
from tests.unit.reconcile_world import a_job, build_world, submit
from tests.unit.test_redaction import Aborted, context


def _room_reasons(clusters: int = 50) -> tuple[WaitReason, ...]:
    return tuple(
        WaitReason(
            WaitCode.INSUFFICIENT_CAPACITY,
            f"needs 1 x 8 GPUs of A100; cluster c{c:02d} has 0 free, at most 0 on one node",
            cluster=ClusterName(f"c{c:02d}"),
            gpu_type=GpuType("A100"),
            needed_gpus=8,
            free_gpus=0,
            largest_free_node_gpus=0,
        )
        for c in range(clusters)
    )


async def test_reasons_are_stored_compressed_when_asked_and_reasons_stored_as_json_still_read() -> None:
    store = InMemoryJobStore()
    store.compress_wait_reasons = True
    reasons = _room_reasons()
    await store.put_wait_reasons(JobId("new"), reasons)
    raw = await store._kv.get(WAITS + b"new")
    assert raw is not None
    as_json = json.dumps([wait_to_dict(r) for r in reasons], separators=(",", ":")).encode()
    assert zlib.decompress(raw.value) == as_json
    assert len(raw.value) * 10 < len(as_json)  # 50 clusters' reasons: 10 KiB of JSON, 0.5 KiB stored
    # What a server of an earlier version wrote (and SQL's history keeps): the JSON list itself.
    await store._kv.put(WAITS + b"old", as_json)
    assert await store.get_wait_reasons(JobId("new")) == reasons
    assert await store.get_wait_reasons(JobId("old")) == reasons
    assert await store.list_wait_reasons() == {JobId("new"): reasons, JobId("old"): reasons}
    assert waits_from_json(as_json.decode()) == reasons


def test_a_stored_value_that_is_neither_says_so() -> None:
    with pytest.raises(ValueError, match="neither a JSON list nor compressed"):
        waits_from_json(b"\x00garbage")


async def test_a_new_leader_holds_one_tuple_per_distinct_stored_wait() -> None:
    store = InMemoryJobStore()
    value = encode_wait_reasons(_room_reasons(), compressed=True)
    other = encode_wait_reasons(_room_reasons(3), compressed=True)
    await store.put_encoded_wait_reasons([(JobId(f"j{n}"), value) for n in range(40)] + [(JobId("k"), other)])
    listed = await store.list_wait_reasons()
    assert len({id(r) for r in listed.values()}) == 2
    assert listed[JobId("j7")] == _room_reasons()
    assert listed[JobId("k")] == _room_reasons(3)


async def test_many_jobs_a_transaction_none_deletes_and_the_bounds_are_kept() -> None:
    store = InMemoryJobStore()
    value = encode_wait_reasons(_room_reasons(), compressed=True)
    await store.put_encoded_wait_reasons([(JobId("a"), value), (JobId("b"), value)])
    await store.put_encoded_wait_reasons([(JobId("a"), None), (JobId("c"), value)])
    assert set(await store.list_wait_reasons()) == {JobId("b"), JobId("c")}
    too_many = [(JobId(f"j{n}"), value) for n in range(WAIT_WRITES_PER_TXN + 1)]
    with pytest.raises(ValueError, match=f"at most {WAIT_WRITES_PER_TXN}"):
        await store.put_encoded_wait_reasons(too_many)
    runs = cut_wait_writes([*too_many, *((JobId(f"k{n}"), None) for n in range(70))])
    assert [len(r) for r in runs] == [64, 64, 7]
    # A run is also bounded in bytes: large values go fewer to a transaction.
    big = [(JobId(f"b{n}"), b"x" * 100_000) for n in range(5)]
    assert [len(r) for r in cut_wait_writes(big)] == [2, 2, 1]


async def test_a_deposed_leader_writes_no_reasons() -> None:
    store = InMemoryJobStore()
    await store._kv.put(b"/leader", b"me")
    leader = await store._kv.get(b"/leader")
    assert leader is not None
    created = leader.create_revision
    await store._kv.delete(b"/leader")  # the lease expired: the key is gone
    with pytest.raises(NotLeader):
        await store.put_encoded_wait_reasons(
            [(JobId("a"), encode_wait_reasons(_room_reasons(), compressed=True))],
            fence=Fence(b"/leader", created),
        )
    assert await store.list_wait_reasons() == {}


async def test_a_cycle_writes_many_jobs_a_transaction_and_equal_waits_share_their_reasons(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with build_world() as world:
        # 16 GPUs: two gangs of 2 x 4 run, 148 wait, every one for the same reasons.
        jobs = [await submit(world, a_job(f"j{n:03d}", gpus=4, queued_at_s=1000.0 + n)) for n in range(150)]
        calls: list[int] = []
        put_many = world.store.put_encoded_wait_reasons

        async def counting(values: Sequence[tuple[JobId, bytes | None]], **kwargs: Any) -> None:
            calls.append(len(values))
            await put_many(values, **kwargs)

        monkeypatch.setattr(world.store, "put_encoded_wait_reasons", counting)
        await world.step()
        waiting = [j for j in jobs if (await world.job(j)).phase is JobPhase.QUEUED]
        assert len(waiting) == 148
        # The first cycle: 64 + 64 + 20, not 148 transactions (a later one rewrites what changed).
        assert calls[:3] == [64, 64, 20]
        stored = await world.store.list_wait_reasons()
        assert set(stored) == set(waiting)
        written = world.scheduler._written_reasons
        # What explain reads is what the scheduler holds as written; equal reasons are one tuple.
        assert all(stored[j] == written[j][1] for j in waiting)
        assert len({id(written[j][1]) for j in waiting}) == len({written[j][1] for j in waiting})


async def test_by_default_the_json_list_is_written_as_the_release_before_reads_it() -> None:
    # docs/deploy.md's read-ahead rule: the release before reads only the JSON list, and its leader's
    # every cycle would fail on a compressed value (`gpufed serve --compress-wait-reasons` is asked
    # for once no such server is left).
    store = InMemoryJobStore()
    await store.put_wait_reasons(JobId("a"), _room_reasons(2))
    raw = await store._kv.get(WAITS + b"a")
    assert raw is not None
    assert json.loads(raw.value) == [wait_to_dict(r) for r in _room_reasons(2)]
    assert await store.get_wait_reasons(JobId("a")) == _room_reasons(2)


async def test_another_tenant_learns_nothing_of_reasons_shared_or_batched_with_its_own() -> None:
    """Two tenants' jobs wait for the same reasons: one tuple in the scheduler, their writes in one
    transaction. Each member's explain of its own job reads its reasons; another tenant's member
    asking about it is told no more than of a job that does not exist."""
    tenants = (TenantRecord(name=TenantId("vision")), TenantRecord(name=TenantId("nlp")))
    async with build_world(tenants=tenants) as world:
        for user, tenant in (("alice", "vision"), ("bob", "nlp")):
            await world.store.put_user(UserRecord(user, TenantId(tenant), Role.MEMBER))
            await world.store.put_token(f"{user}-token", user)
        jobs = {
            tenant: [
                await submit(world, a_job(f"{tenant}-{n}", gpus=4, tenant=tenant, queued_at_s=1000.0 + n))
                for n in range(3)
            ]
            for tenant in ("vision", "nlp")
        }
        await world.step()
        waiting = {
            t: [j for j in js if (await world.job(j)).phase is JobPhase.QUEUED] for t, js in jobs.items()
        }
        alices, bobs = waiting["vision"][-1], waiting["nlp"][-1]
        service = job_service(world.store, world.cache)
        mine = await service.ExplainJob(pb.ExplainJobRequest(job_id=alices), context("alice-token"))
        assert [r.message for r in mine.reasons] == [
            r.message for r in await world.store.get_wait_reasons(alices)
        ]
        assert mine.reasons
        with pytest.raises(Aborted) as theirs:
            await service.ExplainJob(pb.ExplainJobRequest(job_id=alices), context("bob-token"))
        with pytest.raises(Aborted) as nothing:
            await service.ExplainJob(pb.ExplainJobRequest(job_id=JobId("no-such-job")), context("bob-token"))
        assert theirs.value.code == nothing.value.code == grpc.StatusCode.NOT_FOUND
        # The same words as for a job that is not there, the id asked for aside.
        assert theirs.value.args[1].replace(alices, "?") == nothing.value.args[1].replace("no-such-job", "?")
        assert await world.store.get_wait_reasons(bobs)


async def test_a_cycle_writes_at_most_its_share_and_the_next_cycles_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new leader over a deep queue wrote every job's reasons in its first cycle: minutes of etcd
    requests, during which it lost its lease (a million queued jobs). Now a cycle writes a bounded
    share, and the next ones (not skipped as idle, though no job changed) the rest."""
    monkeypatch.setattr(scheduler_module, "WAIT_WRITES_PER_CYCLE", 50)
    async with build_world() as world:
        for n in range(150):
            await submit(world, a_job(f"j{n:03d}", gpus=4, queued_at_s=1000.0 + n))
        written = []
        for _ in range(4):
            await world.caught_up()
            await world.scheduler.run_cycle(None)
            written.append(len(await world.store.list_wait_reasons()))
        # The third cycle reads what the second did (it admitted nothing): only the reasons left
        # unwritten keep the idle gate from skipping it.
        assert written == [50, 100, 148, 148]


async def test_a_cycle_makes_no_more_writes_than_it_may_send(monkeypatch: pytest.MonkeyPatch) -> None:
    """The waits past a cycle's bound on writes are not worded and made into writes that are then
    dropped (a new leader over a million queued jobs made a million a cycle, for about 60 cycles): they
    are counted as unread, and the next cycles look at them again."""
    monkeypatch.setattr(scheduler_module, "WAIT_WRITES_PER_CYCLE", 40)
    made: list[int] = []
    original = scheduler_module.Scheduler._reasons_to_write

    def counted(
        self: scheduler_module.Scheduler, *args: Any, **kwargs: Any
    ) -> tuple[list[scheduler_module._ReasonsWrite], list[JobId]]:
        changed, left = original(self, *args, **kwargs)
        made.append(len(changed))
        return changed, left

    monkeypatch.setattr(scheduler_module.Scheduler, "_reasons_to_write", counted)
    async with build_world() as world:
        for n in range(150):
            await submit(world, a_job(f"j{n:03d}", gpus=4, queued_at_s=1000.0 + n))
        unread = []
        for _ in range(5):
            await world.caught_up()
            await world.scheduler.run_cycle(None)
            unread.append(world.scheduler.reasons_unread)
        assert made == [40, 40, 40, 28]  # the fifth cycle skipped as idle: nothing left to write
        assert unread == [108, 68, 28, 0, 0]
        assert len(await world.store.list_wait_reasons()) == 148
