"""`gpufed user set|list`, `gpufed token issue|list|revoke`, `gpufed audit`: access, for admins.

A token is printed once, when it is issued; the server keeps only its hash, so a lost token is
revoked and a new one issued. `--out FILE` writes it to a file readable by its owner only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp

from federation.api.v1 import gpufed_pb2 as pb
from federation.errors import GpufedError
from federation.spec.training_job import duration_seconds


def _when(ts: Timestamp) -> str:
    return ts.ToDatetime().strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def users_table(users: list[pb.User]) -> str:
    rows = [("USER", "TENANT", "ROLE", "MAX CLASS")]
    rows += [(u.name, u.tenant, u.role, u.max_priority_class or "-") for u in users]
    return _table(rows)


def tokens_table(tokens: list[pb.TokenInfo]) -> str:
    rows = [("ID", "USER", "ISSUED BY", "ISSUED", "EXPIRES")]
    rows += [
        (
            t.token_id,
            t.user,
            t.issued_by,
            _when(t.issued_at),
            _when(t.expires_at) if t.HasField("expires_at") else "never",
        )
        for t in tokens
    ]
    return _table(rows)


def audit_table(events: list[pb.AuditEvent]) -> str:
    rows = [("WHEN", "WHO", "ROLE", "ACTION", "TARGET", "DETAIL")]
    rows += [(_when(e.at), e.user, e.role, e.action, e.target, e.detail[:120]) for e in events]
    return _table(rows)


def register(cli: click.Group, rpc: Callable[[Any], Any]) -> None:
    user = cli.commands["user"]
    assert isinstance(user, click.Group)

    @user.command(name="set")
    @click.argument("name")
    @click.option("--tenant", required=True)
    @click.option("--role", type=click.Choice(("admin", "infra", "finance", "member")), default="member")
    @click.option(
        "--max-class", "max_class", default="", help="highest priority class (default: the tenant's)"
    )
    @click.pass_obj
    @rpc
    def user_set(opts: Any, name: str, tenant: str, role: str, max_class: str) -> None:
        """Create or change a user (admins only)."""
        with opts.client() as client:
            reply = client.set_user(name, tenant=tenant, role=role, max_priority_class=max_class)
        opts.emit(reply, f"user {reply.name} set: tenant {reply.tenant}, role {reply.role}")

    @user.command(name="list")
    @click.pass_obj
    @rpc
    def user_list(opts: Any) -> None:
        """List users (admins only)."""
        with opts.client() as client:
            reply = client.list_users()
        opts.emit(reply, users_table(list(reply.users)))

    @cli.group()
    def token() -> None:
        """Bearer tokens: issued and revoked by admins; only their hashes are stored."""

    @token.command(name="issue")
    @click.argument("user_name")
    @click.option("--ttl", default="", help="lifetime, e.g. '90d' or '12h' (default: until revoked)")
    @click.option(
        "--out", default=None, help="write the token to this file (mode 0600) instead of printing it"
    )
    @click.pass_obj
    @rpc
    def token_issue(opts: Any, user_name: str, ttl: str, out: str | None) -> None:
        """Issue a new token for USER_NAME."""
        try:
            ttl_s = duration_seconds(ttl, "--ttl") if ttl else 0.0
        except GpufedError as error:
            raise click.BadParameter(str(error), param_hint="--ttl") from error
        with opts.client() as client:
            reply = client.issue_token(user_name, ttl_s=ttl_s)
        if out is not None:
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(reply.token + "\n")
            # The token itself stays in the file, in every format.
            opts.emit(
                {"info": MessageToDict(reply.info, preserving_proto_field_name=True), "written_to": out},
                f"token {reply.info.token_id} for {reply.info.user} written to {Path(out)}",
            )
            return
        opts.emit(
            reply, f"{reply.token}\n(token {reply.info.token_id} for {reply.info.user}; shown only once)"
        )

    @token.command(name="list")
    @click.option("--user", "user_name", default="")
    @click.pass_obj
    @rpc
    def token_list(opts: Any, user_name: str) -> None:
        """List tokens by id (never the tokens themselves)."""
        with opts.client() as client:
            reply = client.list_tokens(user=user_name)
        opts.emit(reply, tokens_table(list(reply.tokens)))

    @token.command(name="revoke")
    @click.argument("token_id")
    @click.pass_obj
    @rpc
    def token_revoke(opts: Any, token_id: str) -> None:
        """Revoke a token by its id (effective within seconds on every server)."""
        with opts.client() as client:
            client.revoke_token(token_id)
        opts.emit({"token_id": token_id, "revoked": True}, f"token {token_id} revoked")

    @cli.command()
    @click.option("--limit", default=100, show_default=True)
    @click.option("--page", "page_token", default="", help="the token printed under a page: older events")
    @click.pass_obj
    @rpc
    def audit(opts: Any, limit: int, page_token: str) -> None:
        """Admin actions, newest last, with who did them (admins only), archived ones included."""
        with opts.client() as client:
            reply = client.list_audit(limit=limit, page_token=page_token)
        opts.emit(reply, audit_table(list(reply.events)))
        if reply.next_page_token:
            click.echo(f"older events: gpufed audit --page {reply.next_page_token}", err=True)
