"""Issue 30, item 14: a simulated cluster restored from its snapshot (`clusters.sim.persist`) on a manual
clock, so that times are exact: a running container ends when it would have had the cluster run on, a
graceful deletion under way ends as it would have, admitted pods still count against their node, and
the snapshot survives its file round trip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clusters.sim import ManualClock, SimPoolConfig, cluster, persist
from clusters.sim.engine import Engine
from clusters.sim.resources import PODS

Obj = dict[str, Any]
CONFIG = cluster("u", (SimPoolConfig.of("a100", "A100", node_count=1),), default_duration_s=10)


def _pod(name: str, gpus: int, duration_s: float) -> Obj:
    return {
        "metadata": {"name": name, "annotations": {"sim.gpufed.io/duration": str(duration_s)}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
        },
    }


def _phase(engine: Engine, name: str) -> str | None:
    pod = engine.store.get(PODS, "default", name)
    return None if pod is None else str(pod["status"]["phase"])


def _restored(engine: Engine, tmp_path: Path, down_s: float) -> Engine:
    """The engine's snapshot through its file, restored `down_s` later on a manual clock."""
    path = persist.snapshot_path(tmp_path, CONFIG.name)
    persist.write(path, persist.take(CONFIG.name, engine.store, engine.clock.wall_s()))
    snapshot = persist.load(path, CONFIG.name)
    assert snapshot is not None
    return Engine(CONFIG, ManualClock(wall0_s=snapshot.sim_wall_s + down_s), snapshot)


def test_a_restored_cluster_runs_its_pods_on_and_ends_them_on_time(tmp_path: Path) -> None:
    first = Engine(CONFIG, ManualClock())
    assert isinstance(first.clock, ManualClock)
    for name, gpus, run_s in (("long", 4, 100), ("short", 2, 30), ("going", 2, 100)):
        first.store.create(PODS, first.admission.admit_create(PODS, _pod(name, gpus, run_s), "default"))
    first.reconcile()
    first.clock.advance(2)
    first.reconcile()
    assert [_phase(first, n) for n in ("long", "short", "going")] == ["Running"] * 3
    first.clock.advance(18)
    first.reconcile()
    # A graceful deletion under way (the cluster's termination takes 0.2 s), then the snapshot.
    first.lifecycle.delete(PODS, "default", "going", grace_s=30)
    uids = {n: first.store.require(PODS, "default", n)["metadata"]["uid"] for n in ("long", "short", "going")}

    # Down for 5 s: "short" (30 s, 20 s run) has 5 s left, "long" 75 s; "going" is past its stop.
    second = _restored(first, tmp_path, down_s=5)
    assert isinstance(second.clock, ManualClock)
    # "going" was stopped at once (its 0.2 s passed while the cluster was down); the others run on.
    assert _phase(second, "going") is None
    kept = {n: second.store.require(PODS, "default", n)["metadata"]["uid"] for n in ("long", "short")}
    assert kept == {n: uids[n] for n in ("long", "short")}
    # The node still counts the admitted pods: 8 GPUs, 4 + 2 running, so a 4-GPU pod waits.
    second.store.create(PODS, second.admission.admit_create(PODS, _pod("late", 4, 10), "default"))
    second.reconcile()
    assert _phase(second, "late") == "Pending"
    second.clock.advance(4.5)
    second.reconcile()
    assert _phase(second, "short") == "Running"
    second.clock.advance(1)
    second.reconcile()
    assert _phase(second, "short") == "Succeeded"
    second.clock.advance(69)
    second.reconcile()
    assert _phase(second, "long") == "Running"
    second.clock.advance(2)
    second.reconcile()
    assert _phase(second, "long") == "Succeeded"
