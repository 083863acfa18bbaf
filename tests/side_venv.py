"""A virtualenv of its own for a real third-party client the tests use as a verifier (the official
`kubernetes` client, botocore), so that it never shares the project's dependencies and cannot be
mistaken for them. Built once on first use, beside the project's `.venv/`, with uv (installed by
`make setup`): a venv with pip in it and a pip install took 10 s or more of the suite's time each.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def ensure_side_venv(name: str, requirement: str) -> Path:
    """The python of `REPO/name` with `requirement` installed. A lock keeps two test workers from
    building it at once; a stamp named after the requirement rebuilds it when the pin changes."""
    venv = REPO / name
    python = venv / "bin" / "python"
    stamp = venv / f".installed-{requirement}"
    with (REPO / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists():
            uv = Path(sys.executable).parent / "uv"
            subprocess.run([str(uv), "venv", "--quiet", "--clear", "--python", sys.executable, str(venv)],
                           check=True, timeout=120)  # fmt: skip
            subprocess.run(
                [str(uv), "pip", "install", "--quiet", "--python", str(python), requirement],
                check=True,
                timeout=600,
            )
            stamp.touch()
    return python
