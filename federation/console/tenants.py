"""`/tenants`: each tenant the signed-in user may read, with its cost policy (how long its jobs wait
for private GPUs before paying cloud prices, issue 35) and what that policy sets, and its queue
limit (`maxQueuedJobs`: how many of its jobs may wait at once, issue 33).

Everyone sees the tenants ListTenants gives them (a member its own, infra, finance and admins all);
admins also change a tenant's cost policy and queue limit (form.cost-policy and form.queue-limit on
each row). A change reads the tenant's document (GetTenant), sets the one key and writes it back
(SetTenant), as `gpufed tenant cost-policy` and `gpufed tenant set` do: AdminService checks the role
again, checks the value (a bad one is refused naming the field, shown as the 400 page) and writes
the audit trail, so a member's POST is refused there (PERMISSION_DENIED, shown as the 404 page).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CALLS_KEY
from federation.console.layout import e, html_response, render_page, see_other, table
from federation.console.view import VIEW_KEY, View
from placement.model_policy import CostPolicy

# What each policy does, in the docs' words (docs/placement.md, "Per tenant and per job").
MEANING = {
    CostPolicy.SAVER.value: (
        "waits twice as long as the federation's wait (seconds per GPU-hour and cap); "
        "jobs of more than 24 h of work wait even when no room is promised"
    ),
    CostPolicy.BALANCED.value: "waits as the federation's policy says",
    CostPolicy.FAST.value: "never waits for private GPUs: bursts to the cloud at once",
}


def _document(tenant: pb.Tenant) -> dict[str, Any]:
    doc = json.loads(tenant.document) if tenant.document else {}
    return doc if isinstance(doc, dict) else {}


def _form(view: View, name: str, current: str) -> str:
    options = "".join(
        f'<option value="{e(p.value)}"{" selected" if p.value == current else ""}>{e(p.value)}</option>'
        for p in CostPolicy
    )
    return (
        f'<form class="cost-policy" method="post" action="/tenants/{e(name)}/cost-policy">'
        f'<input type="hidden" name="csrf" value="{e(view.csrf)}">'
        f'<label>Cost policy of {e(name)}<select name="cost_policy">{options}</select></label>'
        '<button type="submit" class="secondary">Set</button></form>'
    )


def _limit_form(view: View, name: str, limit: object) -> str:
    value = "" if limit is None else str(limit)
    return (
        f'<form class="queue-limit" method="post" action="/tenants/{e(name)}/queue-limit">'
        f'<input type="hidden" name="csrf" value="{e(view.csrf)}">'
        f'<label>Queue limit of {e(name)}<input type="number" name="max_queued_jobs" min="1" '
        f'value="{e(value)}" placeholder="federation default"></label>'
        '<button type="submit" class="secondary">Set</button></form>'
    )


def _row(view: View, tenant: pb.Tenant) -> str:
    doc = _document(tenant)
    policy = str(doc.get("costPolicy", CostPolicy.BALANCED.value))
    limit = doc.get("maxQueuedJobs")
    shown_limit = "federation default" if limit is None else str(limit)
    action = (
        f"<td>{_form(view, tenant.name, policy)}{_limit_form(view, tenant.name, limit)}</td>"
        if view.is_admin
        else ""
    )
    return (
        f'<tr data-tenant="{e(tenant.name)}"><td>{e(tenant.name)}</td><td>{e(doc.get("parent") or "")}</td>'
        f'<td class="cost-policy-name">{e(policy)}</td><td>{e(MEANING.get(policy, ""))}</td>'
        f'<td class="queue-limit-value">{e(shown_limit)}</td>{action}</tr>'
    )


async def tenants_page(request: web.Request) -> web.StreamResponse:
    view = request[VIEW_KEY]
    reply: pb.ListTenantsResponse = await request.app[CALLS_KEY].call(
        request, "ListTenants", pb.ListTenantsRequest()
    )
    columns: tuple[str, ...] = ("Tenant", "Parent", "Cost policy", "What it does", "Queue limit")
    if view.is_admin:
        columns = (*columns, "Change")
    rows = "".join(_row(view, t) for t in reply.tenants) or (
        f'<tr><td colspan="{len(columns)}" class="muted">No tenants.</td></tr>'
    )
    intro = (
        "<p>A tenant's cost policy sets how long its jobs wait for private GPUs before paying cloud "
        "prices; a job's <code>spec.maxWait</code> and deadline shorten the wait, and jobs of a class "
        "that needs approval never wait. <code>gpufed explain</code> says what each wait saves. Its queue "
        "limit is how many of its jobs may wait at once (<code>maxQueuedJobs</code>; without one, the "
        "federation's <code>policy.maxQueuedJobsPerTenant</code>): past it, a submission is refused.</p>"
    )
    body = intro + table(columns, rows, attrs=' id="tenants"')
    return html_response(render_page(view, page="tenants", title="Tenants", body=body))


async def set_cost_policy(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    form = await request.post()
    value = form.get("cost_policy")
    calls = request.app[CALLS_KEY]
    tenant: pb.Tenant = await calls.call(request, "GetTenant", pb.GetTenantRequest(name=name))
    doc = _document(tenant)
    # An unknown value goes through as written: SetTenant refuses it, naming the field.
    doc["costPolicy"] = value if isinstance(value, str) else ""
    await calls.call(request, "SetTenant", pb.SetTenantRequest(document=json.dumps(doc)))
    return see_other("/tenants")


async def set_queue_limit(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    form = await request.post()
    value = form.get("max_queued_jobs")
    text = value.strip() if isinstance(value, str) else ""
    calls = request.app[CALLS_KEY]
    tenant: pb.Tenant = await calls.call(request, "GetTenant", pb.GetTenantRequest(name=name))
    doc = _document(tenant)
    if not text:
        doc.pop("maxQueuedJobs", None)  # back to the federation's default for a tenant
    else:
        # A count goes as a number; anything else as written, and SetTenant refuses it naming the field.
        doc["maxQueuedJobs"] = int(text) if text.isdigit() else text
    await calls.call(request, "SetTenant", pb.SetTenantRequest(document=json.dumps(doc)))
    return see_other("/tenants")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/tenants", tenants_page)
    app.router.add_post("/tenants/{name}/cost-policy", set_cost_policy)
    app.router.add_post("/tenants/{name}/queue-limit", set_queue_limit)
