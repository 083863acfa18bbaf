"""The cluster under test: the simulator as a process, or a real cluster from GPUFED_TEST_KUBECONFIG.

The simulator is started exactly as `gpufed up` starts it (`python -m clusters.sim --config ...`), so
the suite sees the same HTTP server a user's kubectl sees. A real cluster is used as it is; the cases
that change nodes or need GPU nodes say so and skip where the cluster cannot give them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]

# Two nodes of 8 A100 and one of 4 L4: enough for gangs that fit, gangs that do not, and foreign pods.
SIM_CLUSTER = {
    "name": "conformance",
    "provider": "private",
    "defaultDurationS": 20,
    "pools": [
        {"name": "a100", "gpuType": "A100", "gpusPerNode": 8, "nodes": 2},
        {"name": "l4", "gpuType": "L4", "gpusPerNode": 4, "nodes": 1},
    ],
}


@dataclass(frozen=True, slots=True)
class KubeTarget:
    kubeconfig: Path
    context: str | None
    # True for the simulator: node changes and GPU-sized requests are safe and always possible.
    simulated: bool
    # The simulator's own admin URL (faults, inspection); None on a real cluster.
    admin_url: str | None = None

    @property
    def may_change_nodes(self) -> bool:
        """Cordon, drain and delete nodes: always on the simulator, on a real cluster only when asked."""
        return self.simulated or os.environ.get("GPUFED_TEST_KUBE_ALLOW_NODE_CHANGES") == "1"


def real_target() -> KubeTarget | None:
    path = os.environ.get("GPUFED_TEST_KUBECONFIG")
    if not path:
        return None
    return KubeTarget(Path(path), os.environ.get("GPUFED_TEST_KUBE_CONTEXT") or None, simulated=False)


@contextmanager
def simulator_process(workdir: Path) -> Iterator[KubeTarget]:
    """`python -m clusters.sim` on a free loopback port, as `gpufed up` runs it."""
    config = workdir / "sim.yaml"
    config.write_text(yaml.safe_dump(SIM_CLUSTER))
    ready = workdir / "ready.json"
    kubeconfig = workdir / "kubeconfig"
    log = (workdir / "sim.log").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "clusters.sim",
            "--config",
            str(config),
            "--ready-file",
            str(ready),
            "--kubeconfig",
            str(kubeconfig),
            "--exit-with-parent",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if process.poll() is not None:
                raise RuntimeError(
                    f"the simulator exited with {process.returncode}: see {workdir / 'sim.log'}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError("the simulator did not become ready in 60 s")
            time.sleep(0.05)
        admin_url = json.loads(ready.read_text())["clusters"][0]["admin_url"]
        yield KubeTarget(kubeconfig, None, simulated=True, admin_url=admin_url)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()
