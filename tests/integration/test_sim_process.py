"""`python -m clusters.sim` as another process would start it: config file, ready file, SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from kubernetes import client

CONFIG = """
clusters:
  - name: onprem
    provider: private
    pools:
      - {name: a100, gpuType: A100, kind: private, usdPerGpuHour: 1.1, gpusPerNode: 8, nodes: 2}
  - name: cloud
    provider: aws
    pools:
      - {name: l4-spot, gpuType: L4, kind: spot, gpusPerNode: 4, nodes: 1}
"""


def test_process_serves_each_cluster_on_its_own_port_and_stops_on_sigterm(tmp_path: Path) -> None:
    (tmp_path / "sim.yaml").write_text(CONFIG)
    ready = tmp_path / "ready.json"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "clusters.sim",
            "--config",
            str(tmp_path / "sim.yaml"),
            "--port",
            "0",
            "--ready-file",
            str(ready),
            "--kubeconfig",
            str(tmp_path / "kubeconfig"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "the simulator did not become ready"
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        assert process.stdout is not None
        assert json.loads(process.stdout.readline()) == info
        urls = {c["name"]: c["url"] for c in info["clusters"]}
        assert set(urls) == {"onprem", "cloud"}
        assert len(set(urls.values())) == 2
        configuration = client.Configuration()
        configuration.host = urls["cloud"]
        nodes = client.CoreV1Api(client.ApiClient(configuration)).list_node().items
        assert [(n.metadata.name, n.metadata.labels["gpufed.io/capacity-type"]) for n in nodes] == [
            ("cloud-l4-spot-0", "spot")
        ]
        assert "current-context: onprem" in (tmp_path / "kubeconfig").read_text()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        if process.stdout:
            process.stdout.close()
        if process.stderr:
            process.stderr.close()
    assert not ready.exists()


def test_bad_config_exits_with_a_message(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(
        "clusters:\n  - name: x\n    pools:\n      - {name: p, gpusPerNode: 8}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "clusters.sim", "--config", str(tmp_path / "bad.yaml")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "clusters[0].pools[0].gpuType is required" in result.stderr
