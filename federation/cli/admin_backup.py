"""`gpufed admin backup|restore`: the federation's state to one directory, and back into an empty
deployment (`federation.runtime.backup`, `federation.runtime.restore`; docs/deploy.md, "Backup and
restore").

Both talk to etcd and the history database directly, not through a server: a backup must work with
every server down, and a restore has none to talk to yet. Both need an admin's token all the same,
checked against the tokens the federation itself holds (backup: in etcd; restore: in the backup).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from federation.runtime.endpoint import read_endpoint


def _dsn(opts: Any, history_dsn: str | None, config_path: str | None) -> str:
    """`--history-dsn`, else the config's `history:` section, else SQLite under the state dir."""
    if history_dsn:
        return history_dsn
    # Here, not at the top: it imports SQLAlchemy, a third of a second of every other command's start.
    from federation.history.config import HistorySettings, resolve_dsn

    settings = HistorySettings()
    if config_path is not None:
        from federation.runtime.config import load_config  # the whole config: only when given

        settings = load_config(Path(config_path)).history
    return resolve_dsn(settings, opts.state_dir)


def _etcd(opts: Any, etcd_endpoints: str | None) -> str:
    if etcd_endpoints:
        return etcd_endpoints
    try:
        return str(read_endpoint(opts.state_dir)["etcd"])
    except (FileNotFoundError, KeyError) as error:
        raise click.ClickException(
            f"no --etcd given and no embedded default running in {opts.state_dir}"
        ) from error


def _emit_files(opts: Any, payload: dict[str, Any], lines: list[str]) -> None:
    opts.emit(payload, "\n".join(lines))


def register(cli: click.Group) -> None:
    """Add `backup` and `restore` to the `admin` group (made here if no other module made it)."""
    admin = cli.commands.get("admin")
    if not isinstance(admin, click.Group):

        @cli.group(name="admin")
        def admin_group() -> None:
            """Operating the federation: backup and restore (admins)."""

        admin = admin_group

    _register_history_downgrade(admin)

    @admin.command(name="backup")
    @click.option(
        "--out", "out_dir", required=True, type=click.Path(file_okay=False), help="new or empty dir"
    )
    @click.option(
        "--etcd", "etcd_endpoints", help="etcd endpoints as `serve --etcd` takes them (default: `up`'s)"
    )
    @click.option("--etcd-cacert", envvar="GPUFED_ETCD_CACERT", type=click.Path(exists=True, dir_okay=False))
    @click.option("--etcd-cert", envvar="GPUFED_ETCD_CERT", type=click.Path(exists=True, dir_okay=False))
    @click.option("--etcd-key", envvar="GPUFED_ETCD_KEY", type=click.Path(exists=True, dir_okay=False))
    @click.option(
        "--history-dsn", envvar="GPUFED_HISTORY_DSN", help="the history database (GPUFED_HISTORY_DSN)"
    )
    @click.option(
        "--config", "config_path", type=click.Path(exists=True, dir_okay=False), help="read history: from it"
    )
    @click.pass_obj
    def backup(
        opts: Any,
        out_dir: str,
        etcd_endpoints: str | None,
        etcd_cacert: str | None,
        etcd_cert: str | None,
        etcd_key: str | None,
        history_dsn: str | None,
        config_path: str | None,
    ) -> None:
        """Back up etcd (a snapshot), the history database and the datasets' manifests into --out.

        etcd is snapshotted first, the history dumped after: see docs/deploy.md for what a backup
        taken while jobs run holds."""
        from federation.runtime.backup import take_backup
        from federation.runtime.etcd_backup import EtcdAccess

        access = EtcdAccess(
            _etcd(opts, etcd_endpoints),
            Path(etcd_cacert) if etcd_cacert else None,
            Path(etcd_cert) if etcd_cert else None,
            Path(etcd_key) if etcd_key else None,
        )
        result = take_backup(Path(out_dir), access, _dsn(opts, history_dsn, config_path), opts._token())
        m = result.manifest
        _emit_files(
            opts,
            {"directory": str(result.directory), "manifest": _manifest_dict(m)},
            [
                f"backup written to {result.directory}",
                f"  etcd: revision {m.etcd_revision}, {m.gpufed_keys} keys under /gpufed/"
                f" (from {m.etcd_endpoint})",
                f"  history ({m.history_backend}, schema {m.history_revision}): "
                + (", ".join(f"{t} {n}" for t, n in sorted(m.history_rows.items()) if n) or "no rows yet"),
                f"  datasets: {m.datasets}, versions: {m.dataset_versions}",
            ],
        )

    @admin.command(name="restore")
    @click.option("--from", "source", required=True, type=click.Path(exists=True, file_okay=False))
    @click.option("--etcd-data-dir", type=click.Path(), help="the new etcd member's data dir (must be empty)")
    @click.option("--etcd-name", default="gpufed", show_default=True, help="the member's --name")
    @click.option(
        "--initial-cluster",
        default=None,
        help="every member as name=peer-url, comma-separated (default: this member alone)",
    )
    @click.option(
        "--initial-advertise-peer-urls", "peer_urls", default="http://127.0.0.1:2380", show_default=True
    )
    @click.option("--initial-cluster-token", default="gpufed-restored", show_default=True)
    @click.option("--history-dsn", envvar="GPUFED_HISTORY_DSN", help="the new, empty history database")
    @click.option(
        "--config", "config_path", type=click.Path(exists=True, dir_okay=False), help="read history: from it"
    )
    @click.option(
        "--force", is_flag=True, help="replace non-empty targets (the old etcd data dir is kept aside)"
    )
    @click.pass_obj
    def restore(
        opts: Any,
        source: str,
        etcd_data_dir: str | None,
        etcd_name: str,
        initial_cluster: str | None,
        peer_urls: str,
        initial_cluster_token: str,
        history_dsn: str | None,
        config_path: str | None,
        force: bool,
    ) -> None:
        """Restore a backup into an empty deployment: a new etcd data dir and an empty history database.

        Stop every server first; start etcd on the new data dir and the servers after."""
        from federation.runtime.etcd_backup import MemberSpec
        from federation.runtime.restore import restore_backup

        dsn = history_dsn or (_dsn(opts, None, config_path) if config_path else None)
        member = MemberSpec(
            name=etcd_name,
            initial_cluster=initial_cluster or f"{etcd_name}={peer_urls}",
            peer_urls=peer_urls,
            cluster_token=initial_cluster_token,
        )
        result = restore_backup(
            Path(source),
            opts._token(),
            etcd_data_dir=Path(etcd_data_dir) if etcd_data_dir else None,
            member=member,
            history_dsn=dsn,
            force=force,
        )
        m = result.manifest
        lines = [f"restored the backup of {m.created_at} (etcd revision {m.etcd_revision})"]
        if result.etcd_data_dir is not None:
            lines.append(f"  etcd data dir: {result.etcd_data_dir} (start etcd on it as member {etcd_name})")
        if result.history_rows:
            lines.append(
                "  history: " + ", ".join(f"{t} {n}" for t, n in sorted(result.history_rows.items()) if n)
            )
        lines += [f"  kept aside: {path}" for path in result.kept_aside]
        _emit_files(
            opts,
            {
                "etcd_data_dir": str(result.etcd_data_dir) if result.etcd_data_dir else None,
                "history_rows": result.history_rows,
                "kept_aside": [str(p) for p in result.kept_aside],
                "manifest": _manifest_dict(m),
            },
            lines,
        )


def _register_history_downgrade(admin: click.Group) -> None:
    @admin.command(name="history-downgrade")
    @click.option("--to", "revision", required=True, help="the revision of the release rolled back to")
    @click.option(
        "--history-dsn", envvar="GPUFED_HISTORY_DSN", help="the history database (GPUFED_HISTORY_DSN)"
    )
    @click.option(
        "--config", "config_path", type=click.Path(exists=True, dir_okay=False), help="read history: from it"
    )
    @click.pass_obj
    def history_downgrade(opts: Any, revision: str, history_dsn: str | None, config_path: str | None) -> None:
        """Take the history database's schema back to an earlier revision, to roll back a release
        that migrated it (docs/deploy.md, "Rolling back").

        Stop every server of the newer release first: the columns and tables the later revisions
        added are dropped, with what they held. Works on the database directly, as backup does;
        whoever holds its DSN may change its schema anyway."""
        from federation.history.engine import current_revision, downgrade, open_engine

        engine = open_engine(_dsn(opts, history_dsn, config_path))
        try:
            before = current_revision(engine)
            undone = downgrade(engine, revision)
        finally:
            engine.dispose()
        opts.emit(
            {"from": before, "to": revision, "undone": undone},
            f"history schema {before} -> {revision} (undid {', '.join(undone)}); "
            "start the release whose newest revision this is",
        )


def _manifest_dict(m: Any) -> dict[str, Any]:
    from dataclasses import asdict

    doc = asdict(m)
    # Hashes of admins' tokens: not secrets, but nothing a reader of the output needs.
    doc["admin_tokens"] = len(doc["admin_tokens"])
    return doc
