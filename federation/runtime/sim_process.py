"""The simulated clusters of the embedded default, as one `python -m clusters.sim` process.

`gpufed up` gives the simulator the config entries of its `backend: sim` clusters, waits for its
ready file, and from then on drives those clusters as any Kubernetes cluster: through the
kubeconfig the simulator writes, with the official client. A process of its own, not a thread of
the server, so that the API traffic is real HTTP between processes, as with a real cluster, and
the server's event loop does not share a core's GIL with the simulated kubelets.

The simulator keeps each cluster's state in a snapshot under `<work_dir>/state/` (`clusters.sim.
persist`), so that a restart of `gpufed up` (SIGTERM, or SIGKILL, which the kernel passes on to the
simulator) costs no job anything: the next simulator goes on from the snapshot, and the gangs that
were running are still running, the same pods with the same uids and start times, as on a real
cluster whose control plane restarted. `gpufed up` stops (exit code 1, saying why) when the
simulator dies under it (`SimExited`): a restart finds its clusters where the last snapshot left them.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from federation.errors import GpufedError
from federation.runtime.child_process import ChildProcess, Launcher


class SimStartFailed(GpufedError):
    """The simulator exited or did not become ready in time. The message carries its log's tail."""


class SimExited(SimStartFailed):
    """The simulator died while `gpufed up` ran (a start failure's kin: `gpufed up` exits, saying so)."""


@dataclass(frozen=True, slots=True)
class SimEndpoint:
    name: str
    url: str
    admin_url: str


class SimProcess:
    """The simulator for `clusters` (federation config entries), under `work_dir`."""

    def __init__(
        self,
        work_dir: Path,
        clusters: Sequence[Mapping[str, Any]],
        *,
        time_scale: float | None = None,
        port: int | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        # port: the first cluster's API port as chosen, the next cluster's one above (None: free ones).
        self.port = port
        self.work_dir = work_dir
        self.config_path = work_dir / "clusters.yaml"
        self.kubeconfig = work_dir / "kubeconfig"
        self.ready_path = work_dir / "ready.json"
        # Each cluster's snapshot: what a restarted simulator goes on from.
        self.state_dir = work_dir / "state"
        self._clusters = [dict(c) for c in clusters]
        self._time_scale = time_scale
        # launcher: how to start the process (None: a new interpreter; see `ChildProcess`).
        self._child = ChildProcess(work_dir / "sim.log", pid_file=work_dir / "sim.pid", launcher=launcher)
        self.endpoints: dict[str, SimEndpoint] = {}

    @property
    def pid(self) -> int | None:
        return self._child.pid

    def start(self, timeout_s: float = 30.0) -> None:
        """Start the simulator and return once every cluster serves and the kubeconfig is written."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump({"clusters": self._clusters}, sort_keys=False))
        self.ready_path.unlink(missing_ok=True)
        command = [
            sys.executable,
            "-m",
            "clusters.sim",
            "--config",
            str(self.config_path),
            "--ready-file",
            str(self.ready_path),
            "--kubeconfig",
            str(self.kubeconfig),
            "--exit-with-parent",
            "--state-dir",
            str(self.state_dir),
        ]
        if self._time_scale is not None:
            command += ["--time-scale", repr(self._time_scale)]
        if self.port is not None:
            command += ["--port", str(self.port)]
        self._child.spawn(command)
        deadline = time.monotonic() + timeout_s
        while not self.ready_path.exists():
            code = self._child.exit_code()
            if code is not None:
                raise SimStartFailed(f"the simulator exited with code {code}:\n{self._child.tail()}")
            if time.monotonic() > deadline:
                tail = self._child.tail()
                self.stop()
                raise SimStartFailed(f"the simulator was not ready after {timeout_s}s:\n{tail}")
            time.sleep(0.05)
        ready = json.loads(self.ready_path.read_text())
        self.endpoints = {
            c["name"]: SimEndpoint(c["name"], c["url"], c["admin_url"]) for c in ready["clusters"]
        }

    def exited(self) -> SimExited | None:
        """What to say when the simulator has died (it is then forgotten), else None."""
        code = self._child.exit_code()
        if code is None:
            return None
        return SimExited(
            f"the simulated clusters' process exited with code {code}; stopping (start gpufed up "
            f"again: its clusters go on from their snapshots in {self.state_dir}):\n{self._child.tail()}"
        )

    def stop(self, timeout_s: float = 10.0) -> None:
        self._child.stop(timeout_s)
        self.endpoints = {}

    def kill(self) -> None:
        self._child.kill()
        self.endpoints = {}

    def __enter__(self) -> SimProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
