"""The jobs page: the jobs a user may see, filtered by tenant, phase, user and cluster, live.

One ListJobs call per console page: the servicer filters by tenant, phase, user and cluster and
orders (newest first unless asked otherwise) before it converts a job, so a sparse filter costs the
page no more than a dense one. The next-page link carries ListJobs' own token. The rows' phases then
follow the jobs by `/jobs/events`, which repeats the same read about once a second and sends what
changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import grpc
from aiohttp import web

from federation.api import convert
from federation.api.v1 import gpufed_pb2 as pb
from federation.console import sse
from federation.console.calls import CALLS_KEY, CallRefused
from federation.console.layout import e, html_response, query_string, render_page, when
from federation.console.view import VIEW_KEY, View

PAGE_ROWS = 100
MAX_FIELD_LENGTH = 128
NEWEST, OLDEST = "newest", "oldest"
PHASES = tuple(convert.phase_name(v) for v in pb.JobPhase.values() if v != pb.JOB_PHASE_UNSPECIFIED)
# Every phase but the finished ones: "where are my jobs now", without the history before them.
LIVE = "LIVE"
LIVE_PHASES = (
    pb.JOB_PHASE_QUEUED,
    pb.JOB_PHASE_ADMITTED,
    pb.JOB_PHASE_STAGING,
    pb.JOB_PHASE_DISPATCHED,
    pb.JOB_PHASE_RUNNING,
)


@dataclass(frozen=True, slots=True)
class JobFilters:
    tenant: str = ""
    phase: str = ""
    user: str = ""
    cluster: str = ""
    page_token: str = ""
    # NEWEST (the default) or OLDEST: which end of the list order the pages start from.
    order: str = NEWEST
    # Also the ended jobs archived to the history store (ListJobs' include_archived).
    archived: bool = False

    @classmethod
    def of(cls, request: web.Request) -> JobFilters:
        q = request.query

        def field(name: str) -> str:
            return q.get(name, "").strip()[:MAX_FIELD_LENGTH]

        phase = field("phase").upper()
        return cls(
            tenant=field("tenant"),
            phase=phase if phase in PHASES or phase == LIVE else "",
            user=field("user"),
            cluster=field("cluster"),
            page_token=q.get("page_token", "")[:512],
            order=OLDEST if field("order").lower() == OLDEST else NEWEST,
            archived=field("archived") == "1",
        )

    def params(self, *, page_token: str | None = None) -> dict[str, str]:
        token = self.page_token if page_token is None else page_token
        return {
            "tenant": self.tenant,
            "phase": self.phase,
            "user": self.user,
            "cluster": self.cluster,
            "order": "" if self.order == NEWEST else self.order,
            "archived": "1" if self.archived else "",
            "page_token": token,
        }


@dataclass(frozen=True, slots=True)
class JobsPage:
    jobs: list[pb.Job]
    next_token: str
    # Every live job the filters match, on all pages (ListJobs' total_count); None: not asked.
    total: int | None = None


def _phases(phase: str) -> list[pb.JobPhase.ValueType]:
    if not phase:
        return []
    if phase == LIVE:
        return list(LIVE_PHASES)
    return [pb.JobPhase.Value("JOB_PHASE_" + phase)]


async def read_page(request: web.Request, filters: JobFilters, *, with_total: bool = False) -> JobsPage:
    """One console page of jobs: one ListJobs page, filtered and ordered by the servicer. The
    next-page token is ListJobs' own, so a page never repeats or skips a job."""
    reply: pb.ListJobsResponse = await request.app[CALLS_KEY].call(
        request,
        "ListJobs",
        pb.ListJobsRequest(
            tenant=filters.tenant,
            phases=_phases(filters.phase),
            user=filters.user,
            cluster=filters.cluster,
            newest_first=filters.order == NEWEST,
            page_size=PAGE_ROWS,
            page_token=filters.page_token,
            include_archived=filters.archived,
            with_total=with_total,
        ),
    )
    return JobsPage(list(reply.jobs), reply.next_page_token, reply.total_count if with_total else None)


def job_state(job: pb.Job) -> dict[str, object]:
    """What the page's script updates in a row, or on a job's page."""
    return {
        "job_id": job.job_id,
        "phase": convert.phase_name(job.phase),
        "cluster": job.cluster,
        "cancel_requested": job.cancel_requested,
        "terminal": job.phase in TERMINAL,
    }


TERMINAL = frozenset({pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED})


def gpu_kind(job: pb.Job) -> str:
    """The placed GPU type, or the types the job accepts while it waits."""
    return job.gpu_type or " | ".join(job.gpu_types)


def _row(job: pb.Job) -> str:
    href = f"/jobs/{e(job.job_id)}"
    return (
        f'<tr data-job-id="{e(job.job_id)}">'
        f'<td class="name"><a href="{href}">{e(job.name)}</a><br>'
        f'<span class="muted">{e(job.job_id)}</span></td>'
        f'<td class="phase">{e(convert.phase_name(job.phase))}</td>'
        f'<td class="tenant">{e(job.tenant)}</td>'
        f'<td class="user">{e(job.user)}</td>'
        # Why it failed or waits (OOMKilled, Error (exit 3)), as `gpufed list` shows it.
        f'<td class="reason">{e(job.reason or job.message)}</td>'
        f'<td class="cluster">{e(job.cluster)}</td>'
        f'<td class="gpus">{job.gpu_count}</td>'
        f'<td class="gpu-type">{e(gpu_kind(job))}</td>'
        f'<td class="submitted">{e(when(job.submitted_at.seconds + job.submitted_at.nanos / 1e9))}</td>'
        "</tr>"
    )


def _options(values: Iterable[tuple[str, str]], selected: str) -> str:
    return "".join(
        f'<option value="{e(v)}"{" selected" if v == selected else ""}>{e(label)}</option>'
        for v, label in values
    )


async def _tenant_choices(request: web.Request, view: View) -> list[tuple[str, str]]:
    if view.role == "member":
        # The only tenant a member may list; "All" lists the same.
        return [("", "My tenant"), (view.tenant, view.tenant)]
    reply: pb.ListTenantsResponse = await request.app[CALLS_KEY].call(
        request, "ListTenants", pb.ListTenantsRequest()
    )
    return [("", "All tenants"), *((t.name, t.name) for t in reply.tenants)]


def filters_form(filters: JobFilters, tenants: list[tuple[str, str]], shown_tenant: str) -> str:
    phases = [("", "Any phase"), (LIVE, "Not finished"), *((p, p) for p in PHASES)]
    orders = [(NEWEST, "Newest first"), (OLDEST, "Oldest first")]
    return (
        '<form id="filters" method="get" action="/jobs" role="search" aria-label="Filter jobs">'
        f'<label>Tenant<select name="tenant">{_options(tenants, shown_tenant)}</select></label>'
        f'<label>Phase<select name="phase">{_options(phases, filters.phase)}</select></label>'
        f'<label>User<input name="user" value="{e(filters.user)}" maxlength="{MAX_FIELD_LENGTH}"></label>'
        f'<label>Cluster<input name="cluster" value="{e(filters.cluster)}" maxlength="{MAX_FIELD_LENGTH}">'
        "</label>"
        f'<label>Order<select name="order">{_options(orders, filters.order)}</select></label>'
        '<label><input type="checkbox" name="archived" value="1"'
        f"{' checked' if filters.archived else ''}> Include archived</label>"
        '<button type="submit">Filter</button> <a href="/jobs">Clear</a></form>'
    )


async def jobs_page(request: web.Request) -> web.StreamResponse:
    view = request[VIEW_KEY]
    filters = JobFilters.of(request)
    status, refused = 200, ""
    try:
        page = await read_page(request, filters, with_total=True)
    except CallRefused as refusal:
        if refusal.code is grpc.StatusCode.PERMISSION_DENIED:
            # Another tenant typed into the URL by a member, or a role that may not list jobs
            # (finance): the API's refusal, on the jobs page, with no rows.
            status = 403
        elif refusal.code is grpc.StatusCode.INVALID_ARGUMENT:
            # A filter or page token the API refuses (it names the field): said on the page.
            status = 400
        else:
            raise
        refused = refusal.details
        page = JobsPage([], "")
    tenants = await _tenant_choices(request, view)
    body = _body(filters, page, tenants, filters.tenant, refused)
    return html_response(render_page(view, page="jobs", title="Jobs", body=body), status=status)


def _body(
    filters: JobFilters, page: JobsPage, tenants: list[tuple[str, str]], shown_tenant: str, refused: str
) -> str:
    events = "/jobs/events" + query_string(filters.params())
    rows = "".join(_row(j) for j in page.jobs)
    if not page.jobs:
        rows = '<tr><td colspan="9" class="muted">No jobs match.</td></tr>'
    pager = []
    if filters.page_token:
        pager.append(
            f'<a id="first-page" href="/jobs{e(query_string(filters.params(page_token="")))}">First page</a>'
        )
    if page.next_token:
        href = "/jobs" + query_string(filters.params(page_token=page.next_token))
        pager.append(f'<a id="next-page" href="{e(href)}">Next page</a>')
    error = f'<p class="error" role="alert">{e(refused)}</p>' if refused else ""
    return (
        filters_form(filters, tenants, shown_tenant)
        + error
        + _counts(filters, page)
        + f'<table id="jobs" data-events="{e(events)}" aria-label="Jobs"><thead><tr>'
        '<th scope="col">Name</th><th scope="col">Phase</th><th scope="col">Tenant</th>'
        '<th scope="col">User</th><th scope="col">Reason</th><th scope="col">Cluster</th>'
        '<th scope="col" class="num">GPUs</th>'
        '<th scope="col">GPU type</th>'
        f'<th scope="col">Submitted</th></tr></thead><tbody>{rows}</tbody></table>'
        + f'<nav class="pager" aria-label="Pages">{"".join(pager)}</nav>'
    )


def _counts(filters: JobFilters, page: JobsPage) -> str:
    total = ""
    if page.total is not None:
        scope = " live (archived jobs not counted)" if filters.archived else ""
        total = (
            f'<span id="jobs-total" data-total="{page.total}">{page.total:,} jobs{scope} '
            "match in total</span>; "
        )
    return (
        f'<p class="live">{total}<span id="jobs-shown">{len(page.jobs)} shown</span>, {filters.order} first; '
        "phases update live.</p>"
    )


async def jobs_events(request: web.Request) -> web.StreamResponse:
    filters = JobFilters.of(request)
    sent: dict[str, dict[str, object]] = {}
    # The first read before the stream opens: a refused filter is a refused request, not an event.
    first: list[JobsPage] = [await read_page(request, filters)]

    async def fetch() -> tuple[list[sse.Event], bool]:
        page = first.pop() if first else await read_page(request, filters)
        events: list[sse.Event] = []
        for job in page.jobs:
            state = job_state(job)
            if sent.get(job.job_id) != state:
                sent[job.job_id] = state
                events.append(("job", state))
        return events, False

    return await sse.poll(request, fetch)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/jobs", jobs_page)
    app.router.add_get("/jobs/events", jobs_events)
