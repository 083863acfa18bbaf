"""The jobs table and the page frame: every value from the store is escaped; filters are bounded."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CALLS_KEY, CallRefused, ConsoleCalls
from federation.console.jobs import JobFilters, JobsPage, _body, _row, read_page
from federation.console.layout import e, render_page
from federation.console.view import View

SCRIPT = "<script>alert(1)</script>"
VIEW = View(user="alice", tenant="vision", role="member", is_admin=False, csrf="tok", now_s=0.0)


def test_a_job_name_holding_a_script_is_shown_as_text() -> None:
    job = pb.Job(job_id=f'x"><{SCRIPT}', name=SCRIPT, tenant="vision", user=SCRIPT, cluster=SCRIPT)
    row = _row(job)
    assert "<script>" not in row
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in row
    assert 'data-job-id="x&quot;&gt;&lt;' in row


def test_the_page_frame_escapes_who_is_signed_in() -> None:
    view = View(user=SCRIPT, tenant='"t', role="member", is_admin=False, csrf='"><x', now_s=0.0)
    page = render_page(view, page="jobs", title=SCRIPT, body="")
    assert "<script>alert" not in page
    assert 'value="&quot;&gt;&lt;x"' in page
    assert '<a class="skip-link" href="#page-jobs">' in page
    assert 'nav id="nav"' in page


def test_the_table_links_each_job_and_offers_the_next_page() -> None:
    job = pb.Job(
        job_id="train-1a2b3c4d", name="train", tenant="vision", user="alice", phase=pb.JOB_PHASE_RUNNING
    )
    filters = JobFilters(phase="RUNNING")
    html = _body(filters, JobsPage([job] * 100, "tok"), [("", "All")], "", "")
    assert '<td class="name"><a href="/jobs/train-1a2b3c4d">train</a>' in html
    assert '<td class="phase">RUNNING</td>' in html
    assert 'id="next-page" href="/jobs?phase=RUNNING&amp;page_token=tok"' in html
    assert 'data-events="/jobs/events?phase=RUNNING"' in html


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", JobFilters()),
        ("phase=running", JobFilters(phase="RUNNING")),
        ("phase=bogus", JobFilters()),
        ("phase=live", JobFilters(phase="LIVE")),
        ("tenant=nlp&user=bob&cluster=onprem", JobFilters(tenant="nlp", user="bob", cluster="onprem")),
        ("user=" + "x" * 1000, JobFilters(user="x" * 128)),
        ("order=oldest", JobFilters(order="oldest")),
        ("order=sideways", JobFilters(order="newest")),
    ],
    ids=[
        "none",
        "phase-any-case",
        "unknown-phase-ignored",
        "not-finished",
        "all-fields",
        "long-value-cut",
        "oldest-first",
        "unknown-order-is-newest-first",
    ],
)
def test_filters_from_the_query(query: str, expected: JobFilters) -> None:
    assert JobFilters.of(make_mocked_request("GET", "/jobs?" + query)) == expected


def test_e_escapes_quotes_too() -> None:
    assert e("a\"b'c<d>&") == "a&quot;b&#x27;c&lt;d&gt;&amp;"


class _OneList(ConsoleCalls):
    """ListJobs answering one page, recording what the page asked for."""

    def __init__(self) -> None:
        super().__init__([])
        self.asked: list[pb.ListJobsRequest] = []

    async def call(self, request: web.Request, method_name: str, message: Any) -> Any:
        assert method_name == "ListJobs"
        self.asked.append(message)
        if message.user == "bad\x01":
            raise CallRefused(grpc.StatusCode.INVALID_ARGUMENT, "user: a name without control characters")
        return pb.ListJobsResponse(jobs=[pb.Job(job_id="a-1", user=message.user)], next_page_token="next")


def _request(calls: ConsoleCalls, query: str) -> web.Request:
    app = web.Application()
    app[CALLS_KEY] = calls
    return make_mocked_request("GET", "/jobs?" + query, app=app)


@pytest.mark.parametrize(
    ("query", "newest_first"),
    [
        ("user=alice&cluster=onprem&page_token=t", True),
        ("user=alice&cluster=onprem&page_token=t&order=oldest", False),
    ],
    ids=["newest-first-by-default", "oldest-first-asked"],
)
async def test_a_page_is_one_list_call_filtered_and_ordered_by_the_server(
    query: str, newest_first: bool
) -> None:
    calls = _OneList()
    request = _request(calls, query)
    page = await read_page(request, JobFilters.of(request))
    assert [(j.job_id, j.user) for j in page.jobs] == [("a-1", "alice")]
    assert page.next_token == "next"
    assert [(m.user, m.cluster, m.newest_first, m.page_size, m.page_token) for m in calls.asked] == [
        ("alice", "onprem", newest_first, 100, "t")
    ]


def test_the_next_page_keeps_the_order_asked_for() -> None:
    html = _body(JobFilters(order="oldest"), JobsPage([pb.Job(job_id="a-1")], "tok"), [("", "All")], "", "")
    assert 'id="next-page" href="/jobs?order=oldest&amp;page_token=tok"' in html
    assert "oldest first" in html
    assert '<option value="oldest" selected>' in html
