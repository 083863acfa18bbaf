"""Pid files of helper processes: a survivor running the recorded command is stopped, nothing else is;
a child started through the shim dies with its parent. Real processes, read through /proc."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from datasync.child_guard import clear_leftover, die_with_parent, write_pid_file
from federation.errors import InvalidSpec
from federation.store.kv_etcd_channel import EtcdTls, parse_endpoints

# How long a poll below waits for a process to exec or die before failing: generous, since a
# passing test waits only as long as the process takes (milliseconds on an idle machine).
PROCESS_WAIT_S = 30.0


def _alive(pid: int) -> bool:
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


def test_a_survivor_running_the_recorded_command_is_stopped_and_named(tmp_path: Path) -> None:
    command = ["/bin/sleep", "300"]
    survivor = subprocess.Popen(command)
    pid_file = tmp_path / "x.pid"
    write_pid_file(pid_file, survivor.pid, command)
    # Give exec a moment: until then /proc shows the forking interpreter's command line.
    deadline = time.monotonic() + PROCESS_WAIT_S
    while Path(f"/proc/{survivor.pid}/cmdline").read_bytes().split(b"\0")[0] != b"/bin/sleep":
        assert time.monotonic() < deadline, f"the survivor did not exec /bin/sleep in {PROCESS_WAIT_S} s"
        time.sleep(0.01)
    cleared = clear_leftover(pid_file)
    assert cleared is not None
    assert (cleared.pid, list(cleared.command)) == (survivor.pid, command)
    assert survivor.wait(timeout=PROCESS_WAIT_S) == -15  # SIGTERM was enough
    assert not pid_file.exists()


def test_a_pid_now_running_something_else_is_left_alone(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["/bin/sleep", "300"])
    try:
        pid_file = tmp_path / "x.pid"
        write_pid_file(pid_file, stranger.pid, ["/usr/bin/etcd", "--name=gpufed"])
        assert clear_leftover(pid_file) is None
        assert stranger.poll() is None
        assert not pid_file.exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_missing_garbled_or_own_pid_files_clear_nothing(tmp_path: Path) -> None:
    assert clear_leftover(tmp_path / "none.pid") is None
    garbled = tmp_path / "garbled.pid"
    garbled.write_text("not json")
    assert clear_leftover(garbled) is None
    assert not garbled.exists()
    own = tmp_path / "own.pid"
    own.write_text(json.dumps({"pid": 1, "command": ["/sbin/init"]}))
    assert clear_leftover(own) is None


def test_a_child_started_through_the_shim_dies_with_its_parent(tmp_path: Path) -> None:
    # A middle process starts a grandchild through the shim, reports its pid, and is SIGKILLed.
    script = (
        "import subprocess, sys, time\n"
        "from datasync.child_guard import die_with_parent\n"
        "p = subprocess.Popen(die_with_parent(['/bin/sleep', '300']), start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    middle = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert middle.stdout is not None
    grandchild = int(middle.stdout.readline())
    deadline = time.monotonic() + PROCESS_WAIT_S
    while Path(f"/proc/{grandchild}/cmdline").read_bytes().split(b"\0")[0] != b"/bin/sleep":
        assert time.monotonic() < deadline, f"the shim did not exec /bin/sleep in {PROCESS_WAIT_S} s"
        time.sleep(0.01)
    middle.kill()
    middle.wait()
    deadline = time.monotonic() + PROCESS_WAIT_S
    while _alive(grandchild):
        assert time.monotonic() < deadline, "the grandchild outlived its parent"
        time.sleep(0.01)
    assert die_with_parent(["/bin/true"])[-1] == "/bin/true"


def test_endpoints_and_tls_files_are_read_as_etcdctl_takes_them() -> None:
    assert parse_endpoints("127.0.0.1:1, http://127.0.0.1:2,127.0.0.1:1") == (
        ("127.0.0.1:1", "127.0.0.1:2"),
        False,
    )
    assert parse_endpoints(["https://a:3/"]) == (("a:3",), True)
    for bad in ("", "a", "a:b", ":5"):
        with pytest.raises(InvalidSpec, match="etcd endpoints"):
            parse_endpoints(bad)
    assert EtcdTls.from_env({}) is None
    tls = EtcdTls.from_env({"GPUFED_ETCD_CACERT": "/ca", "GPUFED_ETCD_CERT": "/c", "GPUFED_ETCD_KEY": "/k"})
    assert tls == EtcdTls(Path("/ca"), Path("/c"), Path("/k"))
