"""Replies say nothing of tenants the caller may not read, and still say why.

The servicers run in-process over the in-memory store (the same transactions as on etcd). Tenant
`research` is the parent of `vision` and `nlp`; alice is a member of vision, bob of nlp. Alice's job
was preempted for one of bob's jobs, and waits on research's cap, whose figures include bob's usage:
alice is told that a job of another tenant preempted hers and that a parent tenant's cap holds it
back, not which job, nor research's name or figures. An admin reads every reason as written.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import grpc
import pytest

from federation.api.redact import OTHER_JOB, OTHER_TENANT, Redactor
from federation.api.service import Ctx, JobService
from federation.api.v1 import gpufed_pb2 as pb
from federation.security.auth import Principal
from federation.spec.training_job import parse_manifest
from federation.store.job_cache import JobCache
from federation.store.job_store import InMemoryJobStore
from federation.store.jobs import JobRecord, PhaseEvent
from federation.store.records import Role, TenantRecord, UserRecord
from placement import explain
from placement.model import GpuType, JobId, JobPhase, TenantId
from tests.e2e.harness import manifest
from tests.unit.job_service import job_service

PREEMPTOR = JobId("bobs-secret-run-0badc0de")
SIBLING = JobId("alices-other-run-00c0ffee")
VICTIM = JobId("victim-12345678")
SECRETS = ("research", "bobs-secret-run", "holds 24", "may hold 32", "nlp")


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code = code


@dataclass
class Context:
    token: str

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


def context(token: str) -> Ctx:
    """A call context for `token`'s calls.

    `Context` has what the servicers use (metadata, abort), not the rest of grpc's abstract
    ServicerContext, so mypy cannot take it for one: this is the one place that says so.
    """
    return cast(Ctx, Context(token))


def _job(
    job_id: JobId, tenant: str, user: str, *, message: str = "", events: tuple[PhaseEvent, ...] = ()
) -> JobRecord:
    spec = parse_manifest(manifest(job_id.rsplit("-", 1)[0], gpu="A100"), priority_classes=("normal",))
    return JobRecord(
        job_id=job_id,
        tenant=TenantId(tenant),
        user=user,
        spec=spec,
        phase=JobPhase.QUEUED,
        submitted_at_s=1.0,
        queued_at_s=1.0,
        priority=1000,
        attempt=2,
        message=message,
        events=events,
    )


T = TypeVar("T")


@dataclass
class World:
    loop: asyncio.AbstractEventLoop
    jobs: JobService
    cache: JobCache

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    loop = asyncio.new_event_loop()
    store = InMemoryJobStore()

    async def build() -> World:
        await store.put_tenant(TenantRecord(TenantId("research")))
        for name in ("vision", "nlp"):
            await store.put_tenant(TenantRecord(TenantId(name), parent=TenantId("research")))
        for user, tenant, role in (("admin", "vision", Role.ADMIN), ("alice", "vision", Role.MEMBER),
                                   ("bob", "nlp", Role.MEMBER), ("ops", "vision", Role.INFRA)):  # fmt: skip
            await store.put_user(UserRecord(user, TenantId(tenant), role))
            await store.put_token(f"{user}-token", user)
        requeued = "attempt 1 preempted for {} (priority); requeued at its original position"
        victim = _job(
            VICTIM,
            "vision",
            "alice",
            message=requeued.format(SIBLING) + "; " + requeued.format(PREEMPTOR),
            events=(
                PhaseEvent(JobPhase.RUNNING, 2.0, 1),
                PhaseEvent(JobPhase.QUEUED, 3.0, 2, requeued.format(PREEMPTOR)),
                PhaseEvent(JobPhase.QUEUED, 4.0, 2, requeued.format(SIBLING)),
            ),
        )
        for job in (victim, _job(PREEMPTOR, "nlp", "bob"), _job(SIBLING, "vision", "alice")):
            await store.create_job(job, idempotency_key=f"k-{job.job_id}", manifest_digest="d")
        await store.put_wait_reasons(
            VICTIM, [explain.cap_reached(TenantId("research"), GpuType("A100"), 32, 24, 16)]
        )
        cache = JobCache(store)
        await cache.start()
        jobs = job_service(store, cache)
        return World(loop, jobs, cache)

    w = loop.run_until_complete(build())
    yield w
    loop.run_until_complete(w.cache.stop())
    loop.close()


def _texts(job: pb.Job) -> str:
    return "\n".join([job.message, *(e.reason for e in job.events)])


async def _watched(jobs: JobService, token: str) -> list[pb.JobEvent]:
    stream = jobs.WatchJobs(pb.WatchJobsRequest(job_id=VICTIM, include_initial=True), context(token))
    assert isinstance(stream, AsyncGenerator)  # the servicer is an async generator: it can be closed
    first = await anext(stream)
    await stream.aclose()
    return [first]


def test_a_members_views_of_its_preempted_job_do_not_name_another_tenants_job(world: World) -> None:
    ctx = context("alice-token")
    got = world.run(world.jobs.GetJob(pb.GetJobRequest(job_id=VICTIM), ctx))
    listed = world.run(world.jobs.ListJobs(pb.ListJobsRequest(), ctx))
    watched = world.run(_watched(world.jobs, "alice-token"))
    for job in (got, next(j for j in listed.jobs if j.job_id == VICTIM), watched[0].job):
        text = _texts(job)
        assert PREEMPTOR not in text
        assert f"preempted for {OTHER_JOB} (priority)" in text  # still says why
        assert f"preempted for {SIBLING} (priority)" in text  # alice's own job is hers to read


def test_a_members_explain_does_not_name_a_parent_tenant_nor_its_usage(world: World) -> None:
    reply = world.run(world.jobs.ExplainJob(pb.ExplainJobRequest(job_id=VICTIM), context("alice-token")))
    (reason,) = reply.reasons
    assert reason.code == "tenant_cap_reached"
    assert reason.gpu_type == "A100"
    assert reason.message == f"{OTHER_TENANT} holds as many GPUs of A100 as it may; job needs 16"
    whole = reply.summary + "\n" + "\n".join(r.message for r in reply.reasons)
    for secret in SECRETS:
        assert secret not in whole


@pytest.mark.parametrize("token", ["admin-token", "ops-token"])
def test_admins_and_infra_read_every_reason_as_written(world: World, token: str) -> None:
    ctx = context(token)
    reply = world.run(world.jobs.ExplainJob(pb.ExplainJobRequest(job_id=VICTIM), ctx))
    assert reply.reasons[0].message == "tenant research may hold 32 GPUs of A100, holds 24, job needs 16"
    got = world.run(world.jobs.GetJob(pb.GetJobRequest(job_id=VICTIM), ctx))
    assert f"preempted for {PREEMPTOR} (priority)" in _texts(got)


def test_a_preemptor_the_server_no_longer_knows_is_not_named_either() -> None:
    alice = Principal("alice", TenantId("vision"), Role.MEMBER)
    redactor = Redactor(alice, lambda _job_id: None)
    assert (
        redactor.text("preempted for gone-job-01234567: priority") == f"preempted for {OTHER_JOB}: priority"
    )
    assert redactor.text("no preemption here") == "no preemption here"


def test_a_cancel_reason_with_terminal_escapes_is_refused_and_changes_nothing(world: World) -> None:
    """The reason becomes the job's message, which every reader's terminal prints."""
    with pytest.raises(Aborted) as refused:
        world.run(
            world.jobs.CancelJob(
                pb.CancelJobRequest(job_id=SIBLING, reason="done\x1b[2J\u202e"), context("alice-token")
            )
        )
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "U+001B at character 4" in str(refused.value)
    got = world.run(world.jobs.GetJob(pb.GetJobRequest(job_id=SIBLING), context("alice-token")))
    assert not got.cancel_requested
