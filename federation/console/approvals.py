"""The approvals page: who may use a priority class that needs an admin's approval, until when.

Everyone reads the approvals of the tenants they may read (ListApprovals decides which); admins
also grant one (form#grant-approval) and revoke one (form.revoke-approval on each row). Both go
through AdminService, which checks the role again and writes the audit trail.
"""

from __future__ import annotations

from aiohttp import web
from google.protobuf.timestamp_pb2 import Timestamp

from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CALLS_KEY
from federation.console.layout import e, html_response, render_page, see_other, table, when
from federation.console.view import VIEW_KEY, View

MAX_FIELD = 500
HOUR_S = 3600.0


def _seconds(ts: Timestamp) -> float:
    return float(ts.seconds) + ts.nanos / 1e9


def _row(view: View, a: pb.Approval) -> str:
    revoke = ""
    if view.is_admin:
        revoke = (
            f'<form class="revoke-approval" method="post" action="/approvals/{e(a.approval_id)}/revoke">'
            f'<input type="hidden" name="csrf" value="{e(view.csrf)}">'
            f'<button type="submit" class="secondary" aria-label="Revoke {e(a.approval_id)}">Revoke</button>'
            "</form>"
        )
    state = "expired" if a.expired else "active"
    return (
        f'<tr data-approval-id="{e(a.approval_id)}"><td>{e(a.approval_id)}</td><td>{e(a.tenant)}</td>'
        f"<td>{e(a.user or 'every user')}</td><td>{e(a.priority_class)}</td>"
        f"<td>{e(when(_seconds(a.expires_at)))} ({state})</td><td>{e(a.reason)}</td>"
        f"<td>{e(a.granted_by)}, {e(when(_seconds(a.granted_at)))}</td>"
        f"{f'<td>{revoke}</td>' if view.is_admin else ''}</tr>"
    )


def _grant_form(view: View, tenants: list[str]) -> str:
    options = "".join(f'<option value="{e(t)}">{e(t)}</option>' for t in tenants)
    return (
        "<h2>Grant an approval</h2>"
        '<form id="grant-approval" method="post" action="/approvals" class="inline">'
        f'<input type="hidden" name="csrf" value="{e(view.csrf)}">'
        f'<label>Tenant<select name="tenant" required>{options}</select></label>'
        '<label>User (empty: every user)<input name="user" maxlength="128"></label>'
        '<label>Priority class<input name="priority_class" value="urgent" required maxlength="128"></label>'
        '<label>Hours<input name="hours" type="number" min="1" max="720" value="24" required></label>'
        f'<label>Reason<input name="reason" required maxlength="{MAX_FIELD}"></label>'
        '<button type="submit">Grant</button></form>'
    )


async def approvals_page(request: web.Request) -> web.StreamResponse:
    view = request[VIEW_KEY]
    calls = request.app[CALLS_KEY]
    include_expired = request.query.get("expired") == "1"
    reply: pb.ListApprovalsResponse = await calls.call(
        request, "ListApprovals", pb.ListApprovalsRequest(include_expired=include_expired)
    )
    columns: tuple[str, ...] = ("Id", "Tenant", "User", "Class", "Expires", "Reason", "Granted by")
    if view.is_admin:
        columns = (*columns, "Action")
    rows = "".join(_row(view, a) for a in reply.approvals) or (
        f'<tr><td colspan="{len(columns)}" class="muted">No approvals.</td></tr>'
    )
    toggle = (
        '<a href="/approvals">Hide expired</a>'
        if include_expired
        else '<a href="/approvals?expired=1">Show expired</a>'
    )
    body = f"<p>{toggle}</p>" + table(columns, rows, attrs=' id="approvals"')
    if view.is_admin:
        tenants: pb.ListTenantsResponse = await calls.call(request, "ListTenants", pb.ListTenantsRequest())
        body += _grant_form(view, [t.name for t in tenants.tenants])
    return html_response(render_page(view, page="approvals", title="Approvals", body=body))


def _field(form: object, name: str) -> str:
    value = form.get(name) if hasattr(form, "get") else None
    return value.strip()[:MAX_FIELD] if isinstance(value, str) else ""


async def grant(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    try:
        hours = float(_field(form, "hours") or "0")
    except ValueError:
        hours = 0.0
    message = pb.GrantApprovalRequest(
        tenant=_field(form, "tenant"),
        user=_field(form, "user"),
        priority_class=_field(form, "priority_class"),
        duration_seconds=hours * HOUR_S,
        reason=_field(form, "reason"),
    )
    # A member's grant is refused by the servicer (PERMISSION_DENIED, shown as the 404 page).
    await request.app[CALLS_KEY].call(request, "GrantApproval", message)
    return see_other("/approvals")


async def revoke(request: web.Request) -> web.StreamResponse:
    approval_id = request.match_info["approval_id"]
    await request.app[CALLS_KEY].call(
        request, "RevokeApproval", pb.RevokeApprovalRequest(approval_id=approval_id)
    )
    return see_other("/approvals")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/approvals", approvals_page)
    app.router.add_post("/approvals", grant)
    app.router.add_post("/approvals/{approval_id}/revoke", revoke)
