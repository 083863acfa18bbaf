"""The official `kubernetes` client in a virtualenv of its own, so the project's code cannot patch it.

The virtualenv is built once (`.venv-kubeclient/` beside the project's `.venv/`) with the client
from PyPI at the version pinned below, and reused while the pin stays the same.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.contract.kube.target import REPO, KubeTarget

CLIENT_REQUIREMENT = "kubernetes==37.0.2"
VENV = REPO / ".venv-kubeclient"
RUNNER = Path(__file__).with_name("official_client_runner.py")


def ensure_client_venv() -> Path:
    """The venv's python, built on first use; a lock keeps two test sessions from building it at once."""
    python = VENV / "bin" / "python"
    stamp = VENV / f".installed-{CLIENT_REQUIREMENT}"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with (REPO / ".venv-kubeclient.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True, timeout=120)
            subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", CLIENT_REQUIREMENT],
                check=True,
                timeout=600,
            )
            stamp.touch()
    return python


@dataclass(frozen=True, slots=True)
class ClientError(Exception):
    status: int
    reason: str
    body: Any


class OfficialClient:
    def __init__(self, python: Path, target: KubeTarget) -> None:
        self._python = python
        self._target = target

    def _run(self, operation: str, args: dict[str, Any], timeout_s: float) -> Any:
        result = subprocess.run(
            [
                str(self._python),
                str(RUNNER),
                str(self._target.kubeconfig),
                self._target.context or "",
                operation,
                json.dumps(args),
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            cwd="/",
        )
        if result.returncode != 0:
            raise AssertionError(f"the official client failed ({operation} {args}):\n{result.stderr[-4000:]}")
        answer = json.loads(result.stdout)
        if "error" in answer:
            error = answer["error"]
            raise ClientError(error["status"], error["reason"], error["body"])
        return answer["ok"]

    def call(self, api: str, method: str, *args: Any, timeout_s: float = 60, **kwargs: Any) -> Any:
        return self._run(
            "call", {"api": api, "method": method, "args": list(args), "kwargs": kwargs}, timeout_s
        )

    def watch(
        self, api: str, method: str, *, timeout_s: float = 5, max_events: int = 1000, **kwargs: Any
    ) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self._run(
            "watch",
            {
                "api": api,
                "method": method,
                "kwargs": kwargs,
                "timeout_s": timeout_s,
                "max_events": max_events,
            },
            timeout_s + 60,
        )
        return events

    def log(self, name: str, namespace: str, *, timeout_s: float = 60, **kwargs: Any) -> str:
        text: str = self._run("log", {"name": name, "namespace": namespace, "kwargs": kwargs}, timeout_s)
        return text
