"""Processes for end-to-end tests: a real etcd and `gpufed serve` as its own OS process.

The server runs as a subprocess so that tests can SIGKILL it like a crash would, and talk to it only
through the gRPC client, as users do.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import BinaryIO, Literal, Protocol, TypeVar

from datasync.loopback_ports import free_port
from federation.api.client import GpufedClient, TlsClient, wait_until_serving
from federation.history.engine import DEFAULT_FILE, default_dsn, migrate, open_engine
from tests.e2e import zygote

CONFIG = Path(__file__).with_name("federation.yaml")


# Servers started side by side (tests/e2e/test_crash_ha.py) seed from threads: Alembic's context is
# one per process, and two first migrations at once failed ("table history_jobs already exists").
_TEMPLATE_LOCK = threading.Lock()


def _migrated_history() -> Path:
    with _TEMPLATE_LOCK:
        made = _make_migrated_history()
        if not made.exists():
            # Removed under the running worker: the template lives in the shared temporary
            # directory, and a script that cleared /tmp/gpufed-history-template-* before its own run
            # failed eight tests of a run beside it at setup. Made again, as on first use.
            _make_migrated_history.cache_clear()
            made = _make_migrated_history()
        return made


@functools.cache
def _make_migrated_history() -> Path:
    """A SQLite history database at the newest revision, made once per test process."""
    directory = Path(tempfile.mkdtemp(prefix="gpufed-history-template-"))
    atexit.register(shutil.rmtree, directory, True)
    engine = open_engine(default_dsn(directory))
    migrate(engine)
    engine.dispose()
    return directory / DEFAULT_FILE


def seed_history(state_dir: Path) -> None:
    """Give a fresh state dir the history database a first start would create. Migrating a new
    database (Alembic's import and four revisions) is 0.45 s of a server start's CPU, and the suite
    starts a few hundred servers on fresh state dirs; migration itself is tested in
    tests/unit/test_history_migrations.py, and `gpufed up` in the e2e tests still starts on an empty
    one. A server given a database that names PostgreSQL never opens this file."""
    target = state_dir / DEFAULT_FILE
    if not target.exists():
        shutil.copyfile(_migrated_history(), target)


def manifest(
    name: str = "train",
    *,
    workers: int = 1,
    gpus: int = 1,
    gpu: str = "A100",
    duration: str = "1s",
    tenant: str | None = None,
    extra_spec: str = "",
) -> str:
    tenant_line = f"  tenant: {tenant}\n" if tenant else ""
    return (
        "apiVersion: gpufed.io/v1\nkind: TrainingJob\n"
        f'metadata:\n  name: {name}\n  annotations:\n    sim.gpufed.io/duration: "{duration}"\n'
        f"spec:\n{tenant_line}  gpuTypes: [{gpu}]\n{extra_spec}"
        "  tasks:\n"
        f'    - {{name: master, replicas: 1, image: "pytorch/pytorch:2.3", gpus: {gpus}}}\n'
        f'    - {{name: worker, replicas: {workers}, image: "pytorch/pytorch:2.3", gpus: {gpus}}}\n'
    )


class ServerProcess:
    """`python -m federation serve` on a given etcd and state dir; restartable on the same state.
    Forked from the test process's zygote (tests/e2e/zygote.py), which has imported gpufed already;
    GPUFED_TEST_ZYGOTE=0 starts a fresh interpreter instead."""

    def __init__(
        self,
        etcd_endpoint: str,
        state_dir: Path,
        *,
        config: Path = CONFIG,
        identity: str = "e2e",
        extra_args: tuple[str, ...] = (),
        tls: TlsClient | None = None,
    ) -> None:
        self.extra_args = extra_args
        self.tls = tls
        self.etcd_endpoint = etcd_endpoint
        self.state_dir = state_dir
        self.config = config
        self.identity = identity
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | zygote.ZygoteChild | None = None
        self.starts = 0
        self._log: BinaryIO | None = None
        # Clients kept open for polling (`reader`), by user and the token they were made with.
        self._readers: dict[str, tuple[str, GpufedClient]] = {}

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self._close_readers()  # their channels may be backing off from the server that went away
        self.starts += 1
        self.state_dir.mkdir(parents=True, exist_ok=True)
        seed_history(self.state_dir)
        self._close_log()
        log_path = self._log_path()
        argv = [
            sys.executable,
            "-m",
            "federation",
            "--state-dir",
            str(self.state_dir),
            "serve",
            "--etcd",
            self.etcd_endpoint,
            "--port",
            str(self.port),
            "--bootstrap",
            str(self.config),
            "--identity",
            f"{self.identity}-{self.starts}",
            *self.extra_args,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if zygote.enabled():
            self.proc = zygote.Zygote.shared().spawn(argv, env, log_path)
        else:
            self._log = log = log_path.open("wb")
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_serving(timeout_s=90)
        except Exception:
            self.stop()
            raise

    def _wait_serving(self, timeout_s: float) -> None:
        """Until the server serves; at once, with its log's tail, if it exits first (a server that
        died on start was waited for the whole timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                wait_until_serving(self.target, timeout_s=1.0, tls=self.tls)
                return
            except Exception:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    tail = self.current_log()[-3000:]
                    raise RuntimeError(
                        f"server exited ({self.proc.returncode}) before serving:\n{tail}"
                    ) from None
                if time.monotonic() > deadline:
                    raise

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._close_log()
        self._close_readers()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close_log()
        self._close_readers()

    def client(self, user: str) -> GpufedClient:
        token = (self.state_dir / "tokens" / f"{user}.token").read_text().strip()
        return GpufedClient(self.target, token, tls=self.tls)

    def reader(self, user: str) -> GpufedClient:
        """A client of `user` left open across calls, for tests that poll (`kube.job_of`): a new
        client for each poll cost 3 ms of the test's CPU and 1.4 ms of the server's more than a call
        on an open one, ten polls a second. Made again when the user's token file changes, and
        closed when the server stops, is killed or starts again."""
        token = (self.state_dir / "tokens" / f"{user}.token").read_text().strip()
        kept = self._readers.get(user)
        if kept is not None and kept[0] == token:
            return kept[1]
        if kept is not None:
            kept[1].close()
        client = GpufedClient(self.target, token, tls=self.tls)
        self._readers[user] = (token, client)
        return client

    def _close_readers(self) -> None:
        readers, self._readers = self._readers, {}
        for _, client in readers.values():
            client.close()

    def _log_path(self) -> Path:
        """The log of the process started last."""
        return self.state_dir / f"server-{self.identity}-{self.starts}.log"

    def current_log(self) -> str:
        """The log of the process started last."""
        path = self._log_path()
        return path.read_text(errors="replace") if path.exists() else ""

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.state_dir.glob("server-*.log")))


_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)


class Poll(Protocol[_T_co]):
    """What wait_for polls: called with no arguments, a falsy value means "not yet".

    A protocol rather than a Callable: lambdas that bind a loop variable as a default
    (`lambda j=job_id: ...`) are zero-argument calls too, and mypy infers them only against a
    protocol's __call__. False and None are named so that `job if ready else False` and
    `ready and job` give the job's type, not object."""

    def __call__(self) -> _T_co | Literal[False] | None: ...


def wait_for(predicate: Poll[_T], timeout_s: float = 30.0, interval_s: float = 0.1) -> _T:
    """The predicate's first truthy value, polled every interval_s; AssertionError past timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(interval_s)


def run_cli(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """`python -m federation ARGS` as a user runs it: a process of its own, with its exit status,
    stdout and stderr apart, as `subprocess.run(..., capture_output=True, text=True)` gives them.

    Forked from the worker's zygote (tests/e2e/zygote.py), which has imported gpufed: a CLI call was
    about 0.55 s of CPU, nearly all of it imports, and the e2e tests make a few hundred. The CLI's
    own start from a fresh interpreter keeps its tests (tests/e2e/test_cli_up.py, the docs' commands);
    GPUFED_TEST_ZYGOTE=0 runs these from nothing too."""
    argv = [sys.executable, "-m", "federation", *args]
    if not zygote.enabled():
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    with tempfile.TemporaryDirectory(prefix="gpufed-cli-") as scratch:
        out, err = Path(scratch) / "stdout", Path(scratch) / "stderr"
        child = zygote.Zygote.shared().spawn(argv, os.environ, out, stderr_path=err)
        try:
            code = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise subprocess.TimeoutExpired(argv, timeout_s) from None
        return subprocess.CompletedProcess(
            argv, code, out.read_text(errors="replace"), err.read_text(errors="replace")
        )


def run_cli_as(server: ServerProcess, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`run_cli` against `server` as `user`, with the token file the server wrote for them."""
    token = server.state_dir / "tokens" / f"{user}.token"
    return run_cli("--server", server.target, "--token-file", str(token), *args)
