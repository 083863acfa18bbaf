"""`gpufed cluster join` and `gpufed cluster check`: a member cluster joined with least privilege.

`join` asks the server who the caller is first (an admin, or nothing is touched), makes gpufed's
account on the cluster with the admin kubeconfig (`clusters.kubernetes.join`), writes a kubeconfig
holding only that account's token (mode 0600), and registers the cluster (`Members.RegisterCluster`,
admin only on the server too). `check` reads the cluster through that kubeconfig and says what is
missing and how to fix it (`clusters.kubernetes.check`); it exits 1 when anything is missing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import yaml

from federation.api.v1 import gpufed_pb2 as pb
from federation.api.v1 import gpufed_pb2_grpc as pb_grpc


def default_kubeconfig(name: str) -> Path:
    return Path(f"gpufed-{name}.kubeconfig")


def _spec(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise click.ClickException(f"cannot read the cluster spec {path}: {error}") from error
    if not isinstance(doc, dict):
        raise click.ClickException(f"{path}: must be a mapping with the config file's cluster keys")
    return doc


def _names(namespace: str, account: str) -> Any:
    """Another account than the default gets a binding of its own, so that joins do not undo each other."""
    from clusters.kubernetes.join import JoinNames

    default = JoinNames()
    binding = default.binding if (namespace, account) == (default.namespace, default.account) else None
    return JoinNames(
        namespace=namespace,
        account=account,
        secret=f"{account}-token",
        binding=binding or f"{default.binding}-{namespace}-{account}",
    )


def register(cli: click.Group, rpc: Callable[[Any], Any]) -> None:
    @cli.group()
    def cluster() -> None:
        """Member clusters: join one with least privilege, check what it lacks."""

    @cluster.command(name="join")
    @click.argument("name")
    @click.option(
        "--kubeconfig",
        "admin_kubeconfig",
        required=True,
        type=click.Path(exists=True, dir_okay=False),
        help="the cluster admin's kubeconfig: used to make gpufed's account, never stored",
    )
    @click.option(
        "--context", default=None, help="context of the admin kubeconfig (default: its current one)"
    )
    @click.option(
        "--out",
        type=click.Path(dir_okay=False),
        default=None,
        help="where to write gpufed's kubeconfig (default: ./gpufed-NAME.kubeconfig), mode 0600",
    )
    @click.option(
        "--server-path",
        default=None,
        help="the path the server reads that kubeconfig from, if not --out (a mounted Secret)",
    )
    @click.option(
        "--spec",
        type=click.Path(exists=True, dir_okay=False),
        default=None,
        help="YAML with the config file's cluster keys: provider, region, pools, objectStore, ...",
    )
    @click.option("--namespace", default="gpufed", show_default=True, help="namespace of gpufed's account")
    @click.option(
        "--account",
        default="gpufed",
        show_default=True,
        help="gpufed's ServiceAccount (an existing one is kept: the servers' own, for an in-cluster member)",
    )
    @click.option(
        "--register/--no-register",
        default=True,
        show_default=True,
        help="register the cluster with the server (--no-register: only the account and kubeconfig, "
        "for clusters listed in the config file or the Helm values)",
    )
    @click.pass_obj
    @rpc
    def join_command(
        opts: Any,
        name: str,
        admin_kubeconfig: str,
        context: str | None,
        out: str | None,
        server_path: str | None,
        spec: str | None,
        namespace: str,
        account: str,
        register: bool,
    ) -> None:
        """Make gpufed's account on cluster NAME (exactly the rights gpufed uses) and register it."""
        from clusters.kubernetes.join import JoinFailed, join, kubeconfig, write_private

        doc = _spec(spec)
        with opts.client() as client:
            me = client.whoami()
            if me.role != "admin":
                raise click.ClickException(
                    f"PERMISSION_DENIED: only an admin may join a member cluster (you are {me.user}, "
                    f"role {me.role}); nothing was changed on the cluster"
                )
            try:
                joined = join(Path(admin_kubeconfig), context, _names(namespace, account))
            except JoinFailed as error:
                raise click.ClickException(f"cluster {name}: {error}") from error
            target = Path(out) if out is not None else default_kubeconfig(name)
            write_private(target, kubeconfig(joined, name))
            registered = {
                "provider": "private",
                **doc,
                "name": name,
                "backend": "kubernetes",
                "kubeconfig": server_path or str(target.resolve()),
                "context": name,
            }
            stub = pb_grpc.MembersStub(client.channel)
            reply = stub.RegisterCluster(
                pb.RegisterClusterRequest(document=json.dumps(registered)),
                metadata=client.metadata,
                timeout=30,
            )
        result = {
            "cluster": name,
            "registered": "created" if reply.created else "updated",
            "kubeconfig": str(target),
            "account": joined.names.user,
            "cluster_role": joined.names.role,
            "created": list(joined.created),
            "updated": list(joined.updated),
        }
        lines = [
            f"cluster {name} joined as {joined.names.user} (ClusterRole {joined.names.role})",
            f"kubeconfig: {target} (mode 0600)",
            f"registered: {result['registered']}",
        ]
        if joined.created:
            lines.append("created on the cluster: " + ", ".join(joined.created))
        if joined.updated:
            lines.append("updated on the cluster: " + ", ".join(joined.updated))
        lines.append(f"next: gpufed cluster check {name}")
        opts.emit(result, "\n".join(lines))

    @cluster.command(name="check")
    @click.argument("name")
    @click.option(
        "--kubeconfig",
        type=click.Path(dir_okay=False),
        default=None,
        help="gpufed's kubeconfig for the cluster (default: ./gpufed-NAME.kubeconfig, as join wrote it)",
    )
    @click.option("--context", default=None, help="its context (default: its current one)")
    @click.pass_obj
    def check_command(opts: Any, name: str, kubeconfig: str | None, context: str | None) -> None:
        """Check cluster NAME: API, version, GPU node labels, Volcano, and every permission gpufed uses."""
        from clusters.kubernetes.check import Verdict, check

        path = Path(kubeconfig) if kubeconfig is not None else default_kubeconfig(name)
        if not path.is_file():
            raise click.ClickException(
                f"no kubeconfig at {path}: run `gpufed cluster join {name}` or pass --kubeconfig"
            )
        report = check(name, path, context)
        marks = {Verdict.OK: "ok     ", Verdict.WARNING: "warning", Verdict.MISSING: "MISSING"}
        lines = []
        for f in report.findings:
            lines.append(f"{marks[f.verdict]}  {f.check}: {f.detail}")
            if f.fix and f.verdict is not Verdict.OK:
                lines.append(f"         fix: {f.fix}")
        missing = report.missing()
        lines.append(
            f"cluster {name}: ready for gpufed"
            if report.ok
            else f"cluster {name}: {len(missing)} missing: " + "; ".join(f.check for f in missing)
        )
        opts.emit(report.as_dict(), "\n".join(lines))
        if not report.ok:
            sys.exit(1)
