"""The queues page's arithmetic and HTML, from API replies built by hand (no server); the usage from
the servicer's own summing (`federation.api.job_queries.summarize`) over job records built here."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import grpc
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from federation.api import convert
from federation.api.job_queries import summarize
from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CALLS_KEY, CallRefused, ConsoleCalls
from federation.console.queues import Tally, build_queues, gather, list_jobs, render_queues
from federation.store.jobs import JobPlacement, JobRecord
from placement.model import ClusterName, GpuType
from placement.model_ids import CapacityKind
from tests.conftest import build_job

EVIL = '<script>alert("x")</script>'


def tenant(name: str, **doc: object) -> pb.Tenant:
    return pb.Tenant(name=name, document=json.dumps({"name": name, **doc}))


TENANTS = [
    tenant("research", quotas={"A100": {"guaranteed": 0, "cap": 64}}),
    tenant(
        "vision",
        parent="research",
        weight=1,
        quotas={"A100": {"guaranteed": 16, "borrowingLimit": 16, "lendingLimit": 16, "cap": 24}},
    ),
    tenant("nlp", parent="research", weight=2, quotas={"A100": {"guaranteed": 16, "borrowingLimit": 4}}),
    tenant("platform", gpuCaps={"H100": 8}),
]

CLUSTERS = [
    pb.Cluster(
        name="onprem",
        reachable=True,
        pools=[pb.Pool(name="a", gpu_type="A100", gpus_per_node=8, node_count=8, free_gpus=10)],
    ),
    pb.Cluster(
        name="cloud",
        reachable=True,
        pools=[pb.Pool(name="h", gpu_type="H100", gpus_per_node=8, node_count=2, free_gpus=16)],
    ),
    # Unreachable: not in what fair share divides by.
    pb.Cluster(
        name="gone",
        reachable=False,
        pools=[pb.Pool(name="a", gpu_type="A100", gpus_per_node=8, node_count=100, free_gpus=800)],
    ),
]


def job(
    tenant: str, phase: int, gpus: int, gpu_type: str = "", types: tuple[str, ...] = ("A100",)
) -> JobRecord:
    found = convert.phase_from_pb(phase)  # type: ignore[arg-type]
    assert found is not None
    record = build_job(f"{tenant}-{phase}-{gpus}", tenant=tenant, gpus=gpus, phase=found)
    placed = (
        JobPlacement(ClusterName("onprem"), GpuType(gpu_type), CapacityKind.PRIVATE, 1.0)
        if gpu_type
        else None
    )
    spec = replace(record.spec, gpu_types=tuple(GpuType(t) for t in types))
    return replace(record, placement=placed, spec=spec)


def tally_of(*jobs: JobRecord) -> Tally:
    t = Tally()
    t.add(summarize(iter(jobs), None))
    return t


def test_running_queued_borrowed_and_cap_per_tenant_and_type() -> None:
    tally = tally_of(
        job("vision", pb.JOB_PHASE_RUNNING, 16, "A100"),
        job("vision", pb.JOB_PHASE_DISPATCHED, 4, "A100"),
        job("vision", pb.JOB_PHASE_QUEUED, 8, types=("A100", "H100")),
        job("nlp", pb.JOB_PHASE_ADMITTED, 8, "A100"),
        # Finished jobs hold nothing.
        job("nlp", pb.JOB_PHASE_SUCCEEDED, 64, "A100"),
    )
    view = build_queues(TENANTS, CLUSTERS, tally)
    by = {(t.name, r.gpu_type): r for t in view.tenants for r in t.rows}
    vision = by[("vision", "A100")]
    assert (vision.running, vision.queued, vision.guaranteed, vision.borrowed) == (20, 8, 16, 4)
    # The tighter of cap 24 and guarantee 16 + borrowing 16.
    assert vision.limit == 24
    # A job that accepts H100 too is demand for H100.
    assert by[("vision", "H100")].queued == 8
    nlp = by[("nlp", "A100")]
    assert (nlp.running, nlp.borrowed, nlp.limit) == (8, 0, 20)
    # The organisation counts its teams' usage against its own cap.
    research = by[("research", "A100")]
    assert (research.running, research.queued, research.limit) == (28, 8, 64)
    assert by[("platform", "H100")].limit == 8
    # The tree's order: research, then its teams by name, then platform.
    assert [(t.name, t.depth) for t in view.tenants] == [
        ("platform", 0),
        ("research", 0),
        ("nlp", 1),
        ("vision", 1),
    ]


def test_fair_share_is_the_placers_weighted_dominant_share_of_reachable_capacity() -> None:
    tally = tally_of(
        job("vision", pb.JOB_PHASE_RUNNING, 16, "A100"), job("nlp", pb.JOB_PHASE_RUNNING, 16, "A100")
    )
    view = build_queues(TENANTS, CLUSTERS, tally)
    assert view.capacity == {"A100": 64, "H100": 16}
    share = {t.name: t.share for t in view.tenants}
    assert share["vision"] == 16 / 64
    # Twice the weight: half the share for the same GPUs.
    assert share["nlp"] == 16 / 64 / 2
    # The organisation's own jobs count, not its teams' (placement.fairshare).
    assert share["research"] == 0.0


def test_a_role_that_may_not_list_jobs_sees_quotas_not_zeros() -> None:
    tally = Tally()
    tally.known = False
    html = render_queues(build_queues(TENANTS, CLUSTERS, tally))
    assert 'id="usage-hidden"' in html
    row = re.search(r'<tr data-tenant="vision" data-gpu-type="A100">.*?</tr>', html)
    assert row is not None
    assert '<td class="num running">-</td>' in row.group(0)
    assert '<td class="num guaranteed">16</td>' in row.group(0)


def test_every_value_is_escaped() -> None:
    # Tenant names are validated by the API; GPU types and the tally's keys are shown as given.
    tally = tally_of(job("vision", pb.JOB_PHASE_QUEUED, 8, types=(EVIL,)))
    html = render_queues(build_queues(TENANTS, CLUSTERS, tally))
    assert "<script>" not in html
    assert "&lt;script&gt;" in html
    # No inline style or script: the CSP forbids them.
    assert "style=" not in html
    assert "<script" not in html


def test_bars_are_svg_with_widths_as_attributes() -> None:
    tally = tally_of(job("vision", pb.JOB_PHASE_RUNNING, 24, "A100"))
    html = render_queues(build_queues(TENANTS, CLUSTERS, tally))
    row = re.search(r'<tr data-tenant="vision" data-gpu-type="A100">.*?</tr>', html)
    assert row is not None
    # 16 within the guarantee, 8 borrowed, on a bar 24 (the cap) wide: 160 and 80 of 240 pixels.
    assert re.search(r'class="seg-guaranteed" x="0.0" y="1" width="160.0"', row.group(0))
    assert re.search(r'class="seg-borrowed" x="160.0" y="1" width="80.0"', row.group(0))
    assert 'role="img"' in row.group(0)


class _Calls(ConsoleCalls):
    """The three calls the page makes; SummarizeJobs over 5,000 queued jobs, or refused as for the
    finance role."""

    def __init__(self, *, refuse: bool = False) -> None:
        super().__init__([])
        self.refuse = refuse
        self.called: list[str] = []

    async def call(self, request: web.Request, method_name: str, message: Any) -> Any:
        self.called.append(method_name)
        if method_name == "ListTenants":
            return pb.ListTenantsResponse(tenants=TENANTS)
        if method_name == "ListClusters":
            return pb.ListClustersResponse(clusters=CLUSTERS)
        if method_name == "ListJobs":
            # The clusters page's read of the placed jobs, two pages of one.
            page = int(message.page_token or 0)
            jobs = [pb.Job(job_id=f"j{page}", phase=pb.JOB_PHASE_ADMITTED)]
            return pb.ListJobsResponse(jobs=jobs, next_page_token="" if page else "1")
        assert method_name == "SummarizeJobs"
        if self.refuse:
            raise CallRefused(grpc.StatusCode.PERMISSION_DENIED, "role finance may not list jobs")
        queue = [replace(job("vision", pb.JOB_PHASE_QUEUED, 8), job_id=f"q{i}") for i in range(5000)]  # type: ignore[arg-type]
        return summarize(iter(queue), None)


def _request(calls: ConsoleCalls) -> web.Request:
    app = web.Application()
    app[CALLS_KEY] = calls
    return make_mocked_request("GET", "/queues", app=app)


async def test_the_whole_queue_is_counted_by_one_summary_call() -> None:
    calls = _Calls()
    view = await gather(_request(calls))
    assert calls.called == ["ListTenants", "ListClusters", "SummarizeJobs"]
    by = {(t.name, r.gpu_type): r for t in view.tenants for r in t.rows}
    assert by[("vision", "A100")].queued == 40_000
    assert {t.name: t.queued_jobs for t in view.tenants}["vision"] == 5000
    html = render_queues(view)
    assert '<td class="num queued-jobs">5000</td>' in html
    assert "truncated" not in html


async def test_a_role_that_may_not_read_jobs_gets_the_quotas_alone() -> None:
    view = await gather(_request(_Calls(refuse=True)))
    assert not view.usage_known
    assert 'id="usage-hidden"' in render_queues(view)


async def test_the_clusters_page_still_reads_placed_jobs_by_pages() -> None:
    calls = _Calls()
    seen: list[pb.Job] = []
    assert await list_jobs(_request(calls), [pb.JOB_PHASE_ADMITTED], seen.extend) == (True, False)
    assert [j.job_id for j in seen] == ["j0", "j1"]
