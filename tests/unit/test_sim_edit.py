"""The simulator's copies of a changing object (`clusters.sim.changes.edit`): what is shared, and
that nothing committed changes (issue 33, where copying a Volcano Job's metadata at each status
update was a fifth of the simulator's CPU)."""

from __future__ import annotations

import copy
from typing import Any

from clusters.sim import ManualClock, SimPoolConfig, cluster
from clusters.sim.changes import edit
from clusters.sim.engine import Engine
from clusters.sim.resources import VOLCANO_JOBS
from clusters.sim.writes import Writes

Obj = dict[str, Any]


def a_volcano_job(name: str) -> Obj:
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {"team": "nlp"},
            "annotations": {"sim.gpufed.io/duration": "5s"},
        },
        "spec": {
            "minAvailable": 1,
            "schedulerName": "volcano",
            "queue": "default",
            "plugins": {"svc": []},
            "tasks": [
                {
                    "name": "worker",
                    "replicas": 1,
                    "template": {
                        "metadata": {"annotations": {"sim.gpufed.io/duration": "5s"}},
                        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]},
                    },
                }
            ],
        },
    }


def test_edit_copies_the_metadata_but_shares_the_managed_fields() -> None:
    obj = {"metadata": {"name": "x", "labels": {"a": "1"}, "managedFields": [{"manager": "m"}]}, "spec": {}}
    new = edit(obj)
    new["metadata"]["labels"]["a"] = "2"
    assert obj["metadata"]["labels"] == {"a": "1"}
    assert new["metadata"]["managedFields"] is obj["metadata"]["managedFields"]
    assert new["spec"] is obj["spec"]


def test_a_volcano_jobs_committed_versions_never_change_through_its_life() -> None:
    clock = ManualClock()
    engine = Engine(
        cluster("u", [SimPoolConfig.of("a100", "A100", node_count=1)], default_duration_s=5), clock
    )
    created = Writes(engine).create(VOLCANO_JOBS, "default", a_volcano_job("vj"), {"fieldManager": "gpufed"})
    first = copy.deepcopy(created)
    assert created["metadata"]["managedFields"], "the create recorded its manager's fields"
    seen = [created]
    for _ in range(12):  # pending, running, completed, each a controller's status update
        clock.advance(1.0)
        engine.reconcile()
        seen.append(engine.store.require(VOLCANO_JOBS, "default", "vj"))
    assert seen[-1]["status"]["state"]["phase"] == "Completed"
    # Each update shared the managed fields rather than copying them, and changed no earlier version.
    assert seen[-1]["metadata"]["managedFields"] is created["metadata"]["managedFields"]
    assert created == first
