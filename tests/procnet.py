"""Which process holds which TCP socket, from Linux's /proc: the kernel's own word on where the
connections to a port went (tests/e2e/test_api_workers.py, bench/submit.py --api-workers)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

LISTEN = "0A"
ESTABLISHED = "01"


def api_worker_pids(state_dir: Path) -> list[int]:
    """Processes running an API worker of the server on `state_dir` (by their command line)."""
    found = []
    marker = str(state_dir.resolve() / "api-workers")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0")]
        except OSError:
            continue  # gone meanwhile
        if "federation.runtime.api_workers" in argv and any(a.startswith(marker) for a in argv):
            found.append(int(entry.name))
    return sorted(found)


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _tcp_rows() -> Iterator[list[str]]:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)
            for row in rows:
                yield row.split()


def sockets_on_port(pid: int, port: int, state: str) -> int:
    """The process's TCP sockets whose local port is `port`, in `state` (LISTEN, ESTABLISHED)."""
    inodes = _socket_inodes(pid)
    count = 0
    for fields in _tcp_rows():
        local_port = int(fields[1].rsplit(":", 1)[1], 16)
        if local_port == port and fields[3] == state and fields[9] in inodes:
            count += 1
    return count
