"""`gpufed`: the command line for users (submit, get, list, watch, cancel, explain) and operators (up, serve).

Where to connect and as whom: `--server`/`GPUFED_SERVER` and `--token`, `--token-file`/`GPUFED_TOKEN_FILE`
or `--user NAME` (the token file of the embedded default under `--state-dir`). With none of them,
the embedded default in `./.gpufed` is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import grpc

from federation.api.client import GpufedClient, TlsClient
from federation.api.convert import phase_name
from federation.api.v1 import gpufed_pb2 as pb
from federation.cli import access as cli_access
from federation.cli import admin as cli_admin
from federation.cli import admin_backup as cli_admin_backup
from federation.cli import capacity as cli_capacity
from federation.cli import cluster_join as cli_cluster_join
from federation.cli import dataset as cli_dataset
from federation.cli import jobsets as cli_jobsets
from federation.cli import logs as cli_logs
from federation.cli import replay as cli_replay
from federation.cli import report as cli_report
from federation.cli import secrets as cli_secrets
from federation.cli import sweeps as cli_sweeps
from federation.cli.first_steps import EXAMPLE_JOB, first_steps
from federation.cli.logs import parse_since
from federation.cli.output import OutputGroup, OutputHolder, RpcFailed, accept_output_everywhere
from federation.cli.render import (
    FORMATS,
    as_dict,
    clusters_table,
    explain_text,
    job_detail,
    jobs_table,
    structured,
    summary_table,
)
from federation.logs import configure_logging

# Not `federation.runtime.embedded`, which only `up` needs (imported there): it imports the whole
# server, about 0.7 s of every command's start.
from federation.runtime.endpoint import read_endpoint
from federation.runtime.role import ServerRole

if TYPE_CHECKING:
    from federation.runtime.embedded import EmbeddedInfo

DEFAULT_STATE_DIR = Path(".gpufed")


class _Opts(OutputHolder):
    """What the top-level options chose, on the click context for every command (`@click.pass_obj`).

    `output` is the format: `gpufed -o F`, replaced by a subcommand's own `-o F` (`federation.cli.output`).
    """

    def __init__(self, **kwargs: Any) -> None:
        self.server: str | None = kwargs["server"]
        self.token: str | None = kwargs["token"]
        self.token_file: str | None = kwargs["token_file"]
        self.user: str | None = kwargs["user"]
        self.state_dir: Path = Path(kwargs["state_dir"])
        self.output: str = kwargs["output"]
        self.tls_ca: str | None = kwargs["tls_ca"] or os.environ.get("GPUFED_TLS_CA")
        self.tls_client_cert: str | None = kwargs["tls_client_cert"] or os.environ.get(
            "GPUFED_TLS_CLIENT_CERT"
        )
        self.tls_client_key: str | None = kwargs["tls_client_key"] or os.environ.get("GPUFED_TLS_CLIENT_KEY")

    def client(self) -> GpufedClient:
        server = self.server or os.environ.get("GPUFED_SERVER")
        if not server:
            try:
                server = read_endpoint(self.state_dir)["grpc"]
            except FileNotFoundError as error:
                raise click.ClickException(
                    f"no server given and no embedded default running in {self.state_dir} "
                    "(use --server, GPUFED_SERVER, or start one with `gpufed up`)"
                ) from error
        tls = None
        if self.tls_ca is not None:
            try:
                tls = TlsClient(
                    ca_pem=Path(self.tls_ca).read_bytes(),
                    cert_pem=Path(self.tls_client_cert).read_bytes() if self.tls_client_cert else None,
                    key_pem=Path(self.tls_client_key).read_bytes() if self.tls_client_key else None,
                )
            except OSError as error:
                raise click.ClickException(f"cannot read a TLS file: {error}") from error
        return GpufedClient(server, self._token(), tls=tls)

    def _token(self) -> str:
        if self.token:
            return self.token
        path = self.token_file or os.environ.get("GPUFED_TOKEN_FILE")
        if path is None and self.user:
            path = str(self.state_dir / "tokens" / f"{self.user}.token")
        if path is None:
            env = os.environ.get("GPUFED_TOKEN")
            if env:
                return env
            raise click.ClickException("no token: use --token, --token-file, --user or GPUFED_TOKEN(_FILE)")
        try:
            return Path(path).read_text().strip()
        except OSError as error:
            raise click.ClickException(f"cannot read token file {path}: {error.strerror}") from error

    def emit(self, message: Any, table_text: str) -> None:
        """`table_text` for people, else the reply (a protobuf message or a plain dict) as JSON or YAML."""
        if self.output == "table":
            click.echo(table_text)
        else:
            payload = message if isinstance(message, dict) else as_dict(message)
            click.echo(structured(payload, self.output))


def _rpc(fn: Any) -> Any:
    """Turn gRPC errors into a one-line message and exit status 1, instead of a traceback."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except grpc.RpcError as error:
            code = error.code().name if hasattr(error, "code") else "ERROR"
            details = error.details() if hasattr(error, "details") else str(error)
            raise RpcFailed(code, details or "") from error

    return wrapper


@click.group(cls=OutputGroup)
@click.option("--server", help="gRPC address host:port (default: GPUFED_SERVER or the embedded default)")
@click.option("--token", help="bearer token (prefer --token-file)")
@click.option("--token-file", type=click.Path(dir_okay=False), help="file holding the bearer token")
@click.option("--user", help="use the embedded default's token file for this user")
@click.option(
    "--state-dir", default=str(DEFAULT_STATE_DIR), show_default=True, help="embedded default's state"
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(FORMATS),
    default="table",
    show_default=True,
    help="table, json or yaml; also accepted after any subcommand (errors too come as JSON or YAML)",
)
@click.option(
    "--tls-ca", default=None, help="CA that signed the server's certificate: use TLS (GPUFED_TLS_CA)"
)
@click.option("--tls-client-cert", default=None, help="client certificate for mutual TLS (PEM)")
@click.option("--tls-client-key", default=None, help="client private key for mutual TLS (PEM)")
@click.pass_context
def cli(ctx: click.Context, /, **kwargs: Any) -> None:
    """gpufed: one submission endpoint for GPU training jobs across clusters and clouds."""
    ctx.obj = _Opts(**kwargs)


@cli.command()
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False),
    help="federation config (tenants, users, clusters)",
)
@click.option("--port", default=50051, show_default=True, help="gRPC port (0: any free port)")
@click.option(
    "--metrics-port",
    default=9464,
    show_default=True,
    help="HTTP port of the web console and Prometheus /metrics (0: any)",
)
@click.option("--etcd-port", type=int, default=None, help="etcd's client port (default: a free one)")
@click.option(
    "--sim-port", type=int, default=None, help="first simulated cluster's API port, the next ones above"
)
@click.option(
    "--store-port",
    "store_ports",
    multiple=True,
    metavar="SERVER=PORT",
    help="S3 port of the config's `seaweed: SERVER` object store (repeatable; gRPC takes PORT+10000)",
)
@click.pass_obj
def up(
    opts: _Opts,
    config: str | None,
    port: int,
    metrics_port: int,
    etcd_port: int | None,
    sim_port: int | None,
    store_ports: tuple[str, ...],
) -> None:
    """Start the embedded default: local etcd, the server and simulated clusters."""
    configure_logging()

    from datasync.seaweed_process import SeaweedStartFailed
    from federation.runtime.config import load_config
    from federation.runtime.embedded import default_config_path, run_up
    from federation.runtime.etcd_process import EtcdStartFailed
    from federation.runtime.local_ports import LocalPorts, PortTaken
    from federation.runtime.sim_process import SimStartFailed
    from federation.runtime.state_lock import StateDirBusy, hold_state_dir

    def ready(info: EmbeddedInfo) -> None:
        # Read again (run_up read it too) only for the users' names: the hint names one that exists.
        users = load_config(Path(config) if config else default_config_path()).users
        hints = first_steps(
            users, info.token_files, config=config or "the default config", example_here=EXAMPLE_JOB.exists()
        )
        if opts.output != "table":
            # One line, so that a script reading the pipe of a running `up` can take it as it comes.
            payload = {
                "grpc": info.grpc_target,
                "etcd": info.etcd_endpoint,
                "metrics": info.metrics_url,
                "console": info.console_url,
                "state": str(info.state_dir),
                "tokens": {user: str(path) for user, path in sorted(info.token_files.items())},
                "next": hints,
            }
            click.echo(json.dumps(payload) if opts.output == "json" else structured(payload, "yaml"))
            sys.stdout.flush()
            return
        click.echo(
            f"gpufed is up: gRPC {info.grpc_target}, etcd {info.etcd_endpoint}, metrics {info.metrics_url}"
        )
        if info.console_url is not None:
            click.echo(f"console: {info.console_url}")
        click.echo(f"state: {info.state_dir}")
        for user, path in sorted(info.token_files.items()):
            click.echo(f"token for {user}: {path}")
        for line in hints:
            click.echo(line)
        sys.stdout.flush()

    try:
        # Only one gpufed up per state dir: the start clears what a crashed run left there.
        with hold_state_dir(Path(opts.state_dir)):
            asyncio.run(
                run_up(
                    opts.state_dir,
                    config_path=Path(config) if config else None,
                    grpc_port=port,
                    metrics_port=metrics_port,
                    on_ready=ready,
                    ports=LocalPorts(etcd_port, sim_port, _store_ports(store_ports)),
                )
            )
    except (StateDirBusy, EtcdStartFailed, SimStartFailed, SeaweedStartFailed, PortTaken) as e:
        raise click.ClickException(str(e)) from e


def _store_ports(given: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """`--store-port SERVER=PORT` values, refused by name when not of that form."""
    out = []
    for value in given:
        server, _, port = value.partition("=")
        if not server or not port.isdigit():
            raise click.BadParameter(
                f"{value!r}: expected SERVER=PORT, e.g. onprem=8333", param_hint="--store-port"
            )
        out.append((server, int(port)))
    return tuple(out)


@cli.command()
@click.option(
    "--etcd",
    "etcd_endpoint",
    required=True,
    help="etcd client endpoints, comma-separated host:port (every member of the cluster; https:// for TLS)",
)
@click.option(
    "--etcd-cacert",
    envvar="GPUFED_ETCD_CACERT",
    type=click.Path(exists=True, dir_okay=False),
    help="CA of the etcd members' certificates: talk TLS to etcd (GPUFED_ETCD_CACERT)",
)
@click.option(
    "--etcd-cert",
    envvar="GPUFED_ETCD_CERT",
    type=click.Path(exists=True, dir_okay=False),
    help="client certificate for etcd's --client-cert-auth (GPUFED_ETCD_CERT)",
)
@click.option(
    "--etcd-key",
    envvar="GPUFED_ETCD_KEY",
    type=click.Path(exists=True, dir_okay=False),
    help="private key of --etcd-cert (GPUFED_ETCD_KEY)",
)
@click.option("--port", default=50051, show_default=True)
# A pod's probes and Services reach it on the pod's address, not loopback (deploy/helm/gpufed).
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="address the gRPC and HTTP ports listen on (0.0.0.0: every interface, as in a pod)",
)
@click.option(
    "--metrics-port",
    default=None,
    type=int,
    help="HTTP port of the web console and Prometheus /metrics (HTTPS with --tls-cert)",
)
@click.option(
    "--bootstrap", "bootstrap_path", type=click.Path(exists=True, dir_okay=False), help="config to load first"
)
@click.option("--identity", default=None, help="name in the leader election (default: host-pid)")
@click.option(
    "--tls-cert", type=click.Path(exists=True, dir_okay=False), help="server certificate chain (PEM)"
)
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="server private key (PEM)")
@click.option(
    "--tls-client-ca",
    type=click.Path(exists=True, dir_okay=False),
    help="require client certificates signed by this CA (mutual TLS)",
)
@click.option(
    "--read-rate-per-s",
    type=float,
    default=None,
    help="lists, watches and job lookups that reach etcd each caller may make per second on this "
    "server; 0: no limit "
    "(default 100, burst 200)",
)
# etcd raises a shorter lease to its own minimum (2 s with its default election timeout). Tests that
# kill leaders shorten it, so that each takeover waits 2 s rather than 3.
@click.option(
    "--lease-ttl-s",
    type=click.IntRange(min=2),
    default=None,
    help="seconds the leader's etcd lease outlives its last refresh: how long a standby waits to "
    "take over from a leader that died (default 3)",
)
# The lease is refreshed from a thread of its own while the event loop runs a heartbeat within this
# limit (federation.scheduling.lease_keeper); a loop stalled longer gives the lease up.
@click.option(
    "--lease-stall-limit-s",
    type=click.FloatRange(min=2),
    default=None,
    help="seconds the leader's event loop may stall while its lease is still refreshed; a leader "
    "stalled longer gives the lease up to a standby (default 10, and at least --lease-ttl-s)",
)
@click.option(
    "--etcd-timeout-s",
    type=click.FloatRange(min=0.5, max=60),
    default=None,
    help="seconds each etcd member has to answer a call before the server tries the next: with a "
    "member gone, a call costs at most this much more (default 5)",
)
# Wait reasons compressed in etcd (10 KiB of JSON a queued job at 50 clusters, 460 bytes compressed):
# read by this release always, written only when asked, because the release before reads only JSON
# (docs/deploy.md, the read-ahead rule).
@click.option(
    "--compress-wait-reasons",
    is_flag=True,
    default=False,
    envvar="GPUFED_COMPRESS_WAIT_REASONS",
    help="write queued jobs' wait reasons zlib-compressed in etcd (a twentieth of the bytes); turn on "
    "once every server of the federation runs this release or later (GPUFED_COMPRESS_WAIT_REASONS)",
)
# Roles (federation/runtime/role.py): a split deployment runs `api` servers for the clients and
# `scheduler` servers for the leader's loops, so that planning a deep queue takes no API call's CPU.
@click.option(
    "--role",
    type=click.Choice([r.value for r in ServerRole]),
    default=ServerRole.ALL.value,
    show_default=True,
    envvar="GPUFED_SERVER_ROLE",
    help="all: serve the API and stand for leader (the scheduling cycle and reconcilers); api: serve "
    "the API and console only, never lead; scheduler: as all, for the leader candidates of a split "
    'deployment whose clients use the api servers (docs/deploy.md, "Splitting the API from the '
    'scheduler") (GPUFED_SERVER_ROLE)',
)
# More processes serving the API on the same port (federation/runtime/api_workers.py): one Python
# process's API is bound by one core (issue 33).
@click.option(
    "--api-workers",
    type=click.IntRange(min=0, max=64),
    default=0,
    show_default=True,
    envvar="GPUFED_API_WORKERS",
    help="start this many more processes that serve the gRPC API on the same port (role api; the kernel "
    "deals client connections among them), for more submissions and reads a second than one process's "
    "core carries; each holds its own job cache (GPUFED_API_WORKERS)",
)
@click.pass_obj
def serve(
    opts: _Opts,
    etcd_endpoint: str,
    etcd_cacert: str | None,
    etcd_cert: str | None,
    etcd_key: str | None,
    port: int,
    host: str,
    metrics_port: int | None,
    bootstrap_path: str | None,
    identity: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_client_ca: str | None,
    read_rate_per_s: float | None,
    lease_ttl_s: int | None,
    lease_stall_limit_s: float | None,
    etcd_timeout_s: float | None,
    role: str,
    compress_wait_reasons: bool,
    api_workers: int,
) -> None:
    """Run one server against an existing etcd (several may share one etcd)."""
    from federation.errors import InvalidSpec
    from federation.runtime.serve import TlsFiles, run_server
    from federation.scheduling.leader import DEFAULT_LEASE_TTL_S
    from federation.scheduling.lease_keeper import stall_limit_for
    from federation.store.kv_etcd_channel import EtcdTls

    if (etcd_cert is None) != (etcd_key is None):
        raise click.BadParameter("give both --etcd-cert and --etcd-key", param_hint="--etcd-cert")
    if etcd_cert is not None and etcd_cacert is None:
        raise click.BadParameter(
            "a client certificate for etcd needs its --etcd-cacert", param_hint="--etcd-cert"
        )
    etcd_tls = (
        EtcdTls(
            Path(etcd_cacert), Path(etcd_cert) if etcd_cert else None, Path(etcd_key) if etcd_key else None
        )
        if etcd_cacert
        else None
    )
    if (tls_cert is None) != (tls_key is None):
        raise click.BadParameter("give both --tls-cert and --tls-key", param_hint="--tls-cert")
    if tls_client_ca is not None and tls_cert is None:
        raise click.BadParameter(
            "mutual TLS needs the server's own --tls-cert and --tls-key", param_hint="--tls-client-ca"
        )
    try:
        # Refused here, before anything starts, by the rule the election itself keeps.
        stall_limit_for(lease_stall_limit_s, lease_ttl_s or DEFAULT_LEASE_TTL_S)
    except InvalidSpec as error:
        raise click.BadParameter(error.rule, param_hint="--lease-stall-limit-s") from error
    tls = (
        None
        if tls_cert is None or tls_key is None
        else TlsFiles(Path(tls_cert), Path(tls_key), Path(tls_client_ca) if tls_client_ca else None)
    )

    configure_logging()
    asyncio.run(
        run_server(
            etcd_endpoint,
            state_dir=opts.state_dir,
            port=port,
            host=host,
            metrics_port=metrics_port,
            bootstrap_path=Path(bootstrap_path) if bootstrap_path else None,
            identity=identity,
            tls=tls,
            read_rate_per_s=read_rate_per_s,
            etcd_tls=etcd_tls,
            lease_ttl_s=lease_ttl_s,
            lease_stall_limit_s=lease_stall_limit_s,
            etcd_timeout_s=etcd_timeout_s,
            role=ServerRole(role),
            compress_wait_reasons=compress_wait_reasons,
            api_workers=api_workers,
        )
    )


@cli.command()
@click.argument("file_arg", metavar="[FILE]", required=False, type=click.File("r"))
@click.option(
    "-f", "--file", "path", type=click.File("r"), help="TrainingJob or JobSet manifest ('-': stdin)"
)
@click.option("--idempotency-key", default=None, help="retry-safe key (default: a fresh UUID)")
@click.option(
    "--array",
    default="",
    help="run the job once per index (Slurm's --array): 0-199%20 is 200 copies, at most 20 at once",
)
@click.option(
    "--set", "set_name", default="", help="the job set's name (default: the manifest's metadata.name)"
)
@click.option("--max-parallel", type=int, default=0, help="a job set's most jobs at once (0: no limit)")
@click.pass_obj
@_rpc
def submit(
    opts: _Opts,
    file_arg: Any,
    path: Any,
    idempotency_key: str | None,
    array: str,
    set_name: str,
    max_parallel: int,
) -> None:
    """Submit a TrainingJob manifest, a JobSet, or an array of one job (FILE or -f FILE)."""
    source = path or file_arg
    if source is None:
        raise click.UsageError("give the manifest: gpufed submit FILE (or -f FILE; '-' reads stdin)")
    text = source.read()
    document = (
        cli_jobsets.load_document(text)
        if (array or set_name or "JobSet" in text or "Sweep" in text)
        else None
    )
    if array or set_name or cli_jobsets.is_job_set(document):
        if cli_jobsets.is_job_set(document):
            request = cli_jobsets.set_request(document, name=set_name, array=array, max_parallel=max_parallel)
        else:
            request = cli_jobsets.array_request(
                text, document, name=set_name, array=array, max_parallel=max_parallel
            )
        with opts.client() as client:
            set_reply = client.submit_set(
                request.name,
                request.manifests,
                array=request.array,
                max_parallel=request.max_parallel,
                sweep=request.sweep,
            )
        opts.emit(set_reply, cli_jobsets.submitted_text(set_reply))
        return
    with opts.client() as client:
        reply = client.submit(text, idempotency_key=idempotency_key or str(uuid.uuid4()))
    suffix = "" if reply.created else " (already submitted with this idempotency key)"
    opts.emit(reply, f"{reply.job_id} submitted{suffix}")


@cli.command()
@click.argument("job_id")
@click.pass_obj
@_rpc
def get(opts: _Opts, job_id: str) -> None:
    """Show one job."""
    with opts.client() as client:
        job = client.get(job_id)
    opts.emit(job, job_detail(job))


@cli.command(name="list")
@click.option("--tenant", default="", help="admins: one tenant (default all)")
@click.option("--phase", "phases", multiple=True, help="only these phases (repeatable)")
@click.option("--user", default="", help="only this user's jobs")
@click.option("--cluster", default="", help="only jobs placed on this cluster")
@click.option("--newest-first", is_flag=True, help="latest submission first (default: oldest first)")
@click.option("--all", "include_archived", is_flag=True, help="also ended jobs archived to SQL")
@click.option("--since", default="", help="only jobs submitted within this long: '30d', '12h', '1h30m'")
@click.option(
    "--set", "job_set", default="", help="only the jobs of this job set (its held ones are counted)"
)
@click.pass_obj
@_rpc
def list_jobs(
    opts: _Opts,
    tenant: str,
    phases: tuple[str, ...],
    user: str,
    cluster: str,
    newest_first: bool,
    include_archived: bool,
    since: str,
    job_set: str,
) -> None:
    """List jobs you may see (filtered and ordered by the server); --all adds archived ones."""
    try:
        wanted = [pb.JobPhase.Value("JOB_PHASE_" + p.upper()) for p in phases]
    except ValueError as error:
        raise click.BadParameter(f"unknown phase in {phases}", param_hint="--phase") from error
    since_s = time.time() - parse_since(since) if since else None
    with opts.client() as client:
        jobs = client.list_all(
            tenant=tenant,
            phases=wanted,
            user=user,
            cluster=cluster,
            newest_first=newest_first,
            include_archived=include_archived,
            since_s=since_s,
            job_set=job_set,
        )
        shown = jobs_table(jobs)
        if job_set:
            # Held members are no jobs yet: say how many wait behind the set's limit.
            held = sum(1 for m in client.get_set(job_set, tenant=tenant).members if m.held)
            shown += f"\n{held} more held by the set's limit (gpufed describe set {job_set})" if held else ""
    opts.emit(pb.ListJobsResponse(jobs=jobs), shown)


@cli.command()
@click.option("--tenant", default="", help="admins and infra: one tenant (default all)")
@click.pass_obj
@_rpc
def queues(opts: _Opts, tenant: str) -> None:
    """GPUs running, admitted and queued per tenant and GPU type (the console's queues figures)."""
    with opts.client() as client:
        reply = client.summarize(tenant=tenant)
    opts.emit(reply, summary_table(reply))


@cli.command()
@click.argument("job_id", required=False, default="")
@click.option("--tenant", default="")
@click.pass_obj
@_rpc
def watch(opts: _Opts, job_id: str, tenant: str) -> None:
    """Stream phase changes (of one job until it ends, or of every visible job)."""
    with opts.client() as client:
        for event in client.watch(job_id=job_id, tenant=tenant):
            j = event.job
            if opts.output == "table":
                where = f" on {j.cluster}" if j.cluster else ""
                phase = phase_name(j.phase) + (f" ({j.reason})" if j.reason else "")
                click.echo(f"{j.job_id}  {phase:<10} attempt {j.attempt}{where}  {j.message}".rstrip())
            elif opts.output == "json":
                # A stream: one JSON object per line (JSON Lines), each parseable as it arrives.
                click.echo(json.dumps(as_dict(j)))
            else:
                click.echo("---\n" + structured(as_dict(j), "yaml"))


@cli.command()
@click.argument("job_id")
@click.option("--reason", default="")
@click.pass_obj
@_rpc
def cancel(opts: _Opts, job_id: str, reason: str) -> None:
    """Cancel a job (its gang is stopped on its cluster)."""
    with opts.client() as client:
        job = client.cancel(job_id, reason=reason)
    opts.emit(job, f"{job.job_id} cancellation requested")


@cli.command()
@click.argument("job_id")
@click.pass_obj
@_rpc
def explain(opts: _Opts, job_id: str) -> None:
    """Say why a job waits (or where it runs)."""
    with opts.client() as client:
        reply = client.explain(job_id)
    opts.emit(reply, explain_text(reply))


@cli.command()
@click.pass_obj
@_rpc
def whoami(opts: _Opts) -> None:
    """Show the user, tenant and role of your token."""
    with opts.client() as client:
        me = client.whoami()
    opts.emit(me, f"{me.user} (tenant {me.tenant}, role {me.role})")


@cli.command()
@click.pass_obj
@_rpc
def clusters(opts: _Opts) -> None:
    """List member clusters with their pools, prices and free GPUs."""
    with opts.client() as client:
        reply = client.clusters()
    opts.emit(reply, clusters_table(reply))


@cli.command()
@click.pass_obj
def demo(opts: _Opts) -> None:
    """Start the embedded default, run jobs from two tenants through it, and stop."""
    from federation.cli.demo import run_demo

    if opts.output == "table":
        sys.exit(run_demo())
    # The walkthrough is for people: to stderr, leaving stdout to the one structured verdict.
    with contextlib.redirect_stdout(sys.stderr):
        code = run_demo()
    opts.emit({"passed": code == 0, "exit_code": code}, "")
    sys.exit(code)


cli_admin.register(cli, _rpc)
cli_admin_backup.register(cli)
cli_access.register(cli, _rpc)
cli_report.register(cli, _rpc)
cli_capacity.register(cli, _rpc)
cli_replay.register(cli)
cli_dataset.register(cli, _rpc)
cli_secrets.register(cli, _rpc)
cli_logs.register(cli, _rpc)
cli_cluster_join.register(cli, _rpc)
# After `logs`, whose `describe JOB_ID` it extends with `describe set NAME`.
cli_jobsets.register(cli, _rpc)
cli_sweeps.register(cli, _rpc)
# Last, so that every command registered above, from any module, takes `-o` after its name too.
accept_output_everywhere(cli)


def main() -> None:
    # Errors (a bad config or a component that would not start among them) are reported by
    # OutputGroup, in the format asked for, without a traceback.
    cli()
