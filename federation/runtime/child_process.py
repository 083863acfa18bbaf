"""A helper process that gpufed starts and owns: its log file, its stop, and its death with us.

The embedded default starts etcd and the simulated clusters as processes of their own. Each gets a
session of its own, so that a Ctrl-C aimed at a terminal or a test runner does not kill it before
its owner has stopped cleanly, and an atexit hook, so that it does not outlive an interpreter that
exits without stopping it. An interpreter that is SIGKILLed runs no hook: the kernel kills the child
then (`datasync.child_guard.die_with_parent`), and the child's pid file lets the next start stop one
that survived anyway (`clear_leftover`), so a crashed `gpufed up` never blocks the next one.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Protocol

import structlog

from datasync.child_guard import Leftover, clear_leftover, die_with_parent, write_pid_file

log = structlog.get_logger("gpufed.child")

_LOG_TAIL_BYTES = 4000


class LaunchedChild(Protocol):
    """What a child needs of `subprocess.Popen` here, which also satisfies it."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


# Starts `command` (a `python -m <module> ...` argv) with stdout and stderr appended to the log path.
# The tests fork the simulator from a process that has imported it already (tests/e2e/zygote.py):
# an interpreter's start and imports were 0.7 s of CPU a start, a hundred times a run.
Launcher = Callable[[Sequence[str], Path], LaunchedChild]


class ChildProcess:
    """One child process writing stdout and stderr to `log_path` (appended across restarts).

    With a `pid_file`, a spawn first stops the process a crashed predecessor left there (see
    `cleared`), then records the new one.
    """

    def __init__(
        self, log_path: Path, *, pid_file: Path | None = None, launcher: Launcher | None = None
    ) -> None:
        self.log_path = log_path
        self.pid_file = pid_file
        self.cleared: list[Leftover] = []
        self._launcher = launcher
        self._proc: LaunchedChild | None = None
        self._log: IO[bytes] | None = None
        self._log_start = 0
        self._atexit_registered = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def spawn(self, command: Sequence[str]) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.pid_file is not None:
            leftover = clear_leftover(self.pid_file)
            if leftover is not None:
                self.cleared.append(leftover)
                log.warning(
                    "leftover_process_cleared",
                    pid=leftover.pid,
                    command=" ".join(leftover.command[:2]),
                    pid_file=str(leftover.pid_file),
                )
        if self._launcher is not None:
            self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._proc = self._launcher(command, self.log_path)
        else:
            self._log = self.log_path.open("ab")
            self._log_start = self._log.tell()
            self._proc = subprocess.Popen(
                die_with_parent(command), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
            )
        if self.pid_file is not None:
            write_pid_file(self.pid_file, self._proc.pid, command)
        if not self._atexit_registered:
            atexit.register(self.kill)
            self._atexit_registered = True

    def exit_code(self) -> int | None:
        """The exit code once the process has ended (and it is then forgotten), else None."""
        if self._proc is None or self._proc.poll() is None:
            return None
        code = self._proc.returncode
        self._reap()
        return code

    def tail(self) -> str:
        """The end of what the process wrote since it was last spawned: for error messages."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(self._log_start, f.seek(0, os.SEEK_END) - _LOG_TAIL_BYTES))
                return f.read().decode(errors="replace")
        except OSError as e:
            return f"(log {self.log_path} unreadable: {e})"

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if the process has not exited within timeout_s. Safe to call twice."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._reap()

    def kill(self) -> None:
        """SIGKILL: what a crash looks like to clients. For fault tests."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._reap()

    def _reap(self) -> None:
        if self._proc is not None and self.pid_file is not None:
            self.pid_file.unlink(missing_ok=True)
        self._proc = None
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None
