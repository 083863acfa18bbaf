"""The queues page's arithmetic and HTML, from API replies built by hand (no server)."""

from __future__ import annotations

import json
import re
from typing import Any

import grpc
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CALLS_KEY, CallRefused, ConsoleCalls
from federation.console.queues import Tally, build_queues, list_jobs, render_queues

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


def job(tenant: str, phase: int, gpus: int, gpu_type: str = "", types: tuple[str, ...] = ("A100",)) -> pb.Job:
    return pb.Job(
        job_id=f"{tenant}-{phase}-{gpus}",
        tenant=tenant,
        phase=phase,  # type: ignore[arg-type]
        gpu_count=gpus,
        gpu_type=gpu_type,
        gpu_types=list(types),
        cluster="onprem" if gpu_type else "",
    )


def tally_of(*jobs: pb.Job) -> Tally:
    t = Tally()
    t.add(jobs)
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


class _Pages(ConsoleCalls):
    """ListJobs in pages of queued jobs (10 pages of 500), or refused as for the finance role."""

    def __init__(self, *, refuse: bool = False) -> None:
        super().__init__([])
        self.refuse = refuse
        self.calls = 0

    async def call(self, request: web.Request, method_name: str, message: Any) -> Any:
        assert method_name == "ListJobs"
        self.calls += 1
        if self.refuse:
            raise CallRefused(grpc.StatusCode.PERMISSION_DENIED, "role finance may not list jobs")
        page = int(message.page_token or 0)
        jobs = [job("vision", pb.JOB_PHASE_QUEUED, 8) for _ in range(500)]
        return pb.ListJobsResponse(jobs=jobs, next_page_token=str(page + 1) if page < 9 else "")


def _request(calls: ConsoleCalls) -> web.Request:
    app = web.Application()
    app[CALLS_KEY] = calls
    return make_mocked_request("GET", "/queues", app=app)


async def test_the_queue_is_read_whole_within_the_budget_and_cut_short_past_it() -> None:
    calls = _Pages()
    tally = Tally()
    assert await list_jobs(_request(calls), [pb.JOB_PHASE_QUEUED], tally.add) == (True, False)
    assert (calls.calls, tally.queued_jobs["vision"]) == (10, 5000)
    # A deadline already passed: one page, and the page says how much it counted.
    calls, tally = _Pages(), Tally()
    known, tally.truncated = await list_jobs(_request(calls), [pb.JOB_PHASE_QUEUED], tally.add, deadline=0.0)
    assert (known, tally.truncated, calls.calls) == (True, True, 1)
    html = render_queues(build_queues(TENANTS, CLUSTERS, tally))
    assert re.search(r'<p class="note" id="queued-truncated">.*count the first 500 queued jobs', html)
    # A role that may not list jobs: usage unknown, nothing cut.
    assert await list_jobs(_request(_Pages(refuse=True)), [pb.JOB_PHASE_QUEUED], Tally().add) == (
        False,
        False,
    )
