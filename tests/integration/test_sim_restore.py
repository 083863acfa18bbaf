"""Issue 30, item 14, at the simulator's level: `python -m clusters.sim --state-dir DIR` stopped (SIGTERM)
or killed (SIGKILL) and started again on the same DIR goes on where it was, as a real cluster does
while whoever watched it restarts. kubectl is the judge: the same pods (uids, start times) run on, no
pod is created again, and the gangs, a Volcano Job and an Indexed batch Job, complete.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusters.sim.clock import parse_rfc3339
from tests.contract.kube.kubectl import KUBECTL
from tests.e2e.harness import wait_for

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

CONFIG = """
clusters:
  - name: gang
    provider: private
    pools:
      - {name: a100, gpuType: A100, kind: private, usdPerGpuHour: 1.1, gpusPerNode: 8, nodes: 2}
  - name: plain
    provider: aws
    volcano: false
    pools:
      - {name: l4, gpuType: L4, kind: on_demand, gpusPerNode: 4, nodes: 1}
"""
RUN_S = 10


def _template(gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"annotations": {"sim.gpufed.io/duration": str(RUN_S)}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
    }


VOLCANO_JOB = {
    "apiVersion": "batch.volcano.sh/v1alpha1",
    "kind": "Job",
    "metadata": {"name": "gang", "namespace": "default"},
    "spec": {
        "minAvailable": 2,
        "schedulerName": "volcano",
        "tasks": [{"name": "worker", "replicas": 2, "template": _template(8)}],
    },
}
BATCH_JOB = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "indexed", "namespace": "default"},
    "spec": {
        "completions": 2,
        "parallelism": 2,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": _template(2),
    },
}


class Sim:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / "sim.yaml"
        self.config.write_text(CONFIG)
        self.kubeconfig = root / "kubeconfig"
        self.ready = root / "ready.json"
        self.state = root / "state"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.ready.unlink(missing_ok=True)
        log = (self.root / "sim.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "clusters.sim", "--config", str(self.config), "--ready-file",
             str(self.ready), "--kubeconfig", str(self.kubeconfig), "--state-dir", str(self.state)],
            stdout=log, stderr=log,
        )  # fmt: skip
        proc = self.proc
        wait_for(lambda: self.ready.exists() or proc.poll() is not None, timeout_s=20, interval_s=0.05)
        assert proc.poll() is None, (self.root / "sim.log").read_text()[-3000:]

    def end(self, how: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(how)
        self.proc.wait(timeout=20)

    def kubectl(self, context: str, *args: str, stdin: str | None = None) -> str:
        got = subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(self.kubeconfig), "--context", context, *args],
            input=stdin, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert got.returncode == 0, got.stderr[-2000:]
        return got.stdout

    def pod_objects(self) -> dict[tuple[str, str], dict[str, Any]]:
        found = {}
        for context in ("gang", "plain"):
            for pod in json.loads(self.kubectl(context, "get", "pods", "-n", "default", "-o", "json"))[
                "items"
            ]:
                found[(context, pod["metadata"]["name"])] = pod
        return found

    def pods(self) -> dict[tuple[str, str], tuple[str, str]]:
        """(cluster, name) -> (uid, startTime) of every pod."""
        return {
            k: (p["metadata"]["uid"], (p.get("status") or {}).get("startTime", ""))
            for k, p in self.pod_objects().items()
        }

    def phases(self) -> list[str]:
        return [(p.get("status") or {}).get("phase", "") for p in self.pod_objects().values()]


@pytest.fixture
def sim(tmp_path: Path) -> Any:
    instance = Sim(tmp_path)
    instance.start()
    yield instance
    if instance.proc is not None and instance.proc.poll() is None:
        instance.end(signal.SIGKILL)


def _snapshot_has_running_pods(sim: Sim, count: int) -> bool:
    running = 0
    for path in sim.state.glob("*.json"):
        try:
            snapshot = json.loads(path.read_text())
        except ValueError:
            return False
        running += sum(
            1
            for o in snapshot["objects"]
            if o["type"] == "/pods" and (o["object"].get("status") or {}).get("phase") == "Running"
        )
    return running == count


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_restarted_simulator_keeps_its_running_gangs(sim: Sim, how: signal.Signals) -> None:
    sim.kubectl("gang", "apply", "-f", "-", stdin=yaml.safe_dump(VOLCANO_JOB))
    sim.kubectl("plain", "apply", "-f", "-", stdin=yaml.safe_dump(BATCH_JOB))
    wait_for(lambda: sim.phases() == ["Running"] * 4, timeout_s=10, interval_s=0.1)
    before = sim.pods()
    if how is signal.SIGKILL:
        # A SIGKILL loses what the last snapshot (at most 0.2 s old) does not hold: wait for it.
        wait_for(lambda: _snapshot_has_running_pods(sim, 4), timeout_s=5, interval_s=0.05)
    sim.end(how)
    sim.start()
    # The same pods (uids, start times), none created again; they run on, and end.
    assert sim.pods() == before
    wait_for(lambda: sim.phases() == ["Succeeded"] * 4, timeout_s=RUN_S + 10)
    assert sim.pods() == before
    for pod in sim.pod_objects().values():
        # Each ran its time once: the restart did not start it over.
        ended = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        ran_s = parse_rfc3339(ended["finishedAt"]) - parse_rfc3339(ended["startedAt"])
        assert RUN_S - 1 <= ran_s <= RUN_S + 2, ended
    vcjob = json.loads(sim.kubectl("gang", "get", "vcjob", "gang", "-o", "json"))
    assert vcjob["status"]["state"]["phase"] == "Completed", vcjob["status"]
    conditions = json.loads(sim.kubectl("plain", "get", "job", "indexed", "-o", "json"))["status"][
        "conditions"
    ]
    assert any(c["type"] == "Complete" and c["status"] == "True" for c in conditions), conditions
