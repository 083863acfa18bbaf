"""The embedded all-in-one behind `gpufed up`: a local etcd, one server, simulated clusters, and the
local SeaweedFS servers behind the config's `seaweed:` object stores.

The simulated clusters (`backend: sim` in the config) run in a simulator process that serves the
Kubernetes API; the server reaches them through its kubeconfig, as it would real clusters.

Everything lives under one state directory (etcd's data, cluster journals, token files), so
stopping and starting again finds every accepted job where it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import json
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import structlog

from clusters.files import write_atomically
from federation.api.datasets import outputs_controller_running
from federation.api.jobsets import set_controller_running
from federation.datasets.fence import FENCES
from federation.datasets.stores import StoreRecord
from federation.runtime.bootstrap import bootstrap
from federation.runtime.config import load_config
from federation.runtime.endpoint import ENDPOINT_FILE, read_endpoint
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.local_ports import LocalPorts
from federation.runtime.seaweed import EmbeddedStores
from federation.runtime.server import FederationServer, ServerConfig
from federation.runtime.sim_process import SimExited, SimProcess
from federation.secrets.keyfile import FILE_NAME as SECRETS_KEY_FILE
from federation.secrets.keyfile import create_key_file
from federation.store.job_store import LEADER_KEY, KvStore
from federation.store.kv import KeyValueStore, LeaseNotFound
from federation.store.kv_etcd import EtcdKv

log = structlog.get_logger("gpufed.embedded")

# The endpoint file's name and reader live in `federation.runtime.endpoint` (light to import, for the
# CLI); kept importable from here.
__all__ = ["ENDPOINT_FILE", "EmbeddedInfo", "LocalPorts", "default_config_path", "read_endpoint", "run_up"]

STOP_STACKS_AFTER_S = 20.0
# How often `gpufed up` looks whether the simulator still runs.
SIM_WATCH_S = 0.5
# The embedded server's identity: the leader key names it while it leads.
EMBEDDED_IDENTITY = "embedded"


def default_config_path() -> Path:
    return Path(str(resources.files("federation") / "defaults" / "federation.yaml"))


@dataclass(frozen=True, slots=True)
class EmbeddedInfo:
    state_dir: Path
    grpc_target: str
    etcd_endpoint: str
    metrics_url: str | None
    # The web console, on the same port as /metrics.
    console_url: str | None
    token_files: dict[str, Path]


async def run_up(
    state_dir: Path,
    *,
    config_path: Path | None = None,
    grpc_port: int = 0,
    metrics_port: int | None = 0,
    on_ready: Callable[[EmbeddedInfo], None] | None = None,
    stop: asyncio.Event | None = None,
    ports: LocalPorts | None = None,
) -> None:
    """Run until SIGINT/SIGTERM (or `stop` is set), then stop the server and etcd cleanly.

    `ports`: the local services' ports as chosen (`gpufed up --etcd-port/--sim-port/--store-port`);
    one that is taken is refused, naming it, before anything starts."""
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    # A SIGKILLed run leaves its addresses behind: no client may take them for this run's.
    (state_dir / ENDPOINT_FILE).unlink(missing_ok=True)
    # The key that seals tenants' secrets, made once (mode 0600) and kept beside etcd's data, never in it.
    create_key_file(state_dir / SECRETS_KEY_FILE)
    config = load_config(config_path or default_config_path())
    ports = ports or LocalPorts()
    sims = SimProcess(state_dir / "sim", config.simulated, port=ports.sim_port) if config.simulated else None
    # The config's `seaweed:` object stores: local SeaweedFS servers, so datasets really cross stores.
    stores = EmbeddedStores(state_dir, config.object_stores, s3_ports=dict(ports.store_ports))
    ports.check(simulated=len(config.simulated), seaweed=stores.servers)
    etcd = EtcdProcess(state_dir / "etcd", client_port=ports.etcd_port)
    try:
        store_records = await _start_children(sims, stores, etcd)
    except BaseException:
        await _stop_children(sims, stores, etcd)
        raise
    if sims is not None:
        config = config.with_simulators_at(sims.kubeconfig)
    if store_records is not None:
        config = replace(config, object_stores=store_records)
    endpoint_file = state_dir / ENDPOINT_FILE
    died: SimExited | None = None
    try:
        kv = await EtcdKv.connect(etcd.endpoint)
        try:
            await release_leases_of_a_dead_run(kv)
            tokens = await bootstrap(KvStore(kv), config, state_dir / "tokens")
        finally:
            await kv.close()
        server = FederationServer(
            ServerConfig(
                etcd_endpoint=etcd.endpoint,
                state_dir=state_dir,
                grpc_port=grpc_port,
                metrics_port=metrics_port,
                identity=EMBEDDED_IDENTITY,
                # SQLite under the state dir unless the config names a database.
                history=config.history,
            )
        )
        await server.start()
        try:
            metrics_url = (
                f"http://127.0.0.1:{server.metrics_port}/metrics" if server.metrics_port is not None else None
            )
            info = EmbeddedInfo(
                state_dir=state_dir,
                grpc_target=f"127.0.0.1:{server.port}",
                etcd_endpoint=etcd.endpoint,
                metrics_url=metrics_url,
                console_url=server.console_url,
                token_files=tokens,
            )
            write_atomically(
                endpoint_file,
                json.dumps(
                    {
                        "grpc": info.grpc_target,
                        "etcd": info.etcd_endpoint,
                        "metrics": metrics_url or "",
                        "console": info.console_url or "",
                    },
                    indent=2,
                ),
            )
            if on_ready is not None:
                on_ready(info)
            stop = stop or asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            # Job sets, and outputs that become dataset versions (issue 34).
            async with set_controller_running(server.servicers), outputs_controller_running(server.servicers):
                died = await _until_stopped_or_sim_died(stop, sims)
            log.info("embedded_stopping")
            # Every stop step is bounded, so a stop that still takes this long is a bug: leave the
            # stacks of every thread on stderr to say where it hangs.
            faulthandler.dump_traceback_later(STOP_STACKS_AFTER_S, exit=False)
        finally:
            await server.stop()
    finally:
        endpoint_file.unlink(missing_ok=True)
        await _stop_children(sims, stores, etcd)
        faulthandler.cancel_dump_traceback_later()
    if died is not None:
        raise died


async def _until_stopped_or_sim_died(stop: asyncio.Event, sims: SimProcess | None) -> SimExited | None:
    """Wait for `stop`; when the simulator dies first, say why (None: stopped as asked). Running on
    with it dead would leave every watch failing and every gang unreachable."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=SIM_WATCH_S)
        if stop.is_set():
            return None
        died = None if sims is None else sims.exited()
        if died is not None:
            log.error("simulator_died", error=str(died).splitlines()[0])
            return died


async def release_leases_of_a_dead_run(kv: KeyValueStore) -> list[int]:
    """Revoke the leases a crashed run of this state dir left in its etcd: its leadership (held under
    the embedded server's identity) and its copy fences. Returns the leases revoked.

    `gpufed up` holds the state dir's lock (`state_lock.hold_state_dir`), so the run that took them
    is dead, and waiting out their TTLs only delays this one: 5 s before it may lead, and a copy
    its sync was writing stays fenced for `datasync.fenceTtlSeconds` (30 s by default) before the
    sync resumes. A fence revoked under a holder that is somehow alive (a server someone attached to
    this etcd by hand) costs it nothing but work: every write that concludes a copy compares the
    fence's value, so a holder that lost its fence records nothing."""
    revoked: list[int] = []
    leader = await kv.get(LEADER_KEY)
    held = [leader] if leader is not None and leader.value == EMBEDDED_IDENTITY.encode() else []
    held += (await kv.range_prefix(FENCES)).kvs
    for entry in held:
        if entry.lease and entry.lease not in revoked:
            with contextlib.suppress(LeaseNotFound):  # it ran out meanwhile
                await kv.revoke_lease(entry.lease)
            revoked.append(entry.lease)
    if revoked:
        log.info("dead_run_leases_revoked", leases=len(revoked))
    return revoked


async def _start_children(
    sims: SimProcess | None, stores: EmbeddedStores, etcd: EtcdProcess
) -> tuple[StoreRecord, ...] | None:
    """Start the simulator, the object stores and etcd side by side: none needs another, and one after
    the other they were most of `gpufed up`'s start (about 6 of 10 s on a busy 2-core machine). Returns
    the store records pointing at the started stores (None: the config names no `seaweed:` store).

    Every start runs to its end before this returns or raises, so that a stop that follows a failure
    finds no start still under way; the first failure (in the order sims, stores, etcd) is raised."""

    async def start_sims() -> None:
        if sims is not None:
            await asyncio.to_thread(sims.start)
            log.info("simulated_clusters_started", clusters=sorted(sims.endpoints), pid=sims.pid)

    async def start_stores() -> tuple[StoreRecord, ...] | None:
        return await stores.start() if stores.needed else None

    outcomes = await asyncio.gather(
        start_sims(), start_stores(), asyncio.to_thread(etcd.start), return_exceptions=True
    )
    _raise_first_failure(outcomes)
    records = outcomes[1]
    assert not isinstance(records, BaseException)
    return records


async def _stop_children(sims: SimProcess | None, stores: EmbeddedStores, etcd: EtcdProcess) -> None:
    """Stop etcd, the object stores and the simulator side by side (each is safe to stop when it never
    started): SeaweedFS alone takes about 2 s to shut down, and the server that used them all has
    stopped already. Every stop runs to its end; the first failure is raised after."""
    outcomes = await asyncio.gather(
        asyncio.to_thread(etcd.stop),
        asyncio.to_thread(stores.stop),
        *([asyncio.to_thread(sims.stop)] if sims is not None else []),
        return_exceptions=True,
    )
    _raise_first_failure(outcomes)


def _raise_first_failure(outcomes: Sequence[object]) -> None:
    """Raise the first exception among `asyncio.gather(..., return_exceptions=True)`'s outcomes."""
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
