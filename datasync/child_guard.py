"""What a helper process needs so that it neither outlives its parent nor blocks the next start.

`gpufed up` starts etcd, SeaweedFS and the simulator as processes of their own. A parent that is
SIGKILLed runs no cleanup, so each child asks the kernel to kill it when its parent dies
(`prctl(PR_SET_PDEATHSIG)`). Not from a `preexec_fn`: that makes subprocess fork() rather than
vfork(), which runs gRPC's fork handlers in the child, and with gRPC's threads running they aborted
the child (SIGABRT, "epoll_wait error: Bad file descriptor"). The child instead starts as a small
Python shim that sets the signal and execs the real command (the setting survives exec), so the
process keeps its pid and, from then on, its own command line. That covers the parent's death, not the
machine's: each child also leaves a pid file beside its data, holding its pid and its command line,
so the next start can find a child that survived anyway (a crash on another kernel path, a parent
that was a thread which ended) and stop it before it holds a lock or a port the new one needs. A pid
is only trusted while `/proc/<pid>/cmdline` still reads as the recorded command, so a pid reused by
an unrelated process is never signalled.

Here in datasync, the lowest layer that starts processes, so that `datasync.seaweed_process` and
`federation.runtime.child_process` share it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_LEFTOVER_STOP_S = 5.0


@dataclass(frozen=True, slots=True)
class Leftover:
    """A process a previous run left behind, and what became of it."""

    pid: int
    command: tuple[str, ...]
    pid_file: Path

    def describe(self) -> str:
        return f"pid {self.pid} ({' '.join(self.command[:2])}, from {self.pid_file})"


# argv: parent pid, then the command. -I -S: no site, no user paths; ctypes only.
_SHIM = (
    "import ctypes,os,sys\n"
    f"ctypes.CDLL(None).prctl({_PR_SET_PDEATHSIG}, {int(signal.SIGKILL)}, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def die_with_parent(command: Sequence[str]) -> list[str]:
    """`command` wrapped so that the kernel SIGKILLs it when the process spawning it dies.

    PR_SET_PDEATHSIG follows the *thread* that forked: a child spawned from a worker thread dies when
    that thread ends. asyncio's default executor keeps its threads until the loop closes, which is
    also when `gpufed up` stops its children, so that is the lifetime wanted here. The check of the
    parent pid covers a parent that died before the signal was set (then none would ever come).
    `command[0]` must be a path (execv does not search PATH).
    """
    return [sys.executable, "-I", "-S", "-c", _SHIM, str(os.getpid()), *command]


def write_pid_file(path: Path, pid: int, command: Sequence[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"pid": pid, "command": list(command)}))
    tmp.replace(path)


def _cmdline(pid: int) -> tuple[str, ...] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    # A zombie reads empty: it holds nothing any more, so it counts as gone.
    return tuple(p.decode(errors="replace") for p in raw.split(b"\0")[:-1]) or None


def clear_leftover(path: Path) -> Leftover | None:
    """Stop the process `path` records if it still runs the recorded command; remove the pid file.

    SIGTERM first (etcd and weed flush on it), SIGKILL after a few seconds. Returns what was stopped,
    or None when the file is missing, unreadable, or its pid now runs something else.
    """
    try:
        record = json.loads(path.read_text())
        pid, command = int(record["pid"]), tuple(str(a) for a in record["command"])
    except (OSError, ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)
        return None
    if pid <= 1 or pid == os.getpid() or _cmdline(pid) != command:
        path.unlink(missing_ok=True)
        return None
    for sig, wait_s in ((signal.SIGTERM, _LEFTOVER_STOP_S), (signal.SIGKILL, _LEFTOVER_STOP_S)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while _cmdline(pid) == command and time.monotonic() < deadline:
            time.sleep(0.02)
        if _cmdline(pid) != command:
            break
    path.unlink(missing_ok=True)
    return Leftover(pid, command, path)
