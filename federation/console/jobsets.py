"""The job sets pages: a tenant's sets with their counts by phase, GPU-hours and cost (`/sets`), and
one set with every member, held ones with why (`/sets/<tenant>/<name>`), where a member or admin
cancels the set or resubmits its failed jobs. Everything through JobService's set calls as the
signed-in user: another tenant's set is the 404 page, as a set that does not exist.
"""

from __future__ import annotations

from aiohttp import web

from federation.api import convert
from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CALLS_KEY
from federation.console.layout import e, html_response, render_page, see_other, table, when
from federation.console.view import VIEW_KEY, View

MAX_FIELD = 256


def _counts(s: pb.JobSet) -> str:
    return ", ".join(f"{c.phase.lower()} {c.jobs}" for c in s.counts) or "-"


def _cost(s: pb.JobSet) -> str:
    return f"${s.cost_usd}" if s.cost_usd else "-"


def _state(s: pb.JobSet) -> str:
    return "done" if s.done else ("cancelling" if s.cancel_requested else "active")


def _href(s: pb.JobSet) -> str:
    return f"/sets/{e(s.tenant)}/{e(s.name)}"


async def sets_page(request: web.Request) -> web.StreamResponse:
    view = request[VIEW_KEY]
    reply: pb.ListJobSetsResponse = await request.app[CALLS_KEY].call(
        request, "ListJobSets", pb.ListJobSetsRequest()
    )
    rows = (
        "".join(
            f'<tr data-job-set="{e(s.name)}"><td><a href="{_href(s)}">{e(s.name)}</a></td>'
            f"<td>{e(s.tenant)}</td>"
            f"<td>{s.job_count}</td><td>{e(_counts(s))}</td><td>{e(s.max_parallel or '-')}</td>"
            f"<td>{s.gpu_hours:.2f}</td><td>{e(_cost(s))}</td><td>{e(_state(s))}</td></tr>"
            for s in reply.job_sets
        )
        or '<tr><td colspan="8" class="muted">No job sets.</td></tr>'
    )
    columns = ("Set", "Tenant", "Jobs", "Phases", "At once", "GPU-hours", "Cost", "State")
    body = (
        "<p>Job sets and arrays: many jobs submitted under one name "
        "(<code>gpufed submit job.yaml --array 0-199%20</code>).</p>"
        + table(columns, rows, numeric=("Jobs", "GPU-hours", "Cost"), attrs=' id="job-sets"')
    )
    return html_response(render_page(view, page="sets", title="Job sets", body=body))


def _actions(view: View, s: pb.JobSet) -> str:
    if view.role not in ("admin", "member") or s.done:
        return ""
    hidden = f'<input type="hidden" name="csrf" value="{e(view.csrf)}">'
    cancel = (
        ""
        if s.cancel_requested
        else f'<form id="cancel-set" method="post" action="{_href(s)}/cancel" class="inline">{hidden}'
        f'<label>Reason<input name="reason" maxlength="{MAX_FIELD}"></label>'
        '<button type="submit" class="secondary">Cancel the set</button></form>'
    )
    failed = any(m.phase == pb.JOB_PHASE_FAILED for m in s.members)
    resubmit = (
        f'<form id="resubmit-set" method="post" action="{_href(s)}/resubmit" class="inline">{hidden}'
        '<button type="submit">Resubmit failed jobs</button></form>'
        if failed and not s.cancel_requested
        else ""
    )
    return cancel + resubmit


async def set_page(request: web.Request) -> web.StreamResponse:
    view = request[VIEW_KEY]
    tenant, name = request.match_info["tenant"], request.match_info["name"]
    s: pb.JobSet = await request.app[CALLS_KEY].call(
        request, "GetJobSet", pb.GetJobSetRequest(name=name, tenant=tenant)
    )
    created = s.created_at.seconds + s.created_at.nanos / 1e9
    facts = (
        f"<dl><dt>Tenant</dt><dd>{e(s.tenant)}</dd><dt>Submitted</dt><dd>{e(s.user)}, {e(when(created))}</dd>"
        f"<dt>Array</dt><dd>{e(s.array or '- (named jobs)')}</dd>"
        f"<dt>At once</dt><dd>{e(s.max_parallel or 'no limit')}</dd>"
        f'<dt>Jobs</dt><dd id="set-counts">{s.job_count}: {e(_counts(s))}</dd>'
        f"<dt>GPU-hours</dt><dd>{s.gpu_hours:.3f}</dd><dt>Cost so far</dt><dd>{e(_cost(s))}</dd>"
        f"<dt>State</dt><dd>{e(_state(s))}"
        f"{e('; ' + s.cancel_reason) if s.cancel_requested else ''}</dd></dl>"
    )
    rows = "".join(
        f'<tr data-member="{e(m.key)}"><td>{e(m.key)}</td>'
        + (
            f"<td>{e(m.job_id)}</td>"
            if m.held or not m.phase
            else f'<td><a href="/jobs/{e(m.job_id)}">{e(m.job_id)}</a></td>'
        )
        + f"<td>{'HELD' if m.held else e(convert.phase_name(m.phase) if m.phase else '-')}</td>"
        f"<td>{e(m.cluster or '-')}</td><td>{len(m.earlier_job_ids)}</td><td>{e(m.reason or '-')}</td></tr>"
        for m in s.members
    )
    members = table(
        ("Member", "Job", "Phase", "Cluster", "Reruns", "Reason"), rows, attrs=' id="set-members"'
    )
    body = facts + _actions(view, s) + members
    return html_response(render_page(view, page="sets", title=f"Job set {s.name}", body=body))


def _field(form: object, name: str) -> str:
    value = form.get(name) if hasattr(form, "get") else None
    return value.strip()[:MAX_FIELD] if isinstance(value, str) else ""


async def cancel(request: web.Request) -> web.StreamResponse:
    tenant, name = request.match_info["tenant"], request.match_info["name"]
    form = await request.post()
    message = pb.CancelJobSetRequest(name=name, tenant=tenant, reason=_field(form, "reason"))
    await request.app[CALLS_KEY].call(request, "CancelJobSet", message)
    return see_other(f"/sets/{tenant}/{name}")


async def resubmit(request: web.Request) -> web.StreamResponse:
    tenant, name = request.match_info["tenant"], request.match_info["name"]
    await request.app[CALLS_KEY].call(
        request, "ResubmitJobSet", pb.ResubmitJobSetRequest(name=name, tenant=tenant)
    )
    return see_other(f"/sets/{tenant}/{name}")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/sets", sets_page)
    app.router.add_get("/sets/{tenant}/{name}", set_page)
    app.router.add_post("/sets/{tenant}/{name}/cancel", cancel)
    app.router.add_post("/sets/{tenant}/{name}/resubmit", resubmit)
