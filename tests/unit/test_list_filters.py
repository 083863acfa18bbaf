"""ListJobs' user and cluster filters and newest-first order, and SummarizeJobs: exact answers from
the real servicer over the in-memory store and the job cache, with the API's access rules.

The jobs: six of vision and three of nlp, submitted one a second (j0 first), by two users each,
some placed on a cluster, in every phase group.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import grpc
import pytest

from federation.api.job_queries import decode_page_token, encode_page_token
from federation.api.service import JobService
from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CallRefused as Refused
from federation.errors import InvalidArgument
from federation.store.job_cache import JobCache
from federation.store.job_store import InMemoryJobStore
from federation.store.jobs import JobPlacement
from federation.store.records import Role, TenantRecord, UserRecord
from placement.model import ClusterName, GpuType, JobPhase, TenantId
from placement.model_ids import CapacityKind
from tests.conftest import build_job
from tests.unit.job_service import as_user, job_service

Q, A, S, R, OK_, C = (
    JobPhase.QUEUED,
    JobPhase.ADMITTED,
    JobPhase.STAGING,
    JobPhase.RUNNING,
    JobPhase.SUCCEEDED,
    JobPhase.CANCELLED,
)
# job id, tenant, user, phase, cluster (placed) or "", GPUs, GPU types accepted
JOBS = [
    ("j0", "vision", "alice", R, "onprem", 8, ("H100",)),
    ("j1", "vision", "carol", Q, "", 4, ("H100", "A100")),
    ("j2", "nlp", "bob", R, "onprem", 16, ("A100",)),
    ("j3", "vision", "alice", A, "gcp", 8, ("H100",)),
    ("j4", "vision", "alice", OK_, "onprem", 2, ("H100",)),
    ("j5", "nlp", "bob", Q, "", 8, ("H100",)),
    ("j6", "vision", "carol", S, "onprem", 4, ("A100",)),
    ("j7", "nlp", "dave", C, "", 1, ("H100",)),
    ("j8", "vision", "alice", Q, "", 2, ()),
]


@dataclass
class World:
    service: JobService
    cache: JobCache

    async def list_jobs(self, who: str, **fields: Any) -> pb.ListJobsResponse:
        return await self.service.ListJobs(pb.ListJobsRequest(**fields), as_user(who))

    async def ids(self, who: str, **fields: Any) -> list[str]:
        return [j.job_id for j in (await self.list_jobs(who, **fields)).jobs]

    async def every_page(self, who: str, **fields: Any) -> list[list[str]]:
        pages, token = [], ""
        while True:
            reply = await self.list_jobs(who, page_token=token, **fields)
            pages.append([j.job_id for j in reply.jobs])
            token = reply.next_page_token
            if not token:
                return pages

    async def summary(self, who: str, tenant: str = "") -> pb.JobSummary:
        request = pb.SummarizeJobsRequest(tenant=tenant)
        return await self.service.SummarizeJobs(request, as_user(who))


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
    last = 0
    for i, (job_id, tenant, user, phase, cluster, gpus, types) in enumerate(JOBS):
        job = build_job(job_id, tenant=tenant, gpus=gpus)
        placed = (
            JobPlacement(ClusterName(cluster), GpuType(types[0]), CapacityKind.PRIVATE, 2.0)
            if cluster
            else None
        )
        job = replace(
            job,
            user=user,
            phase=phase,
            placement=placed,
            submitted_at_s=1000.0 + i,
            spec=replace(job.spec, gpu_types=tuple(GpuType(t) for t in types)),
        )
        stored, _ = await store.create_job(job, idempotency_key=job_id, manifest_digest="d")
        last = stored.mod_revision
    assert await cache.wait_for_revision(last)
    service = job_service(store, cache)
    yield World(service, cache)
    await cache.stop()


@pytest.mark.parametrize(
    ("who", "fields", "expected"),
    [
        ("admin", {}, ["j0", "j1", "j2", "j3", "j4", "j5", "j6", "j7", "j8"]),
        ("admin", {"newest_first": True}, ["j8", "j7", "j6", "j5", "j4", "j3", "j2", "j1", "j0"]),
        ("admin", {"user": "alice"}, ["j0", "j3", "j4", "j8"]),
        ("admin", {"user": "alice", "newest_first": True}, ["j8", "j4", "j3", "j0"]),
        ("admin", {"cluster": "onprem"}, ["j0", "j2", "j4", "j6"]),
        ("admin", {"cluster": "onprem", "tenant": "nlp"}, ["j2"]),
        ("admin", {"cluster": "onprem", "user": "alice", "phases": [pb.JOB_PHASE_RUNNING]}, ["j0"]),
        (
            "admin",
            {"phases": [pb.JOB_PHASE_QUEUED, pb.JOB_PHASE_RUNNING], "newest_first": True},
            ["j8", "j5", "j2", "j1", "j0"],
        ),
        ("admin", {"user": "nobody"}, []),
        ("admin", {"cluster": "nowhere"}, []),
        ("ops", {"user": "bob"}, ["j2", "j5"]),
        # A member's list is its tenant's, whatever user it names: bob's jobs are not alice's to see.
        ("alice", {"user": "bob"}, []),
        ("alice", {"cluster": "onprem", "newest_first": True}, ["j6", "j4", "j0"]),
        ("bob", {"newest_first": True}, ["j7", "j5", "j2"]),
    ],
    ids=[
        "all-oldest-first",
        "all-newest-first",
        "user",
        "user-newest-first",
        "cluster",
        "cluster-and-tenant",
        "cluster-user-phase",
        "phases-merged-newest-first",
        "unknown-user",
        "unknown-cluster",
        "infra-by-user",
        "member-asks-for-another-tenants-user",
        "member-cluster-newest-first",
        "member-newest-first",
    ],
)
async def test_a_list_filters_and_orders_on_the_server(
    world: World, who: str, fields: dict[str, Any], expected: list[str]
) -> None:
    assert await world.ids(who, **fields) == expected


@pytest.mark.parametrize(
    ("fields", "pages"),
    [
        ({"page_size": 2}, [["j0", "j1"], ["j2", "j3"], ["j4", "j5"], ["j6", "j7"], ["j8"]]),
        (
            {"page_size": 2, "newest_first": True},
            [["j8", "j7"], ["j6", "j5"], ["j4", "j3"], ["j2", "j1"], ["j0"]],
        ),
        ({"page_size": 3, "user": "alice", "newest_first": True}, [["j8", "j4", "j3"], ["j0"]]),
        ({"page_size": 2, "cluster": "onprem", "newest_first": True}, [["j6", "j4"], ["j2", "j0"]]),
        ({"page_size": 4, "cluster": "onprem"}, [["j0", "j2", "j4", "j6"]]),
    ],
    ids=["oldest-first", "newest-first", "user-newest-first", "cluster-newest-first", "exact-fit-no-token"],
)
async def test_pages_follow_each_order_without_repeating_or_skipping(
    world: World, fields: dict[str, Any], pages: list[list[str]]
) -> None:
    assert await world.every_page("admin", **fields) == pages


async def test_a_page_token_is_the_last_jobs_place_marked_with_its_order(world: World) -> None:
    first = await world.list_jobs("admin", page_size=2, newest_first=True)
    assert decode_page_token(first.next_page_token, newest_first=True) == (1007.0, "j7")
    assert first.next_page_token == encode_page_token((1007.0, "j7"), newest_first=True)
    oldest = await world.list_jobs("admin", page_size=2)
    assert decode_page_token(oldest.next_page_token, newest_first=False) == (1001.0, "j1")


async def test_a_page_token_of_one_order_is_refused_by_the_other(world: World) -> None:
    newest = await world.list_jobs("admin", page_size=2, newest_first=True)
    oldest = await world.list_jobs("admin", page_size=2)
    for token, asked in [(newest.next_page_token, False), (oldest.next_page_token, True)]:
        with pytest.raises(Refused) as refused:
            await world.list_jobs("admin", page_token=token, newest_first=asked)
        assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details.startswith("page_token: issued for a listing")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"user": "x" * 129}, "user: at most 128 characters"),
        ({"cluster": "c" * 500}, "cluster: at most 128 characters"),
        ({"user": "ali\x00ce"}, "user: a name without"),
        ({"cluster": " onprem"}, "cluster: a name without"),
        ({"page_token": "bm90IGEgdG9rZW4="}, "page_token: not a token this server issued"),
    ],
    ids=["long-user", "long-cluster", "control-character", "padded-cluster", "bad-token"],
)
async def test_bad_filters_are_refused_naming_the_field(
    world: World, fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(Refused) as refused:
        await world.list_jobs("admin", **fields)
    assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details.startswith(field)


@pytest.mark.parametrize(
    ("who", "fields"),
    [("alice", {"tenant": "nlp", "user": "bob"}), ("fin", {"user": "alice"})],
    ids=["member-names-another-tenant", "finance-may-not-list-jobs"],
)
async def test_filters_do_not_widen_who_may_list(world: World, who: str, fields: dict[str, Any]) -> None:
    with pytest.raises(Refused) as refused:
        await world.list_jobs(who, **fields)
    assert refused.value.code is grpc.StatusCode.PERMISSION_DENIED


def _rows(summary: pb.JobSummary) -> list[tuple[str, str, str, int, int]]:
    return [(r.tenant, r.gpu_type, pb.JobGroup.Name(r.group)[10:], r.gpus, r.jobs) for r in summary.rows]


def _counts(summary: pb.JobSummary) -> list[tuple[str, str, int]]:
    return [(t.tenant, pb.JobGroup.Name(t.group)[10:], t.jobs) for t in summary.tenants]


VISION_ROWS = [
    # j1 accepts H100 and A100: its 4 GPUs of demand count under each; j8 names no type.
    ("vision", "A100", "QUEUED", 4, 1),
    ("vision", "A100", "ADMITTED", 4, 1),
    ("vision", "H100", "QUEUED", 4, 1),
    ("vision", "H100", "ADMITTED", 8, 1),
    ("vision", "H100", "RUNNING", 8, 1),
    ("vision", "any", "QUEUED", 2, 1),
]
VISION_COUNTS = [("vision", "QUEUED", 2), ("vision", "ADMITTED", 2), ("vision", "RUNNING", 1)]
NLP_ROWS = [("nlp", "A100", "RUNNING", 16, 1), ("nlp", "H100", "QUEUED", 8, 1)]
NLP_COUNTS = [("nlp", "QUEUED", 1), ("nlp", "RUNNING", 1)]


@pytest.mark.parametrize(
    ("who", "tenant", "rows", "counts"),
    [
        ("admin", "", NLP_ROWS + VISION_ROWS, NLP_COUNTS + VISION_COUNTS),
        ("ops", "nlp", NLP_ROWS, NLP_COUNTS),
        ("alice", "", VISION_ROWS, VISION_COUNTS),
        ("alice", "vision", VISION_ROWS, VISION_COUNTS),
        ("bob", "", NLP_ROWS, NLP_COUNTS),
    ],
    ids=["admin-every-tenant", "infra-one-tenant", "member-own", "member-names-own", "other-member-own"],
)
async def test_the_summary_sums_gpus_and_jobs_by_tenant_type_and_group(
    world: World,
    who: str,
    tenant: str,
    rows: list[tuple[str, str, str, int, int]],
    counts: list[tuple[str, str, int]],
) -> None:
    summary = await world.summary(who, tenant)
    assert _rows(summary) == rows
    assert _counts(summary) == counts


@pytest.mark.parametrize(
    ("who", "tenant"),
    [("alice", "nlp"), ("fin", ""), ("fin", "vision")],
    ids=["member-other", "finance", "finance-t"],
)
async def test_the_summary_is_refused_as_the_list_is(world: World, who: str, tenant: str) -> None:
    with pytest.raises(Refused) as refused:
        await world.summary(who, tenant)
    assert refused.value.code is grpc.StatusCode.PERMISSION_DENIED


def test_an_old_style_token_still_reads_as_oldest_first() -> None:
    import base64

    old = base64.urlsafe_b64encode(b"1003.0|j3").decode()
    assert decode_page_token(old, newest_first=False) == (1003.0, "j3")
    with pytest.raises(InvalidArgument):
        decode_page_token(old, newest_first=True)
