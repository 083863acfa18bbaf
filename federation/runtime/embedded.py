"""The embedded all-in-one behind `gpufed up`: a local etcd, one server, simulated clusters, and the
local SeaweedFS servers behind the config's `seaweed:` object stores.

The simulated clusters (`backend: sim` in the config) run in a simulator process that serves the
Kubernetes API; the server reaches them through its kubeconfig, as it would real clusters.

Everything lives under one state directory (etcd's data, cluster journals, token files), so
stopping and starting again finds every accepted job where it was.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import structlog

from federation.runtime.bootstrap import bootstrap
from federation.runtime.config import load_config
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.seaweed import EmbeddedStores
from federation.runtime.server import FederationServer, ServerConfig
from federation.runtime.sim_process import SimProcess
from federation.store.job_store import KvStore
from federation.store.kv_etcd import EtcdKv

log = structlog.get_logger("gpufed.embedded")

ENDPOINT_FILE = "endpoint.json"
STOP_STACKS_AFTER_S = 20.0


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


def read_endpoint(state_dir: Path) -> dict[str, str]:
    """The running embedded server's addresses, as `gpufed up` wrote them."""
    data: dict[str, str] = json.loads((state_dir / ENDPOINT_FILE).read_text())
    return data


async def run_up(
    state_dir: Path,
    *,
    config_path: Path | None = None,
    grpc_port: int = 0,
    metrics_port: int | None = 0,
    on_ready: Callable[[EmbeddedInfo], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run until SIGINT/SIGTERM (or `stop` is set), then stop the server and etcd cleanly."""
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    # A SIGKILLed run leaves its addresses behind: no client may take them for this run's.
    (state_dir / ENDPOINT_FILE).unlink(missing_ok=True)
    config = load_config(config_path or default_config_path())
    sims = SimProcess(state_dir / "sim", config.simulated) if config.simulated else None
    if sims is not None:
        await asyncio.to_thread(sims.start)
        config = config.with_simulators_at(sims.kubeconfig)
        log.info("simulated_clusters_started", clusters=sorted(sims.endpoints), pid=sims.pid)
    # The config's `seaweed:` object stores: local SeaweedFS servers, so datasets really cross stores.
    stores = EmbeddedStores(state_dir, config.object_stores)
    etcd = EtcdProcess(state_dir / "etcd")
    try:
        if stores.needed:
            config = replace(config, object_stores=await asyncio.to_thread(stores.start))
        await asyncio.to_thread(etcd.start)
    except BaseException:
        await asyncio.to_thread(stores.stop)
        if sims is not None:
            await asyncio.to_thread(sims.stop)
        raise
    endpoint_file = state_dir / ENDPOINT_FILE
    try:
        kv = await EtcdKv.connect(etcd.endpoint)
        try:
            tokens = await bootstrap(KvStore(kv), config, state_dir / "tokens")
        finally:
            await kv.close()
        server = FederationServer(
            ServerConfig(
                etcd_endpoint=etcd.endpoint,
                state_dir=state_dir,
                grpc_port=grpc_port,
                metrics_port=metrics_port,
                identity="embedded",
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
            endpoint_file.write_text(
                json.dumps(
                    {
                        "grpc": info.grpc_target,
                        "etcd": info.etcd_endpoint,
                        "metrics": metrics_url or "",
                        "console": info.console_url or "",
                    },
                    indent=2,
                )
            )
            if on_ready is not None:
                on_ready(info)
            stop = stop or asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
            log.info("embedded_stopping")
            # Every stop step is bounded, so a stop that still takes this long is a bug: leave the
            # stacks of every thread on stderr to say where it hangs.
            faulthandler.dump_traceback_later(STOP_STACKS_AFTER_S, exit=False)
        finally:
            await server.stop()
    finally:
        endpoint_file.unlink(missing_ok=True)
        await asyncio.to_thread(etcd.stop)
        await asyncio.to_thread(stores.stop)
        if sims is not None:
            await asyncio.to_thread(sims.stop)
        faulthandler.cancel_dump_traceback_later()
