"""A simulated cluster's state on disk, so that it outlives the process that simulates it.

A real cluster keeps running while the federation's control plane restarts: its pods keep their uids,
their start times and their GPUs. The simulator of the embedded default is a child of `gpufed up` and
dies with it (SIGTERM, or the kernel's SIGKILL when `gpufed up` is killed), so each cluster writes a
snapshot of its objects (`<state-dir>/<cluster>.json`, written whole: a temporary file renamed over the
old one) at most every `interval_s` while its objects change, and once more when it stops. The next
simulator on the same state dir restores it (`Engine(restored=...)`): the same objects under the same
resourceVersion counter, the kubelet's and the controllers' work taken up again from them, and a
clock that counts the time the simulator was down as time the cluster ran (a pod meant to run 60 s that
had run 20 s when the simulator stopped, restarted 10 s later, ends 30 s after the restart).

What a snapshot cannot hold: the changes of the last `interval_s` before a SIGKILL, and watch history
(clients resuming a watch get `410 Gone` and list again, as after an API server restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import structlog

from clusters.files import write_atomically
from clusters.sim.resources import ALL, ResourceType
from clusters.sim.store import Store

Obj = dict[str, Any]
log = structlog.get_logger("gpufed.clusters.sim")

FORMAT = 1
SNAPSHOT_INTERVAL_S = 0.2
WRITE_COST_FACTOR = 4.0
_TYPES = {f"{rt.group}/{rt.plural}": rt for rt in ALL}


def _type_key(rt: ResourceType) -> str:
    return f"{rt.group}/{rt.plural}"


@dataclass(frozen=True, slots=True)
class Snapshot:
    cluster: str
    resource_version: int
    # The simulated wall time, and the real one, when it was taken.
    sim_wall_s: float
    real_wall_s: float
    objects: tuple[tuple[ResourceType, Obj], ...]

    def sim_wall_now_s(self, time_scale: float) -> float:
        """The simulated wall time now, had the cluster run on since the snapshot."""
        return self.sim_wall_s + max(0.0, time.time() - self.real_wall_s) * time_scale


def snapshot_path(state_dir: Path, cluster: str) -> Path:
    return state_dir / f"{cluster}.json"


def take(cluster: str, store: Store, sim_wall_s: float) -> Snapshot:
    return Snapshot(cluster, store.resource_version, sim_wall_s, time.time(), tuple(store.objects()))


# An object's encoded entry in the snapshot's list, by the object's identity (with the object, which
# keeps that identity from being reused): committed objects are never mutated (clusters.sim.store), so
# an object that did not change since the last snapshot is not encoded again.
Fragments = dict[int, tuple[Obj, bytes]]


def encode(snapshot: Snapshot, fragments: Fragments | None = None) -> bytes:
    """The snapshot as JSON. With `fragments` (the last snapshot's, replaced in place by this one's),
    only the objects that changed since are encoded: the same bytes, for a tenth of the CPU of a busy
    cluster's snapshot, which was a tenth of the simulator's CPU in bench/scale.py (100 clusters, a
    snapshot each every 0.2 s while their objects change)."""
    # msgspec, not json: a cluster of 1,000 running pods is a 3.7 MB snapshot, which json.dumps took
    # 315 ms to encode (holding the GIL) on a loaded 2-core machine.
    head = msgspec.json.encode(
        {
            "format": FORMAT,
            "cluster": snapshot.cluster,
            "resourceVersion": snapshot.resource_version,
            "simWallSeconds": snapshot.sim_wall_s,
            "realWallSeconds": snapshot.real_wall_s,
            "objects": [],
        }
    )
    old = fragments if fragments is not None else {}
    new: Fragments = {}
    entries = []
    for rt, obj in snapshot.objects:
        kept = old.get(id(obj))
        if kept is not None and kept[0] is obj:
            entry = kept[1]
        else:
            entry = msgspec.json.encode({"type": _type_key(rt), "object": obj})
        new[id(obj)] = (obj, entry)
        entries.append(entry)
    if fragments is not None:
        fragments.clear()
        fragments.update(new)
    # The header ends `"objects":[]}`: the entries go between the brackets.
    return b"".join((head[:-2], b",".join(entries), head[-2:]))


class SnapshotError(Exception):
    """A snapshot file that cannot be read back: the cluster starts empty, and says so."""


def load(path: Path, cluster: str) -> Snapshot | None:
    """The snapshot at `path` (None when there is none). Raises `SnapshotError` when it is unreadable
    or of another cluster."""
    try:
        raw = msgspec.json.decode(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError) as e:
        raise SnapshotError(f"{path}: {e}") from e
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("cluster") != cluster:
        raise SnapshotError(f"{path}: not a format-{FORMAT} snapshot of cluster {cluster!r}")
    try:
        objects = tuple((_TYPES[o["type"]], o["object"]) for o in raw["objects"])
        return Snapshot(
            cluster,
            int(raw["resourceVersion"]),
            float(raw["simWallSeconds"]),
            float(raw["realWallSeconds"]),
            objects,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise SnapshotError(f"{path}: {type(e).__name__}: {e}") from e


def write(path: Path, snapshot: Snapshot, fragments: Fragments | None = None) -> None:
    """Write whole: a reader (the next simulator) never sees half a snapshot."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, encode(snapshot, fragments), durable=True)


class SnapshotWriter:
    """Writes the cluster's snapshot whenever its resourceVersion moved, at most every `interval_s`, and
    no more often than every `WRITE_COST_FACTOR` times the last write took: a big busy cluster spends
    at most about a fifth of its time on snapshots, and loses a little more on a SIGKILL."""

    def __init__(
        self, path: Path, cluster: str, store: Store, sim_wall_s: Callable[[], float], interval_s: float
    ) -> None:
        self._path = path
        self._cluster = cluster
        self._store = store
        self._sim_wall_s = sim_wall_s
        self._interval_s = interval_s
        self._written_rv = -1
        self._fragments: Fragments = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"sim-snapshots-{self._cluster}")

    async def _run(self) -> None:
        took_s = 0.0
        while True:
            await asyncio.sleep(max(self._interval_s, WRITE_COST_FACTOR * took_s))
            began = time.monotonic()
            try:
                await self.write_if_changed()
            except OSError as e:  # a full disk must not stop the cluster; the next tick tries again
                log.warning("sim_snapshot_failed", cluster=self._cluster, error=str(e))
            took_s = time.monotonic() - began

    async def write_if_changed(self) -> None:
        if self._store.resource_version == self._written_rv:
            return
        # Taken here, on the loop (committed objects are never mutated); encoded and written apart.
        snapshot = take(self._cluster, self._store, self._sim_wall_s())
        writing = asyncio.ensure_future(asyncio.to_thread(write, self._path, snapshot, self._fragments))
        try:
            await asyncio.shield(writing)
        except asyncio.CancelledError:
            # `stop` cancels the ticks, and a cancel cannot stop a thread: the write goes on. Until it
            # is done, nothing else may write, or stop's last write would share its temporary file
            # (one a process) and the older snapshot could be renamed over the newer one last.
            await asyncio.wait([writing])
            if not writing.cancelled() and (error := writing.exception()) is not None:
                log.warning("sim_snapshot_failed", cluster=self._cluster, error=str(error))
            raise
        self._written_rv = snapshot.resource_version

    async def stop(self) -> None:
        """Stop the ticks and write what changed since the last one."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.write_if_changed()
