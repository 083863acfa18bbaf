"""Whether a process we sent SIGSTOP has stopped, from Linux's /proc: the signal lands
asynchronously, and on a busy machine the process can still answer a call or two after `kill`
returns (an etcd "hung" by a test then stored a write the test expected refused)."""

from __future__ import annotations

import time
from pathlib import Path


def thread_states(pid: int) -> list[str]:
    """The scheduler state of each of `pid`'s threads (R, S, T, ...), as /proc/PID/task/*/stat say."""
    return [
        (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        for task in Path(f"/proc/{pid}/task").iterdir()
    ]


def is_stopped(pid: int) -> bool:
    return all(state == "T" for state in thread_states(pid))


def wait_until_stopped(pid: int, timeout_s: float = 5.0) -> None:
    """Return once every thread of `pid` is stopped (state T); fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not is_stopped(pid):
        assert time.monotonic() < deadline, f"process {pid} did not stop within {timeout_s} s"
        time.sleep(0.01)
