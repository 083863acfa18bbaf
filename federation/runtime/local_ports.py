"""The ports of the services `gpufed up` runs itself, when the user chooses them.

By default etcd, the object stores and the simulator each take a free loopback port (remembered in
their data dirs across restarts). A user who must know them ahead (a firewall rule, a kubeconfig
kept elsewhere, a second tool pointed at the store) names them: `--etcd-port`, `--sim-port` (the
first simulated cluster's API; the next cluster gets the port above, and so on) and `--store-port
SERVER=PORT` (the S3 port of the config's `seaweed: SERVER` object store; SeaweedFS also takes the
port 10000 above it for gRPC). Each is checked before anything starts, so a taken one is refused
with its name and its owner's flag, instead of a child's bind error half-way through the start.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from datasync.loopback_ports import port_free
from federation.errors import GpufedError

HOST = "127.0.0.1"
# SeaweedFS serves each component's gRPC on its HTTP port plus this (datasync.seaweed_process).
SEAWEED_GRPC_OFFSET = 10000


class PortTaken(GpufedError):
    """A port the user chose for a local service is in use, or is not a port."""


@dataclass(frozen=True, slots=True)
class LocalPorts:
    etcd_port: int | None = None
    sim_port: int | None = None
    # (seaweed server name, S3 port), as given.
    store_ports: tuple[tuple[str, int], ...] = ()

    def check(self, *, simulated: int, seaweed: Set[str]) -> None:
        """Refuse a chosen port that is out of range, given twice, taken now, or for a store server
        the config does not run: `simulated` clusters and the `seaweed` servers are what starts."""
        wanted: list[tuple[int, str]] = []
        if self.etcd_port is not None:
            wanted.append((self.etcd_port, "etcd's client port (--etcd-port)"))
        if self.sim_port is not None and simulated:
            for i in range(simulated):
                wanted.append((self.sim_port + i, f"simulated cluster {i + 1} of {simulated} (--sim-port)"))
        for server, port in self.store_ports:
            if server not in seaweed:
                known = ", ".join(sorted(seaweed)) or "none"
                raise PortTaken(
                    f"--store-port {server}={port}: the config runs no object store server {server!r} "
                    f"(its seaweed: servers: {known})"
                )
            owner = f"object store server {server!r} (--store-port {server}={port})"
            wanted.append((port, owner))
            wanted.append((port + SEAWEED_GRPC_OFFSET, f"{owner}, its gRPC port {port} + 10000"))
        seen: dict[int, str] = {}
        for port, owner in wanted:
            if not 0 < port < 65536:
                raise PortTaken(f"port {port} for {owner} is not a TCP port (1 to 65535)")
            if port in seen:
                raise PortTaken(f"port {port} is chosen twice: for {seen[port]} and for {owner}")
            seen[port] = owner
            # As the Go and asyncio servers bind (SO_REUSEADDR): a listener holds the port, a closed
            # connection waiting out TIME_WAIT does not.
            if not port_free(port, HOST, reuse_addr=True):
                raise PortTaken(
                    f"port {port} for {owner} is taken on {HOST}: stop what listens there or choose another"
                )
