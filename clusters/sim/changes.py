"""Stored objects and committed changes: the copy helpers, a change as watchers see it, a watcher.

Split from `store` so that the store module holds only storage and history. Stored dicts are never
mutated after they are committed; writers `clone` (or `edit`) first, which lets a change, its
history entry and every queued watch event share one dict safely.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar, cast

import msgspec

from clusters.sim.resources import ResourceType
from clusters.sim.selectors import FieldSelector, LabelSelector

Obj = dict[str, Any]
# (namespace, name); the namespace is "" for cluster-scoped objects.
Key = tuple[str, str]
T = TypeVar("T")
# JSON out of the simulated API server (watch lines, answers): msgspec's encoder writes a pod in
# about a twentieth of json.dumps' time, the same document (compact, UTF-8 rather than \u escapes);
# json.dumps of every watch event was a tenth of the simulator's CPU in bench/scale.py.
encode_json = msgspec.json.encode


class EventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"
    ERROR = "ERROR"


# What a JSON object's values mostly are: returned as they are, without a call each. A quarter of
# the simulator's CPU in bench/scale.py was `clone`, most of it the call per string leaf; this form
# copies a pod in 20 us instead of 28.
_LEAVES = frozenset({str, int, bool, float, type(None)})


def _clone(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v if type(v) in _LEAVES else _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [v if type(v) in _LEAVES else _clone(v) for v in value]
    return value


def clone(value: T) -> T:
    """A deep copy of JSON data; several times faster than `copy.deepcopy` on API objects."""
    return cast(T, _clone(value))


def edit(obj: Obj, *parts: str) -> Obj:
    """A copy to change: `metadata` and the named top-level parts deep, the rest shared.

    Cheaper than `clone` on hot paths (a status update need not copy the pod's spec); safe because
    committed objects are never mutated and the store only sets top-level metadata fields. The
    metadata's `managedFields` is shared too: it is only ever replaced whole (`apply.record_update`),
    and it mirrors every field set, so copying it was most of a Volcano Job's copy at each status
    update (a fifth of the simulator's CPU in bench/scale.py at 100 clusters).
    """
    new = dict(obj)
    new["metadata"] = {
        k: v if k == "managedFields" or type(v) in _LEAVES else _clone(v)
        for k, v in (obj.get("metadata") or {}).items()
    }
    for part in parts:
        if part in obj:
            new[part] = clone(obj[part])
    return new


def meta(obj: Obj) -> Obj:
    m: Obj | None = obj.get("metadata")
    if m is None:
        m = obj["metadata"] = {}
    return m


def key_of(obj: Obj) -> Key:
    m = obj.get("metadata") or {}
    return (m.get("namespace") or "", m.get("name") or "")


@dataclass(slots=True)
class Change:
    """One committed change, as history keeps it and watchers receive it."""

    rv: int
    type: EventType
    rt: ResourceType
    obj: Obj
    # The object before the change, so that a selector watch can turn a change into ADDED or DELETED.
    old: Obj | None
    _lines: dict[EventType, bytes] = field(default_factory=dict)

    def line(self, as_type: EventType) -> bytes:
        """The watch line, serialised once and shared by every watcher that gets it."""
        cached = self._lines.get(as_type)
        if cached is None:
            cached = b'{"type":"%s","object":%s}\n' % (as_type.value.encode(), encode_json(self.obj))
            self._lines[as_type] = cached
        return cached


class ResourceGone(Exception):
    """A watch asked to resume from before the history window."""


class Watcher:
    """One open watch: its filter and its queue. `None` in the queue ends the watch."""

    def __init__(self, rt: ResourceType, namespace: str | None, labels: LabelSelector, fields: FieldSelector):
        self.rt = rt
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.queue: asyncio.Queue[tuple[EventType, Change] | None] = asyncio.Queue()
        self.closed = False

    def _matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        m = obj.get("metadata") or {}
        if self.namespace and m.get("namespace") != self.namespace:
            return False
        return self.labels.matches(m.get("labels")) and self.fields.matches(obj)

    def offer(self, change: Change) -> None:
        if self.closed:
            return
        now = self._matches(change.obj)
        if change.type is EventType.MODIFIED:
            before = self._matches(change.old)
            if now and before:
                self.queue.put_nowait((EventType.MODIFIED, change))
            elif now:
                self.queue.put_nowait((EventType.ADDED, change))
            elif before:
                self.queue.put_nowait((EventType.DELETED, change))
        elif now:
            self.queue.put_nowait((change.type, change))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)
