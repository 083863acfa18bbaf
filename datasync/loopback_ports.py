"""Listening ports for the local servers gpufed starts (etcd, SeaweedFS, PostgreSQL, test servers).

A port is picked before the server binds it, and a restarted server binds its remembered port again,
so between the pick and the bind someone else may take it. Binding to port 0 picks from the kernel's
ephemeral range (`net.ipv4.ip_local_port_range`), the same range every outgoing connection takes its
local port from: a killed etcd member's port was taken by one of its peers' reconnects, and the
restart failed with "address already in use" (stop 27's CI). So ports are drawn at random from
outside that range, where only another explicit listener can land, and probed by binding them.
Where the range leaves no room outside it, the kernel's own pick (port 0) is the fallback.

Several gpufed instances drawing at once on one machine (the test suite's pytest-xdist workers) can
still draw the same port and race to bind it: the loser's server then fails to start, or worse, a
client of the loser talks to the winner. `GPUFED_PORT_SLOT=i/n` keeps them apart: every port drawn is
congruent to i modulo n, so instances given different slots never draw the same port. n must divide
10000, so that SeaweedFS's gRPC port (its HTTP port + 10000) stays in the same slot.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Linux's default ephemeral range, for a kernel whose file cannot be read.
_DEFAULT_EPHEMERAL = (32768, 60999)
# Below this sit the well-known and registered ports of system services (5432, 8080, ...).
LOWEST = 10000
HIGHEST = 65535
_TRIES = 200
SLOT_ENV = "GPUFED_PORT_SLOT"
# SeaweedFS's gRPC ports are their HTTP ports + this (datasync.seaweed_process): a slot's modulus
# must divide it, so a pair's two ports share the slot.
_SLOT_STEP = 10000


def port_slot() -> tuple[int, int]:
    """(i, n) from GPUFED_PORT_SLOT="i/n": ports drawn here are all congruent to i mod n. (0, 1), every
    port, when it is unset."""
    raw = os.environ.get(SLOT_ENV, "").strip()
    if not raw:
        return 0, 1
    try:
        index_text, count_text = raw.split("/")
        index, count = int(index_text), int(count_text)
    except ValueError:
        raise ValueError(f"{SLOT_ENV}={raw!r}: expected i/n, such as 1/4") from None
    if count < 1 or _SLOT_STEP % count != 0:
        raise ValueError(f"{SLOT_ENV}={raw!r}: n must divide {_SLOT_STEP} (1, 2, 4, 5, 8, 10, 16, ...)")
    if not 0 <= index < count:
        raise ValueError(f"{SLOT_ENV}={raw!r}: i must be at least 0 and less than n")
    return index, count


def slot_for(index: int, count: int) -> str:
    """The GPUFED_PORT_SLOT value giving instance `index` of `count` a slot of its own: the smallest
    allowed modulus that is at least `count`."""
    modulus = next(n for n in range(count, _SLOT_STEP + 1) if _SLOT_STEP % n == 0)
    return f"{index % modulus}/{modulus}"


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections, inclusive."""
    try:
        low, high = (int(x) for x in _RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL
    return low, high


def port_free(port: int, host: str = "127.0.0.1", *, reuse_addr: bool = False) -> bool:
    """Whether a listener could bind `port` now. `reuse_addr` asks as a Go server (etcd, weed) would:
    it sets SO_REUSEADDR, so connections a killed run left in TIME_WAIT do not hold the port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if reuse_addr:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _kernel_pick(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def free_port(
    host: str = "127.0.0.1",
    *,
    highest: int = HIGHEST,
    also: Callable[[int], bool] = lambda _port: True,
) -> int:
    """A port at most `highest`, outside the ephemeral range, in this process's slot (`port_slot`),
    free now and passing `also`."""
    slot, slots = port_slot()
    low, high = ephemeral_range()
    outside = [r for r in (range(LOWEST, min(low, highest + 1)), range(high + 1, highest + 1)) if r]
    total = sum(len(r) for r in outside)
    for _ in range(_TRIES if total else 0):
        index = random.randrange(total)
        band = outside[0]
        if index >= len(band):
            index, band = index - len(band), outside[1]
        port = band[index]
        port += (slot - port) % slots  # the next port of this slot, at or above the draw
        if port in band and port_free(port, host) and also(port):
            return port
    # No room outside the ephemeral range (or none of it free): take the kernel's pick.
    for _ in range(_TRIES):
        port = _kernel_pick(host)
        if port <= highest and also(port):
            return port
    raise OSError(f"no free port at most {highest} on {host}")


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports, for servers started together (a cluster's members, a server's
    gRPC and HTTP ports): separate draws from the same band could repeat one."""
    found: list[int] = []
    while len(found) < count:
        found.append(free_port(host, also=lambda p: p not in found))
    return found
