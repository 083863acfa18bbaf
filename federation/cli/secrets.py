"""`gpufed secret put|list|delete`: the tenant's secrets (Secrets). Values go in and never come out.

`put` reads values from the command line (`--from-literal KEY=VALUE`) or from files (`--from-file
KEY=PATH`, or `PATH` for a key named after the file), as `kubectl create secret generic` does; a file
keeps the value out of the shell's history and the process list, so prefer it for real tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from federation.api.v1 import gpufed_pb2 as pb


def _when(ts: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts.seconds))


def secrets_table(reply: pb.ListSecretsResponse) -> str:
    rows = [("NAME", "TENANT", "VERSION", "KEYS", "UPDATED", "BY")]
    for s in reply.secrets:
        rows.append((s.name, s.tenant, str(s.version), ",".join(s.keys), _when(s.updated_at), s.updated_by))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def secret_values(literals: Sequence[str], files: Sequence[str]) -> dict[str, bytes]:
    """The keys and values a put sends, or a usage error naming the argument (never a value)."""
    data: dict[str, bytes] = {}

    def add(key: str, value: bytes, option: str) -> None:
        if not key:
            raise click.BadParameter("needs KEY=...", param_hint=option)
        if key in data:
            raise click.BadParameter(f"key {key!r} given twice", param_hint=option)
        data[key] = value

    for item in literals:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(
                f"expected KEY=VALUE, got a text without '=' (key {key[:40]!r}?)", param_hint="--from-literal"
            )
        add(key, value.encode(), "--from-literal")
    for item in files:
        key, sep, path = item.partition("=")
        if not sep:
            key, path = Path(item).name, item
        try:
            content = Path(path).read_bytes()
        except OSError as error:
            raise click.BadParameter(f"{path}: {error.strerror or error}", param_hint="--from-file") from None
        add(key, content, "--from-file")
    if not data:
        raise click.UsageError("give at least one --from-literal KEY=VALUE or --from-file KEY=PATH")
    return data


def register(cli: click.Group, rpc: Callable[[Any], Any]) -> None:
    @cli.group()
    def secret() -> None:
        """Your tenant's secrets: tokens and credentials your jobs read as env or files.

        Values are sealed at rest, copied to a job's namespace on its cluster only while it runs, and
        never shown again: list shows names, keys, versions and times.
        """

    @secret.command(name="put")
    @click.argument("name")
    @click.option(
        "--from-literal", "literals", multiple=True, metavar="KEY=VALUE", help="a key and its value"
    )
    @click.option(
        "--from-file", "files", multiple=True, metavar="KEY=PATH", help="a key and a file holding its value"
    )
    @click.option("--tenant", default="", help="admins: another tenant's secret")
    @click.pass_obj
    @rpc
    def put_cmd(opts: Any, name: str, literals: tuple[str, ...], files: tuple[str, ...], tenant: str) -> None:
        """Create or replace secret NAME with these keys (all of them: keys not given are dropped)."""
        data = secret_values(literals, files)
        with opts.client() as client:
            reply = client.put_secret(name, data, tenant=tenant)
        opts.emit(
            reply,
            f"secret {reply.name} (tenant {reply.tenant}) version {reply.version}: {', '.join(reply.keys)}",
        )

    @secret.command(name="list")
    @click.option("--tenant", default="", help="admins: only this tenant's")
    @click.pass_obj
    @rpc
    def list_cmd(opts: Any, tenant: str) -> None:
        """Your tenant's secrets (admins: every tenant's), without their values."""
        with opts.client() as client:
            reply = client.list_secrets(tenant=tenant)
        opts.emit(reply, secrets_table(reply))

    @secret.command(name="delete")
    @click.argument("name")
    @click.option("--tenant", default="", help="admins: another tenant's secret")
    @click.pass_obj
    @rpc
    def delete_cmd(opts: Any, name: str, tenant: str) -> None:
        """Delete secret NAME. Jobs already running keep their copy until they end; queued jobs that
        reference it fail at dispatch, saying so."""
        with opts.client() as client:
            reply = client.delete_secret(name, tenant=tenant)
        opts.emit(reply, f"deleted secret {reply.name} (tenant {reply.tenant}, version {reply.version})")
