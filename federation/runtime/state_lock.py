"""One `gpufed up` per state directory: an exclusive lock on `<state-dir>/up.lock`.

A start clears the etcd, SeaweedFS and simulator processes a crashed run left in the state directory
(their pid files). That is right after a crash and wrong while another `gpufed up` still runs there:
it would kill that one's children. The lock tells the two apart. It is an flock on an open file, so
the kernel drops it when its holder dies, even by SIGKILL, and children never inherit it
(subprocess closes inherited descriptors).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from federation.errors import FailedPrecondition

LOCK_FILE = "up.lock"


class StateDirBusy(FailedPrecondition):
    """Another live `gpufed up` holds this state directory."""


@contextlib.contextmanager
def hold_state_dir(state_dir: Path) -> Iterator[None]:
    """Hold the state directory's lock for the block; raise StateDirBusy if someone else holds it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise StateDirBusy(
                f"another gpufed up (pid {holder}) is running on {state_dir}; stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
