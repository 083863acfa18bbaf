"""`SimCluster`: one simulated Kubernetes cluster on a loopback port, for tests and the embedded default.

    async with SimCluster(config) as sim:
        sim.kubeconfig(path)            # then the python client or kubectl, unchanged
        sim.faults.lose_node(...)       # hurt it on purpose

It owns the engine's control loop task and the aiohttp site, and stops both cleanly (open watches
end first, so clients see their streams close rather than hang).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog
import yaml
from aiohttp import web

from clusters.sim import persist, tls
from clusters.sim.clock import Clock
from clusters.sim.config import SimClusterConfig
from clusters.sim.engine import Engine
from clusters.sim.faults import Faults
from clusters.sim.resources import PODS
from clusters.sim.server import ApiServer

Obj = dict[str, Any]
log = structlog.get_logger("gpufed.clusters.sim")


class SimCluster:
    def __init__(
        self,
        config: SimClusterConfig,
        *,
        clock: Clock | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        state_dir: Path | None = None,
        snapshot_interval_s: float = persist.SNAPSHOT_INTERVAL_S,
    ) -> None:
        """With `state_dir`, the cluster goes on from its snapshot there (if any) and keeps it up to
        date (`clusters.sim.persist`): a restarted simulator finds its pods where they were."""
        self.config = config
        restored = None
        self._snapshots: persist.SnapshotWriter | None = None
        if state_dir is not None:
            path = persist.snapshot_path(state_dir, config.name)
            try:
                restored = persist.load(path, config.name)
            except persist.SnapshotError as e:
                log.warning("sim_snapshot_unreadable", cluster=config.name, error=str(e))
        self.restored = restored is not None
        self.engine = Engine(config, clock, restored)
        if state_dir is not None:
            self._snapshots = persist.SnapshotWriter(
                persist.snapshot_path(state_dir, config.name),
                config.name,
                self.engine.store,
                self.engine.clock.wall_s,
                snapshot_interval_s,
            )
        self.faults = Faults(self.engine)
        self._host = host
        self._port = port
        self._server = ApiServer(self.engine, self.faults, config.token, self.describe)
        self._runner: web.AppRunner | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._url: str | None = None
        self._cert: tls.ServingCert | None = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("the simulated cluster is not started")
        return self._url

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self.engine.run(), name=f"sim-{self.name}")
        if self._snapshots is not None:
            self._snapshots.start()
        self._runner = web.AppRunner(self._server.app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        if self.config.tls and self._cert is None:
            self._cert = await asyncio.to_thread(tls.self_signed, self._host)
        context = self._cert.context() if self._cert is not None else None
        site = web.TCPSite(self._runner, self._host, self._port, reuse_address=True, ssl_context=context)
        await site.start()
        port = self._runner.addresses[0][1]
        self._url = f"{'https' if context else 'http'}://{self._host}:{port}"
        log.info("sim_cluster_started", cluster=self.name, url=self._url)

    async def stop(self) -> None:
        self._server.close_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        self.engine.kubelet.close()  # process mode's processes end with their cluster
        if self._snapshots is not None:
            # After the loop: what the cluster did last is in the snapshot the next start reads.
            await self._snapshots.stop()
        if self._cert is not None:
            self._cert.remove()
            self._cert = None
        log.info("sim_cluster_stopped", cluster=self.name)

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def kubeconfig_dict(self) -> Obj:
        """A kubeconfig with one cluster, user and context, all named after the cluster."""
        user: Obj = {"token": self.config.token} if self.config.token else {}
        cluster: Obj = {"server": self.url}
        if self._cert is not None:
            cluster["certificate-authority-data"] = base64.b64encode(self._cert.cert_pem).decode()
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": self.name, "cluster": cluster}],
            "users": [{"name": self.name, "user": user}],
            "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": self.name}}],
            "current-context": self.name,
            "preferences": {},
        }

    def kubeconfig(self, path: str | Path) -> Path:
        target = Path(path)
        target.write_text(yaml.safe_dump(self.kubeconfig_dict(), sort_keys=False))
        return target

    def describe(self) -> Obj:
        """The cluster as the admin endpoint and ready file report it."""
        return {
            "name": self.name,
            "url": self._url,
            "unreachable": self.faults.unreachable.value if self.faults.unreachable else None,
            "latency_s": self.faults.latency_s,
            "resource_version": self.engine.store.resource_version,
            "pods": self.engine.store.count(PODS),
            "free_gpus": self.engine.scheduler.free_gpus(),
            "pools": [p.name for p in self.config.pools],
        }
