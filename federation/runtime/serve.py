"""`gpufed serve`: one server process on an existing etcd, until SIGINT/SIGTERM.

The etcd may be a cluster (its members' endpoints, comma-separated) serving TLS with client
certificates: the files are put in this process's environment (GPUFED_ETCD_CACERT/_CERT/_KEY), where
every etcd client of the process (bootstrap, the server, its leader election) reads them.

`role` (`--role`, federation.runtime.role) says whether the process stands for leader and runs the
job sets' and outputs' controllers (`all`, `scheduler`) or only serves the API (`api`). With
`api_workers` (`--api-workers N`), N more `api` processes serve the API on the same port
(federation.runtime.api_workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from federation.api.datasets import outputs_controller_running
from federation.api.jobsets import set_controller_running
from federation.errors import InvalidSpec
from federation.history.config import HistorySettings, resolve_dsn
from federation.runtime.api_workers import ApiWorkers, check_worker_count
from federation.runtime.bootstrap import bootstrap
from federation.runtime.config import load_config
from federation.runtime.role import ServerRole
from federation.runtime.server import DEFAULT_ETCD_TIMEOUT_S, FederationServer, ServerConfig
from federation.store.job_store import KvStore
from federation.store.kv_etcd import EtcdKv
from federation.store.kv_etcd_channel import CACERT_ENV, CERT_ENV, KEY_ENV, EtcdTls

log = structlog.get_logger("gpufed.serve")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None


async def run_server(
    etcd_endpoint: str,
    *,
    state_dir: Path,
    port: int,
    metrics_port: int | None,
    bootstrap_path: Path | None,
    identity: str | None,
    tls: TlsFiles | None = None,
    read_rate_per_s: float | None = None,
    etcd_tls: EtcdTls | None = None,
    lease_ttl_s: int | None = None,
    lease_stall_limit_s: float | None = None,
    compress_wait_reasons: bool = False,
    etcd_timeout_s: float | None = None,
    host: str = "127.0.0.1",
    role: ServerRole = ServerRole.ALL,
    api_workers: int = 0,
) -> None:
    check_worker_count(api_workers)
    state_dir.mkdir(parents=True, exist_ok=True)
    if etcd_tls is not None:
        for name, path in ((CACERT_ENV, etcd_tls.ca), (CERT_ENV, etcd_tls.cert), (KEY_ENV, etcd_tls.key)):
            if path is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = str(path.resolve())
    if bootstrap_path is not None:
        federation_config = load_config(bootstrap_path)
        if federation_config.simulated:
            names = ", ".join(str(c.get("name")) for c in federation_config.simulated)
            raise InvalidSpec(
                "clusters[].backend",
                f"sim clusters ({names}) run only under `gpufed up`; for `gpufed serve`, start "
                "`python -m clusters.sim --kubeconfig FILE` yourself and name the clusters "
                "`backend: kubernetes` with that kubeconfig",
            )
        embedded_stores = [s.name for s in federation_config.object_stores if s.seaweed]
        if embedded_stores:
            # Without the SeaweedFS `gpufed up` starts, such a store has no endpoint: refuse rather
            # than let its client fall back to AWS's.
            raise InvalidSpec(
                "objectStores.seaweed",
                f"stores {', '.join(embedded_stores)} are served by `gpufed up` only; give them an endpoint",
            )
        kv = await EtcdKv.connect(etcd_endpoint, timeout_s=etcd_timeout_s or DEFAULT_ETCD_TIMEOUT_S)
        try:
            await bootstrap(KvStore(kv), federation_config, state_dir / "tokens")
        finally:
            await kv.close()
    config = ServerConfig(
        etcd_endpoint=etcd_endpoint,
        state_dir=state_dir,
        grpc_host=host,
        grpc_port=port,
        metrics_port=metrics_port,
        role=role,
        # The server and its API workers share the port (federation.runtime.api_workers).
        grpc_reuse_port=api_workers > 0,
    )
    if bootstrap_path is not None:
        # The history database and the archiver's knobs come from the config's `history:`.
        config = replace(config, history=federation_config.history)
    if identity:
        config = replace(config, identity=identity)
    if read_rate_per_s is not None:
        config = replace(config, read_rate_per_s=read_rate_per_s)
    if lease_ttl_s is not None:
        config = replace(config, lease_ttl_s=lease_ttl_s)
    if lease_stall_limit_s is not None:
        config = replace(config, lease_stall_limit_s=lease_stall_limit_s)
    if compress_wait_reasons:
        config = replace(config, compress_wait_reasons=True)
    if etcd_timeout_s is not None:
        config = replace(config, etcd_timeout_s=etcd_timeout_s)
    if tls is not None:
        config = replace(config, tls_cert=tls.cert, tls_key=tls.key, tls_client_ca=tls.client_ca)
    if role is ServerRole.API and _local_history(config.history, state_dir):
        # Not refused (its reads of live jobs are right), but said at start: no leader archives
        # into this server's own SQLite file, so its archived jobs and reports would be empty
        # while the scheduler's servers archive into theirs.
        log.warning(
            "api_server_reads_a_local_history",
            why="an api server never archives, so it sees only what the leaders archive into the "
            "same database: give it the scheduler servers' PostgreSQL history (history.dsn or dsnEnv)",
        )
    server = FederationServer(config)
    await server.start()
    # On the port the server bound (the one asked for, or the one it was given for port 0).
    workers = ApiWorkers(config, server.port, api_workers)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        workers.start()
        async with _controllers(server, role):
            await stop.wait()
    finally:
        # The workers first: their clients move to the server's own process until it stops too.
        await workers.stop()
        await server.stop()


def _local_history(settings: HistorySettings, state_dir: Path) -> bool:
    """Whether the history is SQLite (a file under this process's state dir unless told otherwise)."""
    try:
        return resolve_dsn(settings, state_dir).startswith("sqlite")
    except InvalidSpec:
        return False  # the server's start says what is wrong with it


@contextlib.asynccontextmanager
async def _controllers(server: FederationServer, role: ServerRole) -> AsyncIterator[None]:
    """Job sets' releases and outputs' registration (issue 34), beside the server's own loops, on
    every server that may lead; an `api` server leaves them to those (they walk every live job)."""
    if not role.runs_controllers:
        yield
        return
    async with set_controller_running(server.servicers), outputs_controller_running(server.servicers):
        yield
