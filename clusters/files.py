"""Files written whole: a reader sees the old file or the new one, never a part.

Here, below `federation`, because both sides write such files: the simulator its kubeconfig and its
state snapshots (read by the next simulator and by clients), `gpufed up` its endpoint.json and
stores.json (polled by clients while it starts; `Path.write_text` truncates first, and a client once
read an empty endpoint.json between the truncation and the write).
"""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, data: str | bytes, *, durable: bool = False) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over `path`. With `durable`,
    the data reaches the disk before the rename (a snapshot that must survive the machine)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with partial.open("wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(partial, path)
