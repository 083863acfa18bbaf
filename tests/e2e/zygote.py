"""`gpufed serve` processes (and simulators) forked from one that has imported them, for the e2e tests.

A server's start was about 2.3 s of CPU, of which 2.0 s importing (the official Kubernetes client,
SQLAlchemy, aiohttp, gRPC and gpufed itself), and the suite starts a few hundred: on two cores that
was most of the wall time of the tests that start and kill servers (tests/e2e/test_crash_ha.py's
cases took 30 to 44 s in a full run, 11 to 13 s alone). As Android's zygote and gunicorn's preload
do, one helper process per test worker imports those modules once and forks a child for each start.

Each child is an OS process of its own, with the arguments, environment, log and exit status a
`python -m federation ...` start would have, run by the same `federation.__main__`; tests SIGKILL it
as before. What a fork cannot give is a fresh interpreter, so the helper only imports: it starts no
thread and no event loop, opens no socket, and refuses to fork if a thread appeared. `gpufed up`,
the CLI tests and the demo still start `python -m federation` from nothing, and
GPUFED_TEST_ZYGOTE=0 makes every ServerProcess do so too. The tests' simulators
(`python -m clusters.sim`, `launch_sim`) are forked the same way.

The helper reaps its children only when asked, so a child's PID stays its own (a zombie) until the
test has read its exit status. The test waits on a pidfd, which Linux makes readable when the
process exits, whoever its parent is.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# What `gpufed serve` imports by the time it serves (measured with -X importtime); anything else it
# imports later, in the child.
PRELOAD = (
    "federation.cli.main",
    "federation.runtime.serve",
    "clusters.kubernetes.backend",
    # What `python -m clusters.sim` imports (not its `__main__` itself, which runpy would then find
    # imported already and warn about): 0.7 s of CPU a simulator start from nothing.
    "clusters.sim.cluster",
    "clusters.sim.config",
    "clusters.files",
)
# The modules a child may run, as `python -m <module> ...`.
MODULES = frozenset({"federation", "clusters.sim"})
PR_SET_PDEATHSIG = 1


def enabled() -> bool:
    return os.environ.get("GPUFED_TEST_ZYGOTE", "1") != "0"


class ZygoteChild:
    """The part of subprocess.Popen the tests use, for a process the helper forked."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self._zygote = zygote
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)
        # Tests poll from several threads (the soak's killer and samplers): one reaps, once.
        self._reap_lock = threading.Lock()

    def poll(self) -> int | None:
        return self._collect(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._collect(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        # Until the helper reaps it, the PID is this process's (a zombie at worst): never another's.
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _collect(self, timeout: float | None) -> int | None:
        # Wait outside the lock (a pidfd may be polled by many), reap inside it.
        if self.returncode is None:
            with contextlib.suppress(OSError):  # closed meanwhile by the thread that reaped
                select.select([self._pidfd], [], [], timeout)
        with self._reap_lock:
            if self.returncode is not None:
                return self.returncode
            readable, _, _ = select.select([self._pidfd], [], [], 0)
            if not readable:
                return None
            self.returncode = self._zygote.reap(self.pid)
            os.close(self._pidfd)
            return self.returncode


class Zygote:
    """The helper process of this test process, started on first use."""

    _instance: Zygote | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._request({"op": "ready"})

    @property
    def pid(self) -> int:
        """The helper's own PID: every child's parent."""
        return self._proc.pid

    @classmethod
    def shared(cls) -> Zygote:
        with cls._instance_lock:
            if cls._instance is None or cls._instance._proc.poll() is not None:
                cls._instance = Zygote()
            return cls._instance

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        *,
        stderr_path: Path | None = None,
        append: bool = False,
    ) -> ZygoteChild:
        """Fork a child that runs `python -m <module> argv[3:]` (argv as given to Popen; the module
        one of MODULES): stdout and stderr to `log_path` (appended to with `append`, else a new
        log), or stderr to `stderr_path` apart; stdin empty."""
        if len(argv) < 3 or argv[1] != "-m" or argv[2] not in MODULES:
            raise ValueError(
                f"the zygote runs `python -m <{' or '.join(sorted(MODULES))}> ...` only, not {argv!r}"
            )
        message: dict[str, Any] = {
            "op": "spawn",
            "module": argv[2],
            "args": list(argv[3:]),
            "env": dict(env),
            "log": str(log_path),
            "append": append,
        }
        if stderr_path is not None:
            message["err"] = str(stderr_path)
        answer = self._request(message)
        return ZygoteChild(self, int(answer["pid"]))

    def reap(self, pid: int) -> int:
        return int(self._request({"op": "reap", "pid": pid})["code"])

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        with self._lock:
            self._proc.stdin.write(json.dumps(message).encode() + b"\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the zygote exited ({self._proc.wait()})")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the zygote refused {message['op']}: {answer['error']}")
        return answer


# ---- the helper process


def _child(
    module: str, args: list[str], env: dict[str, str], log: str, err: str | None = None, append: bool = False
) -> None:
    """In the forked child: become `python -m <module> *args`, then exit with its status."""
    code = 1
    try:
        # Die with the helper (which dies with the test process), as --exit-with-parent children do.
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        source = os.open(os.devnull, os.O_RDONLY)
        # A new log, as Popen's "wb", or one appended to, as `ChildProcess` keeps across restarts.
        out = os.open(log, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o644)
        apart = out if err is None else os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(source, 0)
        os.dup2(out, 1)
        os.dup2(apart, 2)
        for fd in {source, out, apart}:
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        import runpy

        sys.argv = [module, *args]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as done:
            if isinstance(done.code, int) or done.code is None:
                code = done.code or 0
            else:  # sys.exit("message"): printed, status 1, as the interpreter does
                print(done.code, file=sys.stderr)
                code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        # What an interpreter's exit does before it tears down: wait for non-daemon threads, then
        # the atexit handlers. (Only the module teardown after them is skipped.)
        try:
            threading._shutdown()  # type: ignore[attr-defined]
            import atexit

            atexit._run_exitfuncs()
        except BaseException:
            import traceback

            traceback.print_exc()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # the log may be gone; the status still counts
                stream.flush()
        os._exit(code)


def _serve() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    commands = sys.stdin.buffer
    for line in commands:
        message = json.loads(line)
        answer: dict[str, Any]
        try:
            if message["op"] == "ready":
                answer = {"ok": True}
            elif message["op"] == "spawn":
                if threading.active_count() != 1:
                    raise RuntimeError(f"{threading.active_count()} threads: a fork would copy their locks")
                pid = os.fork()
                if pid == 0:
                    _child(
                        message.get("module", "federation"),
                        message["args"],
                        message["env"],
                        message["log"],
                        message.get("err"),
                        bool(message.get("append")),
                    )
                answer = {"pid": pid}
            elif message["op"] == "reap":
                _, status = os.waitpid(int(message["pid"]), 0)
                answer = {"code": os.waitstatus_to_exitcode(status)}
            else:
                answer = {"error": f"unknown op {message['op']!r}"}
        except Exception as error:  # the test process gets it as the answer
            answer = {"error": repr(error)}
        os.write(1, json.dumps(answer).encode() + b"\n")


if __name__ == "__main__":
    _serve()


def launch_sim(command: Sequence[str], log_path: Path) -> ZygoteChild:
    """A `federation.runtime.child_process.Launcher` for the tests' SimProcess: `command` is its
    `python -m clusters.sim ...`, forked from this test process's zygote; the log appended to."""
    return Zygote.shared().spawn(command, os.environ, log_path, append=True)
