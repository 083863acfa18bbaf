"""The official `kubernetes` client in a virtualenv of its own, so the project's code cannot patch it.

The virtualenv is built once (`.venv-kubeclient/` beside the project's `.venv/`) with the client
from PyPI at the version pinned below, and reused while the pin stays the same.
"""

from __future__ import annotations

import atexit
import json
import queue
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.contract.kube.target import REPO, KubeTarget
from tests.side_venv import ensure_side_venv

CLIENT_REQUIREMENT = "kubernetes==37.0.2"
VENV = REPO / ".venv-kubeclient"
RUNNER = Path(__file__).with_name("official_client_runner.py")


def ensure_client_venv() -> Path:
    """The venv's python, built on first use (tests/side_venv.py)."""
    return ensure_side_venv(VENV.name, CLIENT_REQUIREMENT)


@dataclass(frozen=True, slots=True)
class ClientError(Exception):
    status: int
    reason: str
    body: Any


@dataclass(frozen=True, slots=True)
class Request:
    """One request of the official client, made on its own or with others in one process (`batch`).

    Each process pays for importing the client (a second or more of CPU, several on a busy
    machine), so a test that makes several requests whose arguments it knows up front batches them.
    """

    operation: str
    args: dict[str, Any]
    # How long the request may take, the client's start included.
    timeout_s: float

    @classmethod
    def call(cls, api: str, method: str, *args: Any, timeout_s: float = 60, **kwargs: Any) -> Request:
        return cls("call", {"api": api, "method": method, "args": list(args), "kwargs": kwargs}, timeout_s)

    @classmethod
    def watch(
        cls, api: str, method: str, *, timeout_s: float = 5, max_events: int = 1000, **kwargs: Any
    ) -> Request:
        """The events of a watch, until `max_events` have come or `timeout_s` has passed."""
        args = {
            "api": api,
            "method": method,
            "kwargs": kwargs,
            "timeout_s": timeout_s,
            "max_events": max_events,
        }
        return cls("watch", args, timeout_s + 60)

    @classmethod
    def log(cls, name: str, namespace: str, *, timeout_s: float = 60, **kwargs: Any) -> Request:
        return cls("log", {"name": name, "namespace": namespace, "kwargs": kwargs}, timeout_s)


def _result(answer: dict[str, Any]) -> Any:
    if "error" in answer:
        error = answer["error"]
        return ClientError(error["status"], error["reason"], error["body"])
    return answer["ok"]


class _Runner:
    """One long-lived official_client_runner.py in the client's venv, answering JSON lines."""

    def __init__(self, python: Path) -> None:
        # Kept after the runner ends, for the failure message.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._proc = subprocess.Popen(
            [str(python), str(RUNNER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd="/",
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="official-client-runner").start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put("")  # the runner is gone

    def stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-4000:]

    def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """The answer, or None if the runner died or did not answer in time (it is then killed)."""
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            line = self._lines.get(timeout=timeout_s)
        except (BrokenPipeError, queue.Empty):
            line = ""
        if not line:
            self.close()
            return None
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()


_RUNNERS: dict[Path, _Runner] = {}
_RUNNERS_LOCK = threading.Lock()


@atexit.register
def _close_runners() -> None:
    for runner in _RUNNERS.values():
        runner.close()


class OfficialClient:
    def __init__(self, python: Path, target: KubeTarget) -> None:
        self._python = python
        self._target = target

    def _run(self, operation: str, args: dict[str, Any], timeout_s: float) -> Any:
        request = {
            "kubeconfig": str(self._target.kubeconfig),
            "context": self._target.context or "",
            "operation": operation,
            "args": args,
        }
        with _RUNNERS_LOCK:
            runner = _RUNNERS.get(self._python)
            if runner is None:
                runner = _RUNNERS[self._python] = _Runner(self._python)
            answered = runner.ask(request, timeout_s)
            if answered is None:
                del _RUNNERS[self._python]
                raise AssertionError(
                    f"the official client did not answer ({operation} {args}) within {timeout_s} s:\n"
                    + runner.stderr_tail()
                )
        answer = _result(answered)
        if isinstance(answer, ClientError):
            raise answer
        return answer

    def request(self, request: Request) -> Any:
        return self._run(request.operation, request.args, request.timeout_s)

    def call(self, api: str, method: str, *args: Any, timeout_s: float = 60, **kwargs: Any) -> Any:
        return self.request(Request.call(api, method, *args, timeout_s=timeout_s, **kwargs))

    def watch(
        self, api: str, method: str, *, timeout_s: float = 5, max_events: int = 1000, **kwargs: Any
    ) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self.request(
            Request.watch(api, method, timeout_s=timeout_s, max_events=max_events, **kwargs)
        )
        return events

    def log(self, name: str, namespace: str, *, timeout_s: float = 60, **kwargs: Any) -> str:
        text: str = self.request(Request.log(name, namespace, timeout_s=timeout_s, **kwargs))
        return text

    def _batch(self, requests: tuple[Request, ...], *, stop_at_error: bool) -> list[Any]:
        steps = [{"operation": r.operation, "args": r.args} for r in requests]
        answers: list[dict[str, Any]] = self._run(
            "batch",
            {"operations": steps, "stop_at_error": stop_at_error},
            sum(r.timeout_s for r in requests),
        )
        return [_result(answer) for answer in answers]

    def batch(self, *requests: Request) -> list[Any]:
        """The results of `requests`, made in order in one process; the first refusal is raised
        (as a ClientError) and the requests after it are not made, as when each is its own call."""
        results = self._batch(requests, stop_at_error=True)
        for result in results:
            if isinstance(result, ClientError):
                raise result
        return results

    def outcomes(self, *requests: Request) -> list[Any]:
        """Each request's result, or the ClientError it was refused with: for a test that expects
        some of them to be refused. Every request is made, in order, in one process."""
        return self._batch(requests, stop_at_error=False)
