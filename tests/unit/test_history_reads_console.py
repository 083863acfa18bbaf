"""The console's jobs page with archived jobs (issue 19): the "include archived" option reaches
ListJobs, survives paging and the live updates, and is shown as chosen; the CLI's `list --all
--since` asks the same of ListJobs."""

from __future__ import annotations

import time
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from click.testing import CliRunner

from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.main import cli
from federation.console.calls import CALLS_KEY, ConsoleCalls
from federation.console.jobs import JobFilters, JobsPage, _body, read_page


class _OneList(ConsoleCalls):
    def __init__(self) -> None:
        super().__init__([])
        self.asked: list[pb.ListJobsRequest] = []

    async def call(self, request: web.Request, method_name: str, message: Any) -> Any:
        assert method_name == "ListJobs"
        self.asked.append(message)
        return pb.ListJobsResponse(jobs=[pb.Job(job_id="a-1")], next_page_token="next")


@pytest.mark.parametrize(
    ("query", "archived"),
    [("", False), ("archived=1", True), ("archived=yes", False)],
    ids=["live-only-by-default", "archived-asked", "other-value-ignored"],
)
async def test_the_option_reaches_list_jobs(query: str, archived: bool) -> None:
    calls = _OneList()
    app = web.Application()
    app[CALLS_KEY] = calls
    request = make_mocked_request("GET", "/jobs?" + query, app=app)
    filters = JobFilters.of(request)
    assert filters.archived is archived
    await read_page(request, filters)
    assert [m.include_archived for m in calls.asked] == [archived]


def test_the_next_page_and_the_live_updates_keep_the_option() -> None:
    html = _body(JobFilters(archived=True), JobsPage([pb.Job(job_id="a-1")], "tok"), [("", "All")], "", "")
    assert 'id="next-page" href="/jobs?archived=1&amp;page_token=tok"' in html
    assert 'data-events="/jobs/events?archived=1"' in html
    assert '<input type="checkbox" name="archived" value="1" checked> Include archived' in html
    plain = _body(JobFilters(), JobsPage([], ""), [("", "All")], "", "")
    assert '<input type="checkbox" name="archived" value="1"> Include archived' in plain


class _Client:
    asked: list[dict[str, Any]] = []

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *args: object) -> None:
        return None

    def list_all(self, **fields: Any) -> list[pb.Job]:
        self.asked.append(fields)
        return []


def test_list_all_since_asks_for_archived_jobs_of_the_last_30_days(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("federation.cli.main._Opts.client", lambda self: _Client())
    before = time.time()
    result = CliRunner().invoke(cli, ["--token", "t", "list", "--all", "--since", "30d"])
    assert result.exit_code == 0, result.output
    [asked] = _Client.asked
    assert asked["include_archived"] is True
    assert before - 30 * 86400 - 1 <= asked["since_s"] <= time.time() - 30 * 86400
