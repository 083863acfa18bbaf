"""The leader plans in a process of its own (issue 30, item 15), seen from a user's side.

One tenant's deep queue made the leader's plan hold the GIL of the server's process, and another
tenant's reads waited behind it. Now `gpufed serve` plans in a worker process: its child, not
itself. When that worker is killed, jobs are still admitted: the next cycle starts a new one.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from federation.api.v1 import gpufed_pb2 as pb
from tests.e2e.harness import ServerProcess, manifest, wait_for

pytestmark = pytest.mark.e2e

PLACED = {pb.JOB_PHASE_ADMITTED, pb.JOB_PHASE_DISPATCHED, pb.JOB_PHASE_RUNNING, pb.JOB_PHASE_SUCCEEDED}


def plan_workers(server_pid: int) -> list[int]:
    """The server's child processes started by multiprocessing's spawn (the plan worker), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == server_pid and fields[0] != "Z" and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def test_the_plan_runs_in_a_child_process_and_a_killed_one_is_replaced(server: ServerProcess) -> None:
    assert server.proc is not None
    server_pid = server.proc.pid
    with server.client("alice") as alice:
        first = alice.submit(manifest("planned-elsewhere", duration="1s")).job_id
        wait_for(lambda: alice.get(first).phase in PLACED, timeout_s=20)
        workers = wait_for(lambda: plan_workers(server_pid), timeout_s=10)
        assert len(workers) == 1
        assert workers[0] != server_pid
        os.kill(workers[0], signal.SIGKILL)

        second = alice.submit(manifest("after-the-kill", duration="1s")).job_id
        wait_for(lambda: alice.get(second).phase in PLACED, timeout_s=20)
        replaced = wait_for(lambda: [p for p in plan_workers(server_pid) if p != workers[0]], timeout_s=10)
        assert len(replaced) == 1
