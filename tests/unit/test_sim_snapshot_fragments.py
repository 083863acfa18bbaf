"""A simulated cluster's snapshot encodes only the objects that changed since the last one
(`clusters.sim.persist.encode` with the writer's fragments), and is the same document either way.

Each cluster writes its snapshot every 0.2 s while its objects change; encoding every object each
time was a tenth of the simulator's CPU in bench/scale.py. Committed objects are never mutated (a
change commits a new dict), so an object is known unchanged by its identity.
"""

from __future__ import annotations

from typing import Any

import msgspec

from clusters.sim import ManualClock, SimPoolConfig, cluster, persist
from clusters.sim.engine import Engine
from clusters.sim.resources import PODS

Obj = dict[str, Any]
CONFIG = cluster("u", (SimPoolConfig.of("a100", "A100", node_count=2),), default_duration_s=10)


def _pod(name: str) -> Obj:
    return {
        "metadata": {"name": name, "annotations": {"sim.gpufed.io/duration": "30"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }


def _whole(snapshot: persist.Snapshot) -> bytes:
    """The document as the encoder wrote it before fragments: every object encoded, in one call."""
    return msgspec.json.encode(
        {
            "format": persist.FORMAT,
            "cluster": snapshot.cluster,
            "resourceVersion": snapshot.resource_version,
            "simWallSeconds": snapshot.sim_wall_s,
            "realWallSeconds": snapshot.real_wall_s,
            "objects": [{"type": f"{rt.group}/{rt.plural}", "object": obj} for rt, obj in snapshot.objects],
        }
    )


def _engine() -> tuple[Engine, ManualClock]:
    clock = ManualClock()
    return Engine(CONFIG, clock), clock


def test_snapshots_with_fragments_are_the_documents_encoded_whole_through_a_clusters_changes() -> None:
    engine, clock = _engine()
    fragments: persist.Fragments = {}
    for step in range(4):
        engine.store.create(PODS, engine.admission.admit_create(PODS, _pod(f"p{step}"), "default"))
        engine.reconcile()
        clock.advance(2)
        engine.reconcile()
        snapshot = persist.take(CONFIG.name, engine.store, engine.clock.wall_s())
        assert persist.encode(snapshot, fragments) == _whole(snapshot) == persist.encode(snapshot)
    # Only what is stored now is kept: a deleted object's entry goes with it.
    engine.lifecycle.delete(PODS, "default", "p0", grace_s=0)
    engine.reconcile()
    snapshot = persist.take(CONFIG.name, engine.store, engine.clock.wall_s())
    assert persist.encode(snapshot, fragments) == _whole(snapshot)
    assert {id(obj) for _, obj in snapshot.objects} == set(fragments)


def test_an_unchanged_object_is_not_encoded_again_and_a_changed_one_is() -> None:
    engine, clock = _engine()
    engine.store.create(PODS, engine.admission.admit_create(PODS, _pod("p"), "default"))
    engine.reconcile()
    fragments: persist.Fragments = {}
    first = persist.take(CONFIG.name, engine.store, engine.clock.wall_s())
    persist.encode(first, fragments)
    entries = {key: entry for key, (_, entry) in fragments.items()}
    pod_before = engine.store.require(PODS, "default", "p")
    clock.advance(40)
    engine.reconcile()  # the pod's 30 s run ends: a new dict committed for it
    pod_after = engine.store.require(PODS, "default", "p")
    assert pod_after is not pod_before
    second = persist.take(CONFIG.name, engine.store, engine.clock.wall_s())
    persist.encode(second, fragments)
    for _, obj in second.objects:
        if obj is pod_after:
            assert b'"Succeeded"' in fragments[id(obj)][1]
        elif id(obj) in entries:
            assert fragments[id(obj)][1] is entries[id(obj)], "an unchanged object encoded again"


def test_a_snapshot_written_with_fragments_loads_back_as_the_store_holds_it(tmp_path: Any) -> None:
    engine, clock = _engine()
    engine.store.create(PODS, engine.admission.admit_create(PODS, _pod("p"), "default"))
    engine.reconcile()
    fragments: persist.Fragments = {}
    path = persist.snapshot_path(tmp_path, CONFIG.name)
    for _ in range(2):
        persist.write(path, persist.take(CONFIG.name, engine.store, engine.clock.wall_s()), fragments)
        clock.advance(2)
        engine.reconcile()
    loaded = persist.load(path, CONFIG.name)
    assert loaded is not None
    written = persist.take(CONFIG.name, engine.store, 0.0)
    assert [(rt, obj) for rt, obj in loaded.objects] == [(rt, obj) for rt, obj in written.objects]
