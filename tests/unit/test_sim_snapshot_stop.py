"""A simulated cluster's last snapshot, written as it stops, is never raced by the tick's write before it.

`SnapshotWriter.stop` cancels the ticks, then writes what changed since the last one. A cancel cannot
stop a thread: a tick's write in flight went on, beside the last write, into the same temporary file
(one a process), and the older snapshot could be renamed over the newer one last, so the next simulator
restored the cluster as it was before its last changes (or a torn file). The stop now waits for the
tick's write to be done before its own.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from clusters.sim import ManualClock, SimPoolConfig, cluster, persist
from clusters.sim.engine import Engine
from clusters.sim.resources import PODS
from tests.waits import until

Obj = dict[str, Any]
CONFIG = cluster("u", (SimPoolConfig.of("a100", "A100", node_count=1),), default_duration_s=10)
# How long the tick's write is held for the stop's write to start beside it (it does at once when the
# stop does not wait). Only a passing run waits this long: the wrong order shows before it ends.
OVERLAP_WINDOW_S = 1.0


def _pod(name: str) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }


async def test_stop_waits_for_the_ticks_write_and_its_snapshot_is_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(CONFIG, ManualClock())
    engine.store.create(PODS, engine.admission.admit_create(PODS, _pod("first"), "default"))
    real_write = persist.write
    first_entered = threading.Event()
    second_entered = threading.Event()
    lock = threading.Lock()
    in_flight = 0
    overlapped: list[int] = []
    calls = 0

    def held_write(
        path: Path, snapshot: persist.Snapshot, fragments: persist.Fragments | None = None
    ) -> None:
        nonlocal in_flight, calls
        with lock:
            calls += 1
            mine = calls
            in_flight += 1
            if in_flight > 1:
                overlapped.append(snapshot.resource_version)
        try:
            if mine == 1:
                first_entered.set()
                second_entered.wait(OVERLAP_WINDOW_S)
            else:
                second_entered.set()
            real_write(path, snapshot, fragments)
        finally:
            with lock:
                in_flight -= 1

    monkeypatch.setattr(persist, "write", held_write)
    path = persist.snapshot_path(tmp_path, CONFIG.name)
    writer = persist.SnapshotWriter(path, CONFIG.name, engine.store, lambda: 0.0, interval_s=0.01)
    writer.start()
    await until(first_entered.is_set, "the tick's first write has begun", timeout_s=30.0)
    # A change after the tick took its snapshot: only the stop's write holds it.
    engine.store.create(PODS, engine.admission.admit_create(PODS, _pod("last"), "default"))
    newest = engine.store.resource_version
    await writer.stop()

    assert overlapped == [], "the stop's write ran beside the tick's, into the same temporary file"
    loaded = persist.load(path, CONFIG.name)
    assert loaded is not None
    assert loaded.resource_version == newest, "an older snapshot was renamed over the stop's"
    assert {obj["metadata"]["name"] for rt, obj in loaded.objects if rt == PODS} == {"first", "last"}
