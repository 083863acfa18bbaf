"""End to end, issue 34 (sweeps), against `gpufed serve` on a simulated Kubernetes cluster in process
mode (`localExec`: each pod's command is a real local process, clusters/sim/local_exec.py), through
the CLI as a user meets it.

A grid sweep of 6 trials, 2 at once. Each trial is a real `python -c` that reads its values from
both places gpufed puts them (GPUFED_PARAM_* and /etc/gpufed-sweep/params.json, a downward API file),
exits 3 if they disagree, and prints its loss, a known function of its values, as a few
`gpufed-metric: loss=...` lines (the last counts). `gpufed sweep results -o json` must rank the
trials by that function, best first; kubectl shows the pods carried the values. Another tenant gets
NOT_FOUND for the sweep, as for one that does not exist.

A random sweep of 50 trials with median stopping, 8 at once: each trial prints its loss at every
step (`gpufed-metric: loss=V step=N`, falling as 1/N towards a floor set by its learning rate). The
losers (floor 1 or more) step slowly, the others quickly; every loser must be stopped by the rule
(CANCELLED, the rule's words as its reason, long before its 60 s would end) and the best trial must
succeed and rank first.

A grid sweep of 8 trials with successive halving (rungs at steps 2, 4, 8, ...; the worse half stops
at each): every loser is stopped at a rung, the winners succeed and rank first.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusters.sim import local_exec
from federation.api.v1 import gpufed_pb2 as pb
from federation.runtime.etcd_process import EtcdProcess
from federation.runtime.sim_process import SimProcess
from tests.contract.kube.kubectl import KUBECTL
from tests.e2e.harness import ServerProcess, run_cli, wait_for
from tests.e2e.kube import serve_clusters, sim_kubectl

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed"),
    pytest.mark.skipif(local_exec.available() is not None, reason=str(local_exec.available())),
]

CLUSTERS: list[dict[str, Any]] = [
    {
        "name": "lab",
        "provider": "private",
        "region": "dc1",
        "localExec": True,
        "pools": [
            {
                "name": "a100",
                "gpuType": "A100",
                "kind": "private",
                "usdPerGpuHour": 1.0,
                "gpusPerNode": 4,
                "nodes": 2,
            }
        ],
    }
]

# The trial: its values from the environment and from the file must agree; its loss is
# (log10(lr) + 2)^2 + batch / 1000, printed after two intermediate values that the last one replaces.
TRIAL = """
import json, math, os
values = json.load(open("/etc/gpufed-sweep/params.json"))
lr, batch = float(os.environ["GPUFED_PARAM_LR"]), int(os.environ["GPUFED_PARAM_BATCH"])
if values != {"lr": lr, "batch": batch}:
    print("disagree", values, lr, batch, flush=True)
    raise SystemExit(3)
loss = (math.log10(lr) + 2) ** 2 + batch / 1000
print("gpufed-metric: loss=99", flush=True)
print("gpufed-metric: loss=", loss * 2, flush=True)
print(f"trial {os.environ['GPUFED_TRIAL']} of {os.environ['GPUFED_SWEEP']}", flush=True)
print(f"gpufed-metric: loss={loss!r}", flush=True)
"""

LRS = [0.1, 0.01, 0.001]
BATCHES = [64, 32]


def loss(lr: float, batch: int) -> float:
    import math

    return (math.log10(lr) + 2) ** 2 + batch / 1000


def sweep_file() -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "gpufed.io/v1",
            "kind": "Sweep",
            "metadata": {"name": "lr-grid"},
            "spec": {
                "maxParallel": 2,
                "search": "grid",
                "parameters": {"lr": LRS, "batch": BATCHES},
                "metric": {"name": "loss", "goal": "minimize"},
                "template": {
                    "metadata": {"name": "trainer"},
                    "spec": {
                        "gpuTypes": ["A100"],
                        "tasks": [
                            {
                                "name": "main",
                                "replicas": 1,
                                "gpus": 1,
                                "image": "python:3.11",
                                "command": [sys.executable, "-c", TRIAL],
                            }
                        ],
                    },
                },
            },
        },
        sort_keys=False,  # the parameters' order is the grid's
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


def test_a_grid_sweep_runs_its_trials_and_ranks_them_by_the_metric_they_print(
    fed: ServerProcess, sims: SimProcess, tmp_path: Path
) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(sweep_file())
    done = cli(fed, "alice", "submit", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "job set lr-grid submitted: 6 jobs, held=4 queued=2", done.stdout
    again = cli(fed, "alice", "submit", str(path))
    assert "already submitted (nothing new created)" in again.stdout, again.stdout

    def finished() -> pb.JobSet | None:
        with fed.client("alice") as alice:
            shown = alice.get_set("lr-grid")
        return shown if shown.done else None

    shown = wait_for(finished, timeout_s=180, interval_s=0.5)
    assert {c.phase: c.jobs for c in shown.counts} == {"SUCCEEDED": 6}, shown

    def ranked() -> dict[str, Any] | None:
        out = cli(fed, "alice", "sweep", "results", "lr-grid", "-o", "json")
        assert out.returncode == 0, out.stderr
        reply: dict[str, Any] = json.loads(out.stdout)
        # The kept logs are written as each attempt ends; wait until every trial's are read.
        return reply if all("metric" in t for t in reply["trials"]) else None

    reply = wait_for(ranked, timeout_s=30, interval_s=0.5)
    got = [({p["name"]: p["value"] for p in t["parameters"]}, t["metric"]) for t in reply["trials"]]
    points = sorted(((lr, b) for lr in LRS for b in BATCHES), key=lambda p: loss(*p))
    assert [(float(v["lr"]), int(v["batch"])) for v, _ in got] == points
    assert [m for _, m in got] == pytest.approx([loss(*p) for p in points])
    assert [t["rank"] for t in reply["trials"]] == [1, 2, 3, 4, 5, 6]
    assert all(t["phase"] == "JOB_PHASE_SUCCEEDED" and t["cost_usd"] for t in reply["trials"])
    table = cli(fed, "alice", "sweep", "results", "lr-grid")
    assert table.returncode == 0, table.stderr
    best = next(line for line in table.stdout.splitlines() if line.startswith("1 "))
    assert "lr=0.01 batch=32" in best, table.stdout

    # kubectl: each trial's pod carried its values as the annotation its params file projects.
    pods = json.loads(
        sim_kubectl(sims, "lab", "get", "pods", "-A", "-l", "gpufed.io/tenant=vision", "-o", "json").stdout
    )
    for pod in pods["items"]:
        values = json.loads(pod["metadata"]["annotations"]["gpufed.io/sweep-params"])
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
        assert env["GPUFED_PARAM_LR"] == repr(values["lr"]), (env, values)

    # Another tenant: NOT_FOUND, the same words as for a sweep that does not exist.
    refused = cli(fed, "bob", "sweep", "results", "lr-grid")
    assert refused.returncode != 0
    assert "NOT_FOUND" in refused.stderr, refused.stderr
    assert "job set 'lr-grid' not found" in refused.stderr, refused.stderr
    missing = cli(fed, "bob", "sweep", "results", "no-such-sweep")
    assert refused.stderr.replace("lr-grid", "X") == missing.stderr.replace("no-such-sweep", "X")


# A trial of the stopping sweep: floor (log10(lr) + 3)^2, so lr near 1e-3 wins; a loser (floor >= 1)
# takes 0.5 s a step for 120 steps (a minute), a winner 0.02 s for 20.
STEPPING = """
import math, os, time
lr = float(os.environ["GPUFED_PARAM_LR"])
floor = (math.log10(lr) + 3) ** 2
loser = floor >= 1
for step in range(1, 121 if loser else 21):
    print(f"gpufed-metric: loss={floor + 1 / step!r} step={step}", flush=True)
    time.sleep(0.5 if loser else 0.02)
print(f"gpufed-metric: loss={floor!r}", flush=True)
"""


def floor_of(lr: float) -> float:
    import math

    return (math.log10(lr) + 3) ** 2


def test_median_stopping_ends_the_losing_trials_and_ranks_the_rest(
    fed: ServerProcess, tmp_path: Path
) -> None:
    doc = yaml.safe_load(sweep_file())
    doc["metadata"]["name"] = "lr-stop"
    doc["spec"] = {
        "maxParallel": 8,
        "search": "random",
        "trials": 50,
        "seed": 11,
        "parameters": {"lr": {"min": 1e-5, "max": 1e-1, "log": True}},
        "metric": {"name": "loss", "goal": "minimize"},
        "earlyStopping": {"type": "median", "minTrials": 3, "minStep": 2},
        "template": doc["spec"]["template"],
    }
    doc["spec"]["template"]["spec"]["tasks"][0]["command"] = [sys.executable, "-c", STEPPING]
    path = tmp_path / "stop.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = cli(fed, "alice", "submit", str(path))
    assert done.returncode == 0, done.stderr

    def finished() -> pb.JobSet | None:
        with fed.client("alice") as alice:
            shown = alice.get_set("lr-stop")
        return shown if shown.done else None

    wait_for(finished, timeout_s=400, interval_s=1.0)
    out = cli(fed, "alice", "sweep", "results", "lr-stop", "-o", "json")
    assert out.returncode == 0, out.stderr
    trials = json.loads(out.stdout)["trials"]
    assert len(trials) == 50
    lrs = {t["key"]: float(t["parameters"][0]["value"]) for t in trials}
    losers = [t for t in trials if floor_of(lrs[t["key"]]) >= 1]
    assert losers, "the seed gives losers (lr far from 1e-3)"
    for t in losers:
        assert t["phase"] == "JOB_PHASE_CANCELLED", t
        assert t["reason"].startswith("early stopping (median rule): "), t
    # The best trial ran to its end and ranks first, with its floor as its metric.
    best = min(trials, key=lambda t: floor_of(lrs[t["key"]]))
    assert trials[0]["key"] == best["key"], (trials[0], best)
    assert best["phase"] == "JOB_PHASE_SUCCEEDED"
    assert best["metric"] == pytest.approx(floor_of(lrs[best["key"]]))
    # Ranked best first by the metric each printed last; every succeeded trial's is its floor.
    metrics = [t["metric"] for t in trials if "metric" in t]
    assert metrics == sorted(metrics)
    for t in trials:
        if t["phase"] == "JOB_PHASE_SUCCEEDED":
            assert t["metric"] == pytest.approx(floor_of(lrs[t["key"]])), t


# Successive halving's sweep: three winners (floor under 1) and five losers (floor 1 or more).
HALVING_LRS = [1e-3, 2e-3, 5e-4, 1e-2, 1e-4, 1e-5, 1e-1, 1e-6]


def test_successive_halving_stops_every_loser_at_a_rung_and_ranks_the_rest(
    fed: ServerProcess, tmp_path: Path
) -> None:
    """Eight trials at once, rungs at steps 2, 4, 8, 16 and on (factor 2): at each rung the worse
    half stops. The winners run their 20 steps in under a second; the losers, at 0.5 s a step, are
    all stopped at some rung long before their minute ends."""
    doc = yaml.safe_load(sweep_file())
    doc["metadata"]["name"] = "lr-halve"
    doc["spec"] = {
        "search": "grid",
        "parameters": {"lr": HALVING_LRS},
        "metric": {"name": "loss", "goal": "minimize"},
        "earlyStopping": {"type": "successiveHalving", "minTrials": 3, "minStep": 2, "reductionFactor": 2},
        "template": doc["spec"]["template"],
    }
    doc["spec"]["template"]["spec"]["tasks"][0]["command"] = [sys.executable, "-c", STEPPING]
    path = tmp_path / "halve.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = cli(fed, "alice", "submit", str(path))
    assert done.returncode == 0, done.stderr

    def finished() -> pb.JobSet | None:
        with fed.client("alice") as alice:
            shown = alice.get_set("lr-halve")
        return shown if shown.done else None

    wait_for(finished, timeout_s=120, interval_s=0.5)
    out = cli(fed, "alice", "sweep", "results", "lr-halve", "-o", "json")
    assert out.returncode == 0, out.stderr
    trials = json.loads(out.stdout)["trials"]
    lrs = {t["key"]: float(t["parameters"][0]["value"]) for t in trials}
    for t in trials:
        if floor_of(lrs[t["key"]]) >= 1:
            assert t["phase"] == "JOB_PHASE_CANCELLED", t
            assert t["reason"].startswith("early stopping (successive halving): "), t
        else:
            assert t["phase"] == "JOB_PHASE_SUCCEEDED", t
            assert t["metric"] == pytest.approx(floor_of(lrs[t["key"]])), t
    # lr = 1e-3 has floor 0: it ranks first.
    assert lrs[trials[0]["key"]] == 1e-3
    assert [t["rank"] for t in trials[:3]] == [1, 2, 3]
