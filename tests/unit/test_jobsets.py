"""Job sets and arrays through the real servicer over the in-memory store and the job cache: the
hold and its release within the limit (also with two controllers racing, and after a "crash"),
idempotent submission, cancel, resubmit of failed jobs, `list --set`, and what another tenant can
learn or touch through a set."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from typing import Any

import grpc
import pytest

from federation.api.service import JobService
from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CallContext
from federation.console.calls import CallRefused as Refused
from federation.jobsets.controller import SetController
from federation.jobsets.records import (
    JobSetRecord,
    MemberState,
    SetMember,
    SetTemplate,
    decode_set,
    encode_set,
    set_key,
)
from federation.jobsets.status import MemberView, set_status
from federation.jobsets.store import ARRAY_INDEX_ENV, JOB_SET_ENV, JobSetStore
from federation.store.intervals import LedgerInterval
from federation.store.job_cache import JobCache
from federation.store.job_store import InMemoryJobStore, KvStore
from federation.store.jobs import JobRecord, job_from_dict, job_from_json, job_to_dict
from federation.store.records import Role, TenantRecord, UserRecord
from placement.model import CapacityKind, ClusterName, GpuType, JobId, JobPhase, TenantId
from tests.conftest import build_job
from tests.unit.job_service import job_service

PEER = "ipv4:127.0.0.1:40000"


def manifest(name: str = "shard", *, gpus: int = 1, tenant: str | None = None, image: str = "eval:1") -> str:
    tenant_line = f"  tenant: {tenant}\n" if tenant else ""
    return (
        "apiVersion: gpufed.io/v1\nkind: TrainingJob\n"
        f"metadata:\n  name: {name}\n"
        f"spec:\n{tenant_line}  gpuTypes: [A100]\n"
        "  tasks:\n"
        f"    - {{name: worker, replicas: 1, image: {image!r}, gpus: {gpus}, env: {{SEED: '1'}}}}\n"
    )


@dataclass
class World:
    service: JobService
    store: KvStore
    cache: JobCache

    def ctx(self, who: str) -> Any:
        return CallContext(who, PEER)

    async def submit(
        self, who: str, name: str, manifests: list[str], **fields: Any
    ) -> pb.SubmitJobSetResponse:
        req = pb.SubmitJobSetRequest(name=name, manifests=manifests, **fields)
        return await self.service.SubmitJobSet(req, self.ctx(who))

    async def get(self, who: str, name: str, tenant: str = "") -> pb.JobSet:
        return await self.service.GetJobSet(pb.GetJobSetRequest(name=name, tenant=tenant), self.ctx(who))

    async def jobs_of(self, who: str, name: str) -> list[pb.Job]:
        reply = await self.service.ListJobs(pb.ListJobsRequest(job_set=name), self.ctx(who))
        return list(reply.jobs)

    async def end(self, job_id: str, phase: JobPhase) -> None:
        """The job's end as the reconciler would write it (the table's writer is not under test)."""
        stored = await self.store.get_job(JobId(job_id))
        assert stored is not None
        revision = await self.store.commit([(replace(stored.value, phase=phase), stored.mod_revision)])
        assert revision is not None
        assert await self.cache.wait_for_revision(revision)

    async def pass_once(self) -> None:
        """One controller pass, then the cache caught up with what it wrote."""
        await self.controller().pass_once()
        revision = (await self.store.kv.range_prefix(b"/gpufed/", limit=1)).revision
        assert await self.cache.wait_for_revision(revision)

    def live(self, name: str) -> list[JobRecord]:
        return [
            s.value for s in self.cache.jobs() if s.value.job_set == name and not s.value.phase.is_terminal
        ]

    def controller(self) -> SetController:
        assert self.service.job_sets is not None
        return self.service.job_sets.controller


@pytest.fixture
async def world() -> Any:
    store = InMemoryJobStore()
    for name in ("vision", "nlp"):
        await store.put_tenant(TenantRecord(TenantId(name)))
    for user, tenant, role in [
        ("admin", "vision", Role.ADMIN),
        ("ops", "vision", Role.INFRA),
        ("fin", "vision", Role.FINANCE),
        ("alice", "vision", Role.MEMBER),
        ("bob", "nlp", Role.MEMBER),
    ]:
        await store.put_user(UserRecord(user, TenantId(tenant), role))
        await store.put_token(user, user)
    cache = JobCache(store)
    await cache.start()
    yield World(job_service(store, cache), store, cache)
    await cache.stop()


def counts(shown: pb.JobSet) -> dict[str, int]:
    return {c.phase: c.jobs for c in shown.counts}


async def test_an_array_releases_only_its_limit_and_holds_the_rest_saying_why(world: World) -> None:
    reply = await world.submit("alice", "evals", [manifest()], array="0-9%3")
    assert reply.created
    shown = reply.job_set
    assert (shown.array, shown.max_parallel, shown.job_count) == ("0-9%3", 3, 10)
    assert counts(shown) == {"HELD": 7, "QUEUED": 3}
    held = [m for m in shown.members if m.held]
    assert held[0].reason == (
        "held: the set allows at most 3 jobs at once and 3 are queued or running; released as they finish"
    )
    jobs = await world.jobs_of("alice", "evals")
    assert sorted(j.array_index for j in jobs) == [0, 1, 2]
    for job in jobs:
        record = world.cache.get(JobId(job.job_id))
        assert record is not None
        env = dict(record.value.spec.tasks[0].env)
        # Each copy sees its own index, and the manifest's own variables are kept.
        assert env[ARRAY_INDEX_ENV] == str(job.array_index)
        assert env[JOB_SET_ENV] == "evals"
        assert env["SEED"] == "1"
        assert job.job_set == "evals"


async def test_members_are_released_as_others_end_and_never_more_than_the_limit(world: World) -> None:
    await world.submit("alice", "evals", [manifest()], array="0-9%3")
    seen_max = 0
    for _ in range(20):
        live = world.live("evals")
        seen_max = max(seen_max, len(live))
        if not live:
            break
        await world.end(live[0].job_id, JobPhase.SUCCEEDED)
        await world.pass_once()
    assert seen_max == 3
    shown = await world.get("alice", "evals")
    assert counts(shown) == {"SUCCEEDED": 10}
    assert shown.done


async def test_two_controllers_racing_never_release_past_the_limit(world: World) -> None:
    await world.submit("alice", "evals", [manifest()], array="0-29%4")
    assert world.service.job_sets is not None
    other = SetController(sets=world.service.job_sets.sets, store=world.store, cache=world.cache)
    for _ in range(40):
        live = world.live("evals")
        assert len(live) <= 4
        if not live:
            break
        for job in live[:2]:
            await world.end(job.job_id, JobPhase.SUCCEEDED)
        await asyncio.gather(world.controller().pass_once(), other.pass_once())
        records = [s.value for s in (await world.store.list_jobs())[0] if s.value.job_set == "evals"]
        assert sum(1 for j in records if not j.phase.is_terminal) <= 4
    assert counts(await world.get("alice", "evals")) == {"SUCCEEDED": 30}


async def test_a_controller_that_read_an_old_revision_releases_nothing_and_overwrites_nothing(
    world: World,
) -> None:
    """Another server's controller (or this one before a restart) holding the set as it was before
    a release: its own release must fail whole, leaving the running job and the limit as they are."""
    sets = JobSetStore(world.store.kv)
    await world.submit("alice", "evals", [manifest()], array="0-9%2")
    stale = await sets.get("vision", "evals")
    assert stale is not None
    first, second = sorted(world.live("evals"), key=lambda j: j.array_index or 0)
    await world.end(first.job_id, JobPhase.SUCCEEDED)
    await world.pass_once()
    (third,) = [j for j in world.live("evals") if j.array_index == 2]
    await world.end(third.job_id, JobPhase.RUNNING)
    await world.end(second.job_id, JobPhase.SUCCEEDED)
    slow = SetController(sets=sets, store=world.store, cache=world.cache)
    decided = await slow.ended(stale.value)
    assert decided == {first.job_id, second.job_id}
    after = await slow.step(stale)
    assert after.mod_revision > stale.mod_revision  # it lost the race, read again, and went on
    running = await world.store.get_job(third.job_id)
    assert running is not None
    assert running.value.phase is JobPhase.RUNNING
    revision = (await world.store.kv.range_prefix(b"/gpufed/", limit=1)).revision
    assert await world.cache.wait_for_revision(revision)
    assert sorted(j.array_index or 0 for j in world.live("evals")) == [2, 3]


async def test_a_restart_loses_no_member_and_redoes_no_release(world: World) -> None:
    """A crash between the set's submission and its release: the set record alone holds the members,
    and a new controller (a restarted server's) releases them from it, each job once."""
    sets = JobSetStore(world.store.kv)
    await world.submit("alice", "evals", [manifest()], array="0-5%2")
    stored = await sets.get("vision", "evals")
    assert stored is not None
    # Release again what is released already, as a controller that read an old revision would.
    fresh = SetController(sets=sets, store=world.store, cache=world.cache)
    await fresh.pass_once()
    await fresh.pass_once()
    assert len(world.live("evals")) == 2
    for job in world.live("evals"):
        await world.end(job.job_id, JobPhase.FAILED)
    restarted = SetController(sets=sets, store=world.store, cache=JobCache(world.store))
    await restarted.pass_once()  # an empty cache: the jobs' ends are read from etcd
    jobs = [s.value for s in (await world.store.list_jobs())[0] if s.value.job_set == "evals"]
    assert len(jobs) == 4
    assert len({j.job_id for j in jobs}) == 4


async def test_the_same_set_again_creates_nothing_and_another_under_its_name_is_refused(world: World) -> None:
    first = await world.submit("alice", "evals", [manifest()], array="0-4%2")
    again = await world.submit("alice", "evals", [manifest()], array="0-4%2")
    assert not again.created
    assert [m.job_id for m in again.job_set.members] == [m.job_id for m in first.job_set.members]
    assert len(await world.jobs_of("alice", "evals")) == 2
    with pytest.raises(Refused) as refused:
        await world.submit("alice", "evals", [manifest()], array="0-5%2")
    assert refused.value.code is grpc.StatusCode.ALREADY_EXISTS
    assert "already exists in tenant vision with other jobs or limits" in refused.value.details


async def test_a_set_of_named_jobs_and_its_bad_input(world: World) -> None:
    reply = await world.submit(
        "alice", "prep", [manifest("tokenize"), manifest("dedupe", gpus=2)], max_parallel=0
    )
    assert counts(reply.job_set) == {"QUEUED": 2}
    assert sorted(m.key for m in reply.job_set.members) == ["dedupe", "tokenize"]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"name": "x", "manifests": [manifest("a"), manifest("a")]}, "a appear more than once"),
        ({"name": "Bad_Name", "manifests": [manifest()]}, "name: must be a DNS label"),
        ({"name": "x", "manifests": []}, "at least one TrainingJob manifest"),
        (
            {"name": "x", "manifests": [manifest(), manifest("b")], "array": "0-3"},
            "an array runs one manifest once per index",
        ),
        ({"name": "x", "manifests": [manifest()], "array": "0-3%2", "max_parallel": 3}, "disagrees"),
        ({"name": "x", "manifests": [manifest(), "kind: Nope"]}, "manifests[1]."),
        ({"name": "x", "manifests": [manifest()], "array": "5-1"}, "ends before it starts"),
    ]
    for fields, says in cases:
        with pytest.raises(Refused) as refused:
            await world.service.SubmitJobSet(pb.SubmitJobSetRequest(**fields), world.ctx("alice"))
        assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT, fields
        assert says in refused.value.details, (fields, refused.value.details)
    # Nothing of a refused set was stored.
    assert await JobSetStore(world.store.kv).get("vision", "x") is None


async def test_cancel_stops_every_live_job_and_releases_no_held_one(world: World) -> None:
    await world.submit("alice", "evals", [manifest()], array="0-9%3")
    shown = await world.service.CancelJobSet(pb.CancelJobSetRequest(name="evals"), world.ctx("alice"))
    assert shown.cancel_requested
    assert counts(shown) == {"CANCELLED": 7, "QUEUED": 3}
    for job in world.live("evals"):
        stored = await world.store.get_job(job.job_id)
        assert stored is not None
        assert stored.value.cancel_requested
    for job in world.live("evals"):
        await world.end(job.job_id, JobPhase.CANCELLED)
    await world.pass_once()
    assert world.live("evals") == []
    assert (await world.get("alice", "evals")).done
    with pytest.raises(Refused) as refused:
        await world.service.ResubmitJobSet(pb.ResubmitJobSetRequest(name="evals"), world.ctx("alice"))
    assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION


async def test_resubmit_runs_the_failed_members_again_within_the_limit(world: World) -> None:
    await world.submit("alice", "evals", [manifest()], array="0-3%2")
    first = world.live("evals")
    await world.end(first[0].job_id, JobPhase.FAILED)
    await world.end(first[1].job_id, JobPhase.SUCCEEDED)
    await world.pass_once()
    for job in world.live("evals"):
        await world.end(job.job_id, JobPhase.FAILED if job.array_index == 2 else JobPhase.SUCCEEDED)
    shown = await world.service.ResubmitJobSet(pb.ResubmitJobSetRequest(name="evals"), world.ctx("alice"))
    assert counts(shown) == {"QUEUED": 2, "SUCCEEDED": 2}
    again = {m.key: m for m in shown.members if m.earlier_job_ids}
    assert set(again) == {str(first[0].array_index), "2"}
    assert again["2"].job_id not in again["2"].earlier_job_ids
    with pytest.raises(Refused) as refused:
        await world.service.ResubmitJobSet(pb.ResubmitJobSetRequest(name="evals"), world.ctx("alice"))
    assert "no failed job to resubmit" in refused.value.details


async def test_another_tenant_can_neither_see_nor_touch_a_set_nor_add_to_it_by_its_name(world: World) -> None:
    await world.submit("alice", "evals", [manifest()], array="0-4%2")
    missing_words = "job set 'evals' not found"
    for call, req in [
        (world.service.GetJobSet, pb.GetJobSetRequest(name="evals")),
        (world.service.GetJobSet, pb.GetJobSetRequest(name="evals", tenant="vision")),
        (world.service.CancelJobSet, pb.CancelJobSetRequest(name="evals", tenant="vision")),
        (world.service.ResubmitJobSet, pb.ResubmitJobSetRequest(name="evals", tenant="vision")),
    ]:
        with pytest.raises(Refused) as refused:
            await call(req, world.ctx("bob"))  # type: ignore[operator]
        assert refused.value.code is grpc.StatusCode.NOT_FOUND
        assert refused.value.details == missing_words
    # The same answer as for a set that does not exist at all.
    with pytest.raises(Refused) as refused:
        await world.get("alice", "nothing-here")
    assert refused.value.details == "job set 'nothing-here' not found"
    listed = await world.service.ListJobSets(pb.ListJobSetsRequest(), world.ctx("bob"))
    assert list(listed.job_sets) == []
    with pytest.raises(Refused) as refused:
        await world.service.ListJobSets(pb.ListJobSetsRequest(tenant="vision"), world.ctx("bob"))
    assert refused.value.code is grpc.StatusCode.PERMISSION_DENIED
    assert await world.jobs_of("bob", "evals") == []
    # Bob's own set of the same name is his, and adds nothing to alice's.
    mine = await world.submit("bob", "evals", [manifest()], array="0-1")
    assert mine.created
    assert mine.job_set.tenant == "nlp"
    assert (await world.get("alice", "evals")).job_count == 5
    assert len(await world.jobs_of("alice", "evals")) == 2
    # Naming alice's tenant in a manifest is refused, as for a single job.
    with pytest.raises(Refused) as refused:
        await world.submit("bob", "sneak", [manifest(tenant="vision")])
    assert refused.value.code is grpc.StatusCode.PERMISSION_DENIED
    # Finance reads no jobs, so no sets; admins and infra read every tenant's.
    with pytest.raises(Refused):
        await world.service.ListJobSets(pb.ListJobSetsRequest(), world.ctx("fin"))
    assert (await world.get("ops", "evals", tenant="vision")).job_count == 5
    everyone = await world.service.ListJobSets(pb.ListJobSetsRequest(), world.ctx("admin"))
    assert sorted((s.tenant, s.name) for s in everyone.job_sets) == [("nlp", "evals"), ("vision", "evals")]
    # Infra reads but may not cancel.
    with pytest.raises(Refused) as refused:
        await world.service.CancelJobSet(
            pb.CancelJobSetRequest(name="evals", tenant="vision"), world.ctx("ops")
        )
    assert refused.value.code is grpc.StatusCode.PERMISSION_DENIED


def test_a_job_record_stored_before_sets_still_loads() -> None:
    job = build_job("old", tenant="vision")
    stored = job_to_dict(job)
    assert "job_set" not in stored
    assert "array_index" not in stored
    assert job_from_dict(stored) == job
    with_set = replace(job, job_set="evals", array_index=4)
    raw = json.dumps(job_to_dict(with_set)).encode()
    assert job_from_json(raw) == with_set
    assert job_from_dict(json.loads(raw)) == with_set


async def test_a_set_record_reads_back_as_written(world: World) -> None:
    await world.submit("alice", "evals", [manifest()], array="0-2%1")
    raw = await world.store.kv.get(set_key("vision", "evals"))
    assert raw is not None
    record: JobSetRecord = decode_set(raw.value)
    assert decode_set(encode_set(record)) == record
    assert [m.state for m in record.members] == [MemberState.RELEASED, MemberState.HELD, MemberState.HELD]


def _interval(
    job_id: str, attempt: int, gpus: int, start_s: float, end_s: float | None, rate: float
) -> LedgerInterval:
    return LedgerInterval(
        job_id=JobId(job_id),
        attempt=attempt,
        tenant=TenantId("vision"),
        user="alice",
        cluster=ClusterName("onprem"),
        provider="private",
        region="dc1",
        gpu_type=GpuType("A100"),
        gpu_count=gpus,
        kind=CapacityKind.PRIVATE,
        start_s=start_s,
        end_s=end_s,
        usd_per_gpu_hour=rate,
    )


def test_a_sets_gpu_hours_and_cost_sum_every_run_of_every_member_up_to_now() -> None:
    """Counts by phase, GPU-hours and cost so far: an ended member's earlier (failed) run and its
    rerun, and a running member's open interval counted up to now."""
    job = build_job("x", tenant="vision")
    record = JobSetRecord(
        tenant=TenantId("vision"),
        name="evals",
        user="alice",
        created_at_s=0.0,
        digest="d",
        max_parallel=2,
        array="0-2%2",
        templates=(SetTemplate(job.spec, 0, "d"),),
        members=(
            SetMember("0", 0, 0, JobId("a2"), MemberState.RELEASED, earlier=(JobId("a1"),)),
            SetMember("1", 0, 1, JobId("b"), MemberState.RELEASED),
            SetMember("2", 0, 2, JobId("c"), MemberState.HELD),
        ),
    )
    now = 10_000.0
    views = [
        MemberView(
            record.members[0],
            replace(job, job_id=JobId("a2"), phase=JobPhase.SUCCEEDED),
            # The failed first run: 2 GPUs for half an hour at $2; the rerun: 1 GPU for an hour at $1.
            (_interval("a1", 1, 2, 0.0, 1800.0, 2.0), _interval("a2", 1, 1, 2000.0, 5600.0, 1.0)),
        ),
        # Running: 4 GPUs since an hour ago at $0.5, open.
        MemberView(
            record.members[1],
            replace(job, job_id=JobId("b"), phase=JobPhase.RUNNING),
            (_interval("b", 1, 4, now - 3600.0, None, 0.5),),
        ),
        MemberView(record.members[2], None, ()),
    ]
    status = set_status(record, views, now_s=now)
    assert status.counts == {"HELD": 1, "RUNNING": 1, "SUCCEEDED": 1}
    assert status.gpu_hours == pytest.approx(1.0 + 1.0 + 4.0)
    assert status.micro_usd == 2_000_000 + 1_000_000 + 2_000_000
    assert not status.done
    held = status.members[2]
    assert held.reason.startswith("held: the set allows at most 2 jobs at once and 1 are queued or running")
