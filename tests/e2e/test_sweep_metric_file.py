"""End to end, issue 34: a sweep whose trials write their metric to a file (`metric.source: file`),
against `gpufed serve` on a simulated Kubernetes cluster in process mode (each pod's command is a
real local process, clusters/sim/local_exec.py), through the CLI as a user meets it.

A grid sweep of 4 trials, 2 at once. Each trial is a real `python -c` that prints nothing: it
writes its loss, a known function of its values, to gpufed's default metric file (/etc/gpufed-metric)
as `loss=...` lines, a wrong value first and the right one last. The simulated kubelet reads the
file as a kubelet reads a termination message; `gpufed sweep results -o json` must rank the trials by
that function, best first; kubectl shows, on the member cluster, each pod's termination message path
and its terminated state's message holding the value. Another tenant gets NOT_FOUND for the results,
in the same words as for a sweep that does not exist. A template that sets the owned field is
refused by `gpufed submit`, naming it.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusters.sim import local_exec
from federation.api.v1 import gpufed_pb2 as pb
from federation.jobsets.sweeps import METRIC_FILE, file_metric, parse_metric
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.contract.kube.kubectl import KUBECTL
from tests.e2e.harness import ServerProcess, run_cli, wait_for
from tests.e2e.kube import serve_clusters, sim_kubectl
from tests.e2e.test_sweeps import CLUSTERS

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed"),
    pytest.mark.skipif(local_exec.available() is not None, reason=str(local_exec.available())),
]

# The trial: its loss is (log10(lr) + 2)^2 + batch / 1000, written to the metric file after a
# wrong value that the last line replaces; nothing is printed.
TRIAL = """
import math, os
lr, batch = float(os.environ["GPUFED_PARAM_LR"]), int(os.environ["GPUFED_PARAM_BATCH"])
loss = (math.log10(lr) + 2) ** 2 + batch / 1000
with open("/etc/gpufed-metric", "w") as f:
    f.write("loss=99\\n")
    f.write(f"accuracy=0.5\\nloss={loss!r}\\n")
"""

LRS = [0.1, 0.01]
BATCHES = [64, 32]


def loss(lr: float, batch: int) -> float:
    return (math.log10(lr) + 2) ** 2 + batch / 1000


def sweep_file(name: str, template: dict[str, Any] | None = None) -> str:
    task: dict[str, Any] = {
        "name": "main",
        "replicas": 1,
        "gpus": 1,
        "image": "python:3.11",
        "command": [sys.executable, "-c", TRIAL],
    }
    if template is not None:
        task["template"] = template
    return yaml.safe_dump(
        {
            "apiVersion": "gpufed.io/v1",
            "kind": "Sweep",
            "metadata": {"name": name},
            "spec": {
                "maxParallel": 2,
                "search": "grid",
                "parameters": {"lr": LRS, "batch": BATCHES},
                "metric": {"name": "loss", "goal": "minimize", "source": "file"},
                "template": {
                    "metadata": {"name": "trainer"},
                    "spec": {"gpuTypes": ["A100"], "tasks": [task]},
                },
            },
        },
        sort_keys=False,
    )


@pytest.fixture
def fed(etcd: EtcdProcess, sims: SimProcess, tmp_path: Path) -> Iterator[ServerProcess]:
    with serve_clusters(
        etcd,
        tmp_path,
        sims,
        CLUSTERS,
        grace_s=8,
        tenants=[{"name": "platform"}, {"name": "vision"}, {"name": "nlp"}],
        users=[
            {"name": "admin", "tenant": "platform", "role": "admin"},
            {"name": "alice", "tenant": "vision"},
            {"name": "bob", "tenant": "nlp"},
        ],
    ) as process:
        yield process


def cli(fed: ServerProcess, user: str, *args: str) -> Any:
    token = fed.state_dir / "tokens" / f"{user}.token"
    return run_cli("--server", fed.target, "--token-file", str(token), *args)


def test_trials_that_write_their_metric_to_a_file_are_ranked_by_it(
    fed: ServerProcess, sims: SimProcess, tmp_path: Path
) -> None:
    owned = tmp_path / "owned.yaml"
    owned.write_text(
        sweep_file("owned", {"spec": {"containers": [{"name": "main", "terminationMessagePath": "/etc/x"}]}})
    )
    refused = cli(fed, "alice", "submit", str(owned))
    assert refused.returncode != 0
    assert (
        "spec.tasks[0].template.spec.containers[0].terminationMessagePath: gpufed sets it" in refused.stderr
    ), refused.stderr

    path = tmp_path / "sweep.yaml"
    path.write_text(sweep_file("lr-file"))
    done = cli(fed, "alice", "submit", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "job set lr-file submitted: 4 jobs, held=2 queued=2", done.stdout

    def finished() -> pb.JobSet | None:
        with fed.client("alice") as alice:
            shown = alice.get_set("lr-file")
        return shown if shown.done else None

    shown = wait_for(finished, timeout_s=180, interval_s=0.5)
    assert {c.phase: c.jobs for c in shown.counts} == {"SUCCEEDED": 4}, shown

    def ranked() -> dict[str, Any] | None:
        out = cli(fed, "alice", "sweep", "results", "lr-file", "-o", "json")
        assert out.returncode == 0, out.stderr
        reply: dict[str, Any] = json.loads(out.stdout)
        # The attempt's summary (with its pods' messages) is kept as it ends; wait for every trial's.
        return reply if all("metric" in t for t in reply["trials"]) else None

    reply = wait_for(ranked, timeout_s=30, interval_s=0.5)
    got = [({p["name"]: p["value"] for p in t["parameters"]}, t["metric"]) for t in reply["trials"]]
    points = sorted(((lr, b) for lr in LRS for b in BATCHES), key=lambda p: loss(*p))
    assert [(float(v["lr"]), int(v["batch"])) for v, _ in got] == points
    assert [m for _, m in got] == pytest.approx([loss(*p) for p in points])
    assert [t["rank"] for t in reply["trials"]] == [1, 2, 3, 4]
    table = cli(fed, "alice", "sweep", "results", "lr-file")
    assert table.returncode == 0, table.stderr
    best = next(line for line in table.stdout.splitlines() if line.startswith("1 "))
    assert "lr=0.01 batch=32" in best, table.stdout

    # kubectl on the member cluster: each trial's pod had the metric file as its termination message
    # path, and its terminated state's message is what the trial wrote there (it printed nothing).
    pods = json.loads(
        sim_kubectl(sims, "lab", "get", "pods", "-A", "-l", "gpufed.io/tenant=vision", "-o", "json").stdout
    )
    assert len(pods["items"]) == 4
    for pod in pods["items"]:
        main = pod["spec"]["containers"][0]
        assert (main["terminationMessagePath"], main["terminationMessagePolicy"]) == (METRIC_FILE, "File")
        values = json.loads(pod["metadata"]["annotations"]["gpufed.io/sweep-params"])
        message = pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"]
        assert message.startswith("loss=99\naccuracy=0.5\n"), message
        assert file_metric(message, "loss") == pytest.approx(loss(values["lr"], values["batch"]))
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        logs = sim_kubectl(sims, "lab", "logs", "-n", namespace, name)
        # The metric came from the file: the log (the sim's notes, the command) prints none.
        assert parse_metric(logs.stdout.splitlines(), "loss") is None, logs.stdout

    # Another tenant: NOT_FOUND, the same words as for a sweep that does not exist.
    other = cli(fed, "bob", "sweep", "results", "lr-file")
    assert other.returncode != 0
    assert "job set 'lr-file' not found" in other.stderr, other.stderr
    missing = cli(fed, "bob", "sweep", "results", "no-such-sweep")
    assert other.stderr.replace("lr-file", "X") == missing.stderr.replace("no-such-sweep", "X")
