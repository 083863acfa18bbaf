"""How `EtcdKv` reaches etcd: which endpoints, over which channel, with which client certificate.

A production etcd is a cluster of members, each with a client URL of its own, usually serving TLS and
asking clients for a certificate (`--client-cert-auth`). aetcd's client dials one `host:port` over an
insecure channel only, so `EndpointClient` is aetcd's client with the channel made here: insecure, or
TLS with the CA and the client's certificate and key. `EtcdKv` keeps one per member and fails over
between them. With `kv_etcd` and `kv_etcd_lease`, the only modules that import aetcd.

Endpoints are written as etcdctl takes them: comma-separated `host:port`, optionally `http://` or
`https://` (the latter demands TLS). The certificate files come from the caller or, as etcdctl's
`ETCDCTL_CACERT`/`_CERT`/`_KEY` do, from `GPUFED_ETCD_CACERT`, `GPUFED_ETCD_CERT`, `GPUFED_ETCD_KEY`,
so every client in a `gpufed serve` process (bootstrap, server, leader election) uses them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aetcd
import grpc
from aetcd import rpc

from federation.errors import InvalidSpec
from federation.store.kv_etcd_watch import WatchStream

CACERT_ENV, CERT_ENV, KEY_ENV = "GPUFED_ETCD_CACERT", "GPUFED_ETCD_CERT", "GPUFED_ETCD_KEY"


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """The CA that signed the members' certificates, and this client's certificate and key (both or
    neither: etcd with `--client-cert-auth` refuses a client without one)."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise InvalidSpec("etcd TLS", "give both the client certificate and its key, or neither")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EtcdTls | None:
        env = os.environ if env is None else env
        ca, cert, key = env.get(CACERT_ENV), env.get(CERT_ENV), env.get(KEY_ENV)
        if not ca:
            if cert or key:
                raise InvalidSpec(CACERT_ENV, f"{CERT_ENV} and {KEY_ENV} need the CA in {CACERT_ENV}")
            return None
        return cls(Path(ca), Path(cert) if cert else None, Path(key) if key else None)

    def credentials(self) -> grpc.ChannelCredentials:
        # Read at each connect: certificates rotated on disk are picked up by the next reconnect.
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca.read_bytes(),
            private_key=self.key.read_bytes() if self.key else None,
            certificate_chain=self.cert.read_bytes() if self.cert else None,
        )


def parse_endpoints(spec: str | Sequence[str]) -> tuple[tuple[str, ...], bool]:
    """("host:port", ...) and whether any was written https://. Raises InvalidSpec for a bad one."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    endpoints, https = [], False
    for raw in items:
        item = raw.strip()
        https = https or item.startswith("https://")
        item = item.removeprefix("https://").removeprefix("http://").rstrip("/")
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidSpec("etcd endpoints", f"{raw.strip()!r} is not host:port")
        if item not in endpoints:
            endpoints.append(item)
    if not endpoints:
        raise InvalidSpec("etcd endpoints", "no endpoint given")
    return tuple(endpoints), https


class EndpointClient(aetcd.Client):  # type: ignore[misc]
    """aetcd's client of one member, over a channel that may be TLS."""

    def __init__(
        self, endpoint: str, *, tls: EtcdTls | None, timeout_s: float, options: Mapping[str, Any]
    ) -> None:
        host, _, port = endpoint.rpartition(":")
        super().__init__(host=host, port=int(port), timeout=timeout_s, options=dict(options))
        self.endpoint = endpoint
        self._tls = tls
        # The member's one Watch stream, every watch of this client on it (`kv_etcd_watch`); made
        # with the channel.
        self.watches: WatchStream | None = None

    def blocking_channel(self) -> grpc.Channel:
        """A channel of gRPC's blocking API to the same member, with the same TLS and options: for a
        thread that must not share the asyncio API's process-wide poller (`kv_etcd_lease`)."""
        options = list(self._options.items())
        if self._tls is None:
            return grpc.insecure_channel(self.endpoint, options=options)
        return grpc.secure_channel(self.endpoint, self._tls.credentials(), options=options)

    async def connect(self) -> None:
        """As aetcd's connect (stubs on a fresh channel), the channel secure with TLS; and the watch
        stream."""
        if self._connected.is_set():
            return
        options = list(self._options.items())
        if self._tls is None:
            self.channel = rpc.insecure_channel(self.endpoint, options=options)
        else:
            self.channel = rpc.secure_channel(self.endpoint, self._tls.credentials(), options=options)
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        # Not aetcd's watcher: its own stream (`kv_etcd_watch`), so aetcd's `close` has none to stop.
        self._watcher = None
        self.watches = WatchStream(
            rpc.WatchStub(self.channel),
            endpoint=self.endpoint,
            timeout_s=self._timeout,
            metadata=self.metadata,
        )
        self._connected.set()

    async def close(self) -> None:
        """As aetcd's close, every watch on the stream ended first (without an error)."""
        watches, self.watches = self.watches, None
        if watches is not None:
            await watches.close()
        await super().close()
