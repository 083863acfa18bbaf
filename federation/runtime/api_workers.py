"""`gpufed serve --api-workers N`: the gRPC API served by N more processes on the server's own port.

A server is one Python process, and one process's API is bound by one core: a submission costs
0.85 to 1.4 ms of the server's CPU (gRPC's asyncio server alone about 0.3 ms of it), so one process
carries 700 to 1,200 submissions a second whatever etcd could take (issue 33, docs/architecture.md
"What bounds submissions"). Workers are the same `api` servers a split deployment runs
(federation.runtime.role), started and watched by the server and bound to its port with
SO_REUSEPORT, so that the kernel deals each new client connection to one of the processes. Each
worker has its own job cache, authentication and rate limiters, and reads and writes the same etcd:
a submission is durable before its reply whichever process took it, and a tenant sees only its own
jobs through any of them (the same servicers, the same checks).

What it costs: each worker holds its own job cache, so the federation's jobs are in memory once per
process (about 340 MiB per 100,000 live jobs, bench/scale_depth.py), and each follows etcd's watch
of every job. A client's HTTP/2 connection stays on the process that accepted it, so one client
with one channel is served by one process; many clients (or channels) spread across them. A
tenant's submission rate limit is per process, so with N workers a tenant may submit up to N+1 times
its rate (as with N+1 `api` servers behind a Service). The workers serve no HTTP port: the console,
`/metrics` and `/readyz` stay the server's own.

A worker that dies is started again after a pause (doubled while it keeps dying, at most
`RESTART_MAX_S`); a worker whose server is SIGKILLed is killed by the kernel (PR_SET_PDEATHSIG), so
none keeps serving on the port without the server that watches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace

import structlog

from datasync.child_guard import die_with_parent
from federation.errors import InvalidSpec
from federation.history.config import HistorySettings, resolve_dsn
from federation.runtime.role import ServerRole
from federation.runtime.server import FederationServer, ServerConfig
from federation.secrets.keyfile import ENV_VAR as SECRETS_KEY_ENV
from federation.secrets.keyfile import FILE_NAME as SECRETS_KEY_FILE

log = structlog.get_logger("gpufed.api_workers")

# A machine has few cores; more workers than this only add caches and contention.
MAX_API_WORKERS = 64
# A worker that exits is started again after this pause, doubled while it keeps dying young.
RESTART_MIN_S = 1.0
RESTART_MAX_S = 30.0
# A worker that ran this long before it died is started again after the shortest pause.
HEALTHY_RUN_S = 60.0
STOP_WAIT_S = 15.0
_POLL_S = 0.5
WORKERS_DIR = "api-workers"
_CONFIG_FILE = "config.pickle"


def check_worker_count(count: int) -> int:
    if not 0 <= count <= MAX_API_WORKERS:
        raise InvalidSpec("--api-workers", f"must be 0 to {MAX_API_WORKERS}, got {count}")
    return count


def worker_config(server: ServerConfig, port: int, index: int) -> ServerConfig:
    """What worker `index` of a server runs: an `api` server on the server's bound `port`, with a
    state directory of its own (its clusters' journals and data-sync journal are per process) but
    the server's secrets key and history database, so that it reads what the leaders archive."""
    key_file = server.secrets_key_file
    if key_file is None and not os.environ.get(SECRETS_KEY_ENV):
        own = server.state_dir / SECRETS_KEY_FILE
        key_file = own.resolve() if own.exists() else None
    history: HistorySettings = server.history
    if history.dsn is None and history.dsn_env is None:
        history = replace(history, dsn=resolve_dsn(history, server.state_dir.resolve()))
    return replace(
        server,
        role=ServerRole.API,
        grpc_port=port,
        grpc_reuse_port=True,
        metrics_port=None,
        identity=f"{server.identity}-api{index}",
        state_dir=server.state_dir.resolve() / WORKERS_DIR / str(index),
        secrets_key_file=key_file,
        history=history,
    )


@dataclass(slots=True)
class _Worker:
    index: int
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    pause_s: float = RESTART_MIN_S
    restart_at: float | None = None


class ApiWorkers:
    """N `api` processes on a server's port, started, restarted when they die, and stopped with it."""

    def __init__(self, server: ServerConfig, port: int, count: int) -> None:
        self._count = check_worker_count(count)
        self._dir = server.state_dir.resolve() / WORKERS_DIR
        self._configs = [worker_config(server, port, i) for i in range(count)]
        self._workers = [_Worker(i) for i in range(count)]
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def pids(self) -> list[int]:
        """The running workers' process ids (for tests and the bench's CPU accounting)."""
        return [w.process.pid for w in self._workers if w.process is not None and w.process.poll() is None]

    def start(self) -> None:
        """Spawned from the event loop's thread: the kernel's parent-death signal follows the thread
        that forked, and this one lives as long as the server."""
        if not self._count:
            return
        self._dir.mkdir(parents=True, exist_ok=True)
        for worker, config in zip(self._workers, self._configs, strict=True):
            config.state_dir.mkdir(parents=True, exist_ok=True)
            # The config may hold a history DSN with its password: readable by this user only.
            path = config.state_dir / _CONFIG_FILE
            path.unlink(missing_ok=True)  # made again, so that an older file's mode is not kept
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                pickle.dump(config, out)
            self._spawn(worker, time.monotonic())
        self._watch = asyncio.get_running_loop().create_task(self._watch_workers(), name="gpufed-api-workers")
        log.info("api_workers_started", count=self._count, pids=self.pids)

    def _spawn(self, worker: _Worker, now: float) -> None:
        config = self._configs[worker.index]
        command = [
            sys.executable,
            "-m",
            "federation.runtime.api_workers",
            str(config.state_dir / _CONFIG_FILE),
        ]
        # The worker logs to the server's own stderr, each line naming it (`api_worker`): in a pod
        # that is what `kubectl logs` reads, and a file under the state dir would grow unbounded.
        worker.process = subprocess.Popen(die_with_parent(command), stdin=subprocess.DEVNULL)
        worker.started_at = now
        worker.restart_at = None

    async def _watch_workers(self) -> None:
        while not self._stopping:
            self._tend(time.monotonic())
            await asyncio.sleep(_POLL_S)

    def _tend(self, now: float) -> None:
        """One look at the workers: one that exited is given its restart time, one whose time has
        come is started again. The pause is RESTART_MIN_S after a worker that ran HEALTHY_RUN_S,
        else the last pause doubled (at most RESTART_MAX_S): a worker that cannot start (a bad
        certificate, etcd gone) is not restarted in a tight loop."""
        for worker in self._workers:
            if worker.restart_at is not None:
                if now >= worker.restart_at:
                    self._spawn(worker, now)
                    pid = None if worker.process is None else worker.process.pid
                    log.info("api_worker_restarted", index=worker.index, pid=pid)
                continue
            process = worker.process
            if process is None or process.poll() is None:
                continue
            ran_s = now - worker.started_at
            if ran_s >= HEALTHY_RUN_S:
                worker.pause_s = RESTART_MIN_S
            worker.restart_at = now + worker.pause_s
            log.warning(
                "api_worker_exited",
                index=worker.index,
                pid=process.pid,
                code=process.returncode,
                ran_s=round(ran_s, 1),
                restart_in_s=worker.pause_s,
            )
            worker.pause_s = min(RESTART_MAX_S, worker.pause_s * 2)

    async def stop(self) -> None:
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        running = [w.process for w in self._workers if w.process is not None and w.process.poll() is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        for process in running:
            try:
                await asyncio.to_thread(process.wait, STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                log.warning(
                    "api_worker_killed", pid=process.pid, why=f"still running {STOP_WAIT_S} s after SIGTERM"
                )
                process.kill()
                await asyncio.to_thread(process.wait)


async def _serve_worker(config: ServerConfig) -> None:
    server = FederationServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("api_worker_serving", port=server.port, pid=os.getpid())
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str]) -> int:
    from federation.logs import configure_logging

    configure_logging()
    (config_path,) = argv
    with open(config_path, "rb") as source:
        config = pickle.load(source)  # written by our own server, mode 0600
    if not isinstance(config, ServerConfig):
        raise SystemExit(f"{config_path}: not a server config")
    # Its lines share the server's stderr: each says which process wrote it.
    structlog.contextvars.bind_contextvars(api_worker=config.identity)
    asyncio.run(_serve_worker(config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
