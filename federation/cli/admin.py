"""`gpufed tenant|user|approval ...`: the administration commands (AdminService).

Writes need an admin's token; infra and finance may read every tenant, members their own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click
import yaml
from google.protobuf.timestamp_pb2 import Timestamp

from federation.api.v1 import gpufed_pb2 as pb
from federation.errors import GpufedError
from federation.spec.training_job import duration_seconds
from placement.model_policy import CostPolicy


def _when(ts: Timestamp) -> str:
    return ts.ToDatetime().strftime("%Y-%m-%d %H:%M UTC")


def approvals_table(approvals: list[pb.Approval]) -> str:
    rows = [("ID", "TENANT", "USER", "CLASS", "EXPIRES", "BY", "REASON")]
    for a in approvals:
        expires = _when(a.expires_at) + (" (expired)" if a.expired else "")
        rows.append(
            (a.approval_id, a.tenant, a.user or "*", a.priority_class, expires, a.granted_by, a.reason)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows
    )


def tenant_text(tenant: pb.Tenant) -> str:
    return yaml.safe_dump(json.loads(tenant.document), sort_keys=False).rstrip()


def tenant_dict(tenant: pb.Tenant) -> dict[str, Any]:
    """The API carries the document as a JSON string; a script wants it as the object it is."""
    return {"name": tenant.name, "document": json.loads(tenant.document) if tenant.document else {}}


def register(cli: click.Group, rpc: Callable[[Any], Any]) -> None:
    """Add the admin command groups to `cli`; `rpc` turns gRPC errors into one-line messages."""

    @cli.group()
    def tenant() -> None:
        """Tenants: quotas per GPU type, weight, budget, highest class (admins write)."""

    @tenant.command(name="set")
    @click.option(
        "-f", "--file", "path", required=True, type=click.File("r"), help="tenant document ('-': stdin)"
    )
    @click.pass_obj
    @rpc
    def tenant_set(opts: Any, path: Any) -> None:
        """Create or replace a tenant from a document with the config file's tenant keys."""
        with opts.client() as client:
            reply = client.set_tenant(path.read())
        opts.emit(tenant_dict(reply), f"tenant {reply.name} set; it applies at the next scheduling cycle")

    @tenant.command(name="get")
    @click.argument("name")
    @click.pass_obj
    @rpc
    def tenant_get(opts: Any, name: str) -> None:
        """Show a tenant in the config file's keys (what `tenant set` takes back)."""
        with opts.client() as client:
            reply = client.get_tenant(name)
        opts.emit(tenant_dict(reply), tenant_text(reply))

    @tenant.command(name="list")
    @click.pass_obj
    @rpc
    def tenant_list(opts: Any) -> None:
        """List the tenants you may read."""
        with opts.client() as client:
            reply = client.list_tenants()
        opts.emit(
            {"tenants": [tenant_dict(t) for t in reply.tenants]},
            "\n---\n".join(tenant_text(t) for t in reply.tenants),
        )

    @tenant.command(name="cost-policy")
    @click.argument("name")
    @click.argument("policy", type=click.Choice([p.value for p in CostPolicy]))
    @click.pass_obj
    @rpc
    def tenant_cost_policy(opts: Any, name: str, policy: str) -> None:
        """Set how long a tenant's jobs wait for private GPUs: saver, balanced or fast (admins).

        Reads the tenant's document, sets costPolicy and writes it back (`tenant set`), so every
        other key stays as it was."""
        with opts.client() as client:
            doc = json.loads(client.get_tenant(name).document)
            doc["costPolicy"] = policy
            reply = client.set_tenant(json.dumps(doc))
        opts.emit(
            tenant_dict(reply),
            f"tenant {reply.name}: cost policy {policy}; it applies at the next scheduling cycle",
        )

    @tenant.command(name="delete")
    @click.argument("name")
    @click.pass_obj
    @rpc
    def tenant_delete(opts: Any, name: str) -> None:
        """Delete a tenant that has no child tenants, users or unfinished jobs."""
        with opts.client() as client:
            client.delete_tenant(name)
        opts.emit({"tenant": name, "deleted": True}, f"tenant {name} deleted")

    @cli.group()
    def user() -> None:
        """Users' limits (admins)."""

    @user.command(name="set-priority")
    @click.argument("name")
    @click.argument("priority_class", required=False, default="")
    @click.pass_obj
    @rpc
    def user_set_priority(opts: Any, name: str, priority_class: str) -> None:
        """Set the highest class USER may submit at (no class: remove the user's own limit)."""
        with opts.client() as client:
            reply = client.set_user_priority(name, priority_class)
        opts.emit(reply, f"{reply.name}: at most {reply.max_priority_class or 'what the tenant allows'}")

    @cli.group()
    def approval() -> None:
        """Time-limited approvals for classes that need one, such as urgent (admins grant)."""

    @approval.command(name="grant")
    @click.option("--tenant", required=True)
    @click.option("--user", "for_user", default="", help="one user of the tenant (default: all of them)")
    @click.option("--class", "priority_class", default="urgent", show_default=True)
    @click.option("--for", "duration", required=True, help="how long: '72h', '2d', '1h30m' (at most 30d)")
    @click.option("--reason", required=True, help="why: the deadline or the paper")
    @click.pass_obj
    @rpc
    def approval_grant(
        opts: Any, tenant: str, for_user: str, priority_class: str, duration: str, reason: str
    ) -> None:
        """Grant an approval."""
        try:
            seconds = duration_seconds(duration, "--for")
        except GpufedError as error:
            raise click.BadParameter(str(error), param_hint="--for") from error
        with opts.client() as client:
            reply = client.grant_approval(
                tenant=tenant, user=for_user, priority_class=priority_class, duration_s=seconds, reason=reason
            )
        opts.emit(
            reply,
            f"{reply.approval_id} granted: {reply.priority_class} for {reply.tenant}"
            f" until {_when(reply.expires_at)}",
        )

    @approval.command(name="list")
    @click.option("--tenant", default="")
    @click.option("--all", "include_expired", is_flag=True, help="include expired approvals")
    @click.pass_obj
    @rpc
    def approval_list(opts: Any, tenant: str, include_expired: bool) -> None:
        """List approvals you may read."""
        with opts.client() as client:
            reply = client.list_approvals(tenant=tenant, include_expired=include_expired)
        opts.emit(reply, approvals_table(list(reply.approvals)))

    @approval.command(name="revoke")
    @click.argument("approval_id")
    @click.pass_obj
    @rpc
    def approval_revoke(opts: Any, approval_id: str) -> None:
        """Revoke an approval (jobs it admitted keep running)."""
        with opts.client() as client:
            client.revoke_approval(approval_id)
        opts.emit({"approval_id": approval_id, "revoked": True}, f"{approval_id} revoked")
