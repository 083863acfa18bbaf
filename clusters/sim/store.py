"""The simulated API server's storage: objects, one resourceVersion counter, history and watches.

Clients (the python client's `Watch`, kubectl, the gpufed backend's informers) resume watches from
the resourceVersion they last saw and list again on `410 Gone`. The store keeps one history of
changes across all types with a single increasing counter, compacted as etcd is (`_compact`), and a
per-kind window as the API server's watch cache (`watchcache`); a resume from before either is Gone.

Watch fan-out is one `asyncio.Queue` per watcher, filled synchronously when a change is committed:
a change costs one pass over that type's watchers, never a scan of the objects. Lists narrow by
namespace, by the label index (for `key=value` selectors) and by the pods-per-node index. Stored
dicts are never mutated after they are committed (see `changes`).
"""

from __future__ import annotations

import builtins
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from clusters.sim import canonical, errors
from clusters.sim.changes import Change as Change
from clusters.sim.changes import EventType as EventType
from clusters.sim.changes import Key as Key
from clusters.sim.changes import ResourceGone as ResourceGone
from clusters.sim.changes import Watcher as Watcher
from clusters.sim.changes import clone as clone
from clusters.sim.changes import edit as edit
from clusters.sim.changes import key_of as key_of
from clusters.sim.changes import meta as meta
from clusters.sim.clock import rfc3339
from clusters.sim.resources import ALL, BATCH_JOBS, POD_GROUPS, PODS, QUEUES, VOLCANO_JOBS, ResourceType
from clusters.sim.selectors import EVERYTHING, NO_FIELDS, FieldSelector, LabelSelector
from clusters.sim.watchcache import WatchWindows

Obj = dict[str, Any]
# kube-apiserver asks etcd to compact every five minutes (`--etcd-compaction-interval`).
COMPACTION_INTERVAL_S = 300.0
Ref = tuple[ResourceType, str, str]


# The kinds whose server strategy keeps `metadata.generation` (bumped when the spec changes):
# pods (since PodObservedGenerationTracking), Jobs and every custom resource. ConfigMaps, Nodes,
# Namespaces, Services, Events, Leases and PriorityClasses have none.
GENERATION_KINDS = frozenset({PODS, BATCH_JOBS, VOLCANO_JOBS, POD_GROUPS, QUEUES})


def _spec_for_generation(rt: ResourceType, obj: Obj) -> Any:
    """The spec as generation sees it: binding a pod to a node is not a spec change."""
    spec = obj.get("spec")
    if rt is PODS and isinstance(spec, dict) and "nodeName" in spec:
        return {k: v for k, v in spec.items() if k != "nodeName"}
    return spec


class Store:
    def __init__(
        self,
        wall_s: Callable[[], float],
        history_limit: int = 20000,
        compaction_interval_s: float = COMPACTION_INTERVAL_S,
    ) -> None:
        self._wall_s = wall_s
        self._rv = 1
        self._objects: dict[ResourceType, dict[str, dict[str, Obj]]] = {rt: {} for rt in ALL}
        self._labels: dict[ResourceType, dict[tuple[str, str], set[Key]]] = {rt: {} for rt in ALL}
        self._pods_by_node: dict[str, set[Key]] = {}
        self._dependents: dict[str, set[Ref]] = {}
        self._history: deque[Change] = deque()
        self._history_limit = max(1, history_limit)
        self._compacted_rv = 0
        self._windows = WatchWindows(wall_s)
        # etcd as kube-apiserver runs it: every interval, compact to the revision of the last tick.
        self._compaction_interval_s = compaction_interval_s
        self._tick_s = wall_s()
        self._tick_rv = self._rv
        self._watchers: dict[ResourceType, set[Watcher]] = {rt: set() for rt in ALL}
        self._listeners: list[Callable[[Change], None]] = []

    # -- reading ------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj | None:
        return self._objects[rt].get(namespace if rt.namespaced else "", {}).get(name)

    def require(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        obj = self.get(rt, namespace, name)
        if obj is None:
            raise errors.not_found(rt, name)
        return obj

    def list(
        self,
        rt: ResourceType,
        namespace: str | None = None,
        labels: LabelSelector = EVERYTHING,
        fields: FieldSelector = NO_FIELDS,
    ) -> builtins.list[Obj]:
        """Matching objects sorted by namespace and name, as a real API server returns them."""
        candidates = self._candidates(rt, namespace, labels, fields)
        out = [o for o in candidates if labels.matches(meta(o).get("labels")) and fields.matches(o)]
        out.sort(key=key_of)
        return out

    def _candidates(
        self, rt: ResourceType, namespace: str | None, labels: LabelSelector, fields: FieldSelector
    ) -> Iterable[Obj]:
        by_ns = self._objects[rt]
        name = fields.value_of("metadata.name")
        if name is not None:
            spaces = [namespace] if namespace else list(by_ns)
            return [o for ns in spaces if (o := by_ns.get(ns, {}).get(name)) is not None]
        node = fields.value_of("spec.nodeName") if rt is PODS else None
        keys: set[Key] | None = None
        if node:
            keys = self._pods_by_node.get(node, set())
        for pair in labels.equalities():
            found = self._labels[rt].get(pair, set())
            keys = found if keys is None else keys & found
        if keys is not None:
            return [
                o
                for ns, n in keys
                if (namespace is None or ns == namespace) and (o := by_ns.get(ns, {}).get(n)) is not None
            ]
        if namespace is not None and rt.namespaced:
            return list(by_ns.get(namespace, {}).values())
        return [o for objs in by_ns.values() for o in objs.values()]

    def list_at(
        self,
        rt: ResourceType,
        rv: int,
        namespace: str | None = None,
        labels: LabelSelector = EVERYTHING,
        fields: FieldSelector = NO_FIELDS,
    ) -> builtins.list[Obj]:
        """The list as it was at `rv` (`resourceVersionMatch=Exact`), rebuilt by undoing history.

        Raises `ResourceGone` when `rv` is older than the history window, as a real server answers
        410 for a compacted revision.
        """
        self._compact()
        if rv < self._compacted_rv:
            raise ResourceGone(f"too old resource version: {rv} ({self._compacted_rv})")
        state = {key_of(o): o for o in self._candidates(rt, namespace, EVERYTHING, NO_FIELDS)}
        for change in reversed(self._history):
            if change.rv <= rv:
                break
            if change.rt is not rt:
                continue
            key = key_of(change.obj)
            if change.type is EventType.ADDED:
                state.pop(key, None)
            elif change.old is not None:
                state[key] = change.old
        out = [
            o
            for k, o in state.items()
            if (namespace is None or not rt.namespaced or k[0] == namespace)
            and labels.matches(meta(o).get("labels"))
            and fields.matches(o)
        ]
        out.sort(key=key_of)
        return out

    @property
    def compacted_rv(self) -> int:
        """The newest resourceVersion no longer in history: older resumes and exact lists get 410."""
        return self._compacted_rv

    def count(self, rt: ResourceType) -> int:
        return sum(len(objs) for objs in self._objects[rt].values())

    def pods_on_node(self, node: str) -> builtins.list[Obj]:
        return [o for ns, n in self._pods_by_node.get(node, ()) if (o := self.get(PODS, ns, n)) is not None]

    def dependents_of(self, uid: str) -> builtins.list[Ref]:
        return sorted(self._dependents.get(uid, ()), key=lambda r: (r[0].kind, r[1], r[2]))

    def namespaces_in_use(self, namespace: str) -> builtins.list[Ref]:
        return [
            (rt, namespace, name)
            for rt in ALL
            if rt.namespaced
            for name in self._objects[rt].get(namespace, {})
        ]

    # -- writing ------------------------------------------------------------------------------

    def create(self, rt: ResourceType, obj: Obj, *, dry_run: bool = False) -> Obj:
        """Commit a new object, stamping uid, creationTimestamp and resourceVersion.

        With `dry_run` the object is checked and stamped as it would be, but nothing is stored, no
        resourceVersion is used and nobody is told (`dryRun=All`): its resourceVersion is empty.
        """
        m = meta(obj)
        ns = (m.get("namespace") or "") if rt.namespaced else ""
        name = m.get("name") or ""
        if name in self._objects[rt].get(ns, {}):
            raise errors.already_exists(rt, name)
        if not rt.namespaced:
            m.pop("namespace", None)
        if not m.get("uid"):
            m["uid"] = str(uuid.uuid4())
        # The server stamps creation itself: a client's value (even `null`, which the python client
        # and kubectl send for an unset time) is ignored.
        m["creationTimestamp"] = rfc3339(self._wall_s())
        if rt in GENERATION_KINDS:
            m["generation"] = 1
        else:
            m.pop("generation", None)
        canonical.quantities(rt, obj)
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        if dry_run:
            m.pop("resourceVersion", None)
            return obj
        rv = self._next_rv()
        m["resourceVersion"] = str(rv)
        self._objects[rt].setdefault(ns, {})[name] = obj
        self._index(rt, None, obj)
        self._commit(Change(rv, EventType.ADDED, rt, obj, None))
        return obj

    def update(
        self, rt: ResourceType, obj: Obj, *, expect_rv: str | None = None, dry_run: bool = False
    ) -> Obj:
        """Replace an object. An update that changes nothing is a no-op, as on a real server.

        With `dry_run` the result is returned as it would be, keeping the current resourceVersion,
        and nothing is stored or announced.
        """
        ns, name = key_of(obj)
        ns = ns if rt.namespaced else ""
        old = self.get(rt, ns, name)
        if old is None:
            raise errors.not_found(rt, name)
        old_meta = old["metadata"]
        if expect_rv and expect_rv != old_meta["resourceVersion"]:
            raise errors.conflict(
                rt,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        m = meta(obj)
        canonical.quantities(rt, obj)
        # Identity and bookkeeping fields belong to the server.
        for fixed in ("uid", "creationTimestamp", "namespace"):
            if fixed in old_meta:
                m[fixed] = old_meta[fixed]
        if not rt.namespaced:
            m.pop("namespace", None)
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        m["resourceVersion"] = old_meta["resourceVersion"]
        if rt not in GENERATION_KINDS:
            m.pop("generation", None)
        elif _spec_for_generation(rt, obj) != _spec_for_generation(rt, old):
            m["generation"] = int(old_meta.get("generation", 1)) + 1
        else:
            m["generation"] = old_meta.get("generation", 1)
        if obj == old:
            return old
        if dry_run:
            return obj
        rv = self._next_rv()
        m["resourceVersion"] = str(rv)
        self._objects[rt][ns][name] = obj
        self._index(rt, old, obj)
        self._commit(Change(rv, EventType.MODIFIED, rt, obj, old))
        return obj

    def remove(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        ns = namespace if rt.namespaced else ""
        old = self._objects[rt].get(ns, {}).get(name)
        if old is None:
            raise errors.not_found(rt, name)
        del self._objects[rt][ns][name]
        if not self._objects[rt][ns]:
            del self._objects[rt][ns]
        self._index(rt, old, None)
        rv = self._next_rv()
        gone = dict(old)
        gone["metadata"] = dict(old["metadata"], resourceVersion=str(rv))
        self._commit(Change(rv, EventType.DELETED, rt, gone, old))
        return gone

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _compact(self) -> None:
        """Drop the history older than the previous compaction tick, as etcd's periodic compactor.

        History therefore spans one to two intervals of cluster time (and at most `history_limit`
        changes); a watch or exact list from before it gets `410 Gone`, as on a real cluster.
        """
        now = self._wall_s()
        if now - self._tick_s < self._compaction_interval_s:
            return
        target = self._tick_rv
        while self._history and self._history[0].rv <= target:
            self._history.popleft()
        self._compacted_rv = max(self._compacted_rv, target)
        self._tick_s, self._tick_rv = now, self._rv

    def start_watch_cache(self) -> None:
        """The API server starts serving: watches from before now are `410 Gone` from here on."""
        self._windows.start(self._rv)

    def _commit(self, change: Change) -> None:
        self._compact()
        self._windows.record(change.rt, change.rv)
        self._history.append(change)
        while len(self._history) > self._history_limit:
            self._compacted_rv = self._history.popleft().rv
        for watcher in self._watchers[change.rt]:
            watcher.offer(change)
        for listener in self._listeners:
            listener(change)

    def _index(self, rt: ResourceType, old: Obj | None, new: Obj | None) -> None:
        key = key_of(new if new is not None else old or {})
        old_labels = set(((old or {}).get("metadata") or {}).get("labels", {}).items())
        new_labels = set(((new or {}).get("metadata") or {}).get("labels", {}).items())
        index = self._labels[rt]
        for pair in old_labels - new_labels:
            bucket = index.get(pair)
            if bucket is not None:
                bucket.discard(key)
                if not bucket:
                    del index[pair]
        for pair in new_labels - old_labels:
            index.setdefault(pair, set()).add(key)
        ref = (rt, key[0], key[1])
        old_owners = {o.get("uid") for o in ((old or {}).get("metadata") or {}).get("ownerReferences") or []}
        new_owners = {o.get("uid") for o in ((new or {}).get("metadata") or {}).get("ownerReferences") or []}
        for uid in old_owners - new_owners:
            deps = self._dependents.get(str(uid))
            if deps is not None:
                deps.discard(ref)
                if not deps:
                    del self._dependents[str(uid)]
        for uid in new_owners - old_owners:
            self._dependents.setdefault(str(uid), set()).add(ref)
        if rt is PODS:
            old_node = ((old or {}).get("spec") or {}).get("nodeName")
            new_node = ((new or {}).get("spec") or {}).get("nodeName")
            if old_node != new_node:
                if old_node:
                    self._pods_by_node.get(old_node, set()).discard(key)
                if new_node:
                    self._pods_by_node.setdefault(new_node, set()).add(key)

    # -- persistence --------------------------------------------------------------------------

    def objects(self) -> builtins.list[tuple[ResourceType, Obj]]:
        """Every stored object with its type, for a snapshot (the dicts are never mutated later)."""
        return [(rt, obj) for rt in ALL for space in self._objects[rt].values() for obj in space.values()]

    def restore(self, objects: Iterable[tuple[ResourceType, Obj]], resource_version: int) -> None:
        """Load a snapshot's objects as they were stored (uids, resourceVersions, timestamps kept) into
        an empty store, and tell the listeners (the controllers) each one as ADDED, so that they take
        up the work the objects call for. No history: a watch from before the restore is `410 Gone`,
        and its client lists again, as after an API server restart."""
        loaded = list(objects)
        self._rv = max(self._rv, resource_version)
        self._compacted_rv = self._tick_rv = self._rv
        for rt, obj in loaded:
            key = key_of(obj)
            self._objects[rt].setdefault(key[0] if rt.namespaced else "", {})[key[1]] = obj
            self._index(rt, None, obj)
        for rt, obj in loaded:
            change = Change(int(meta(obj).get("resourceVersion") or 0), EventType.ADDED, rt, obj, None)
            for listener in self._listeners:
                listener(change)

    # -- watching -----------------------------------------------------------------------------

    def add_listener(self, listener: Callable[[Change], None]) -> None:
        """Called synchronously after every commit; listeners must not write to the store."""
        self._listeners.append(listener)

    def watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        since_rv: int | None,
    ) -> Watcher:
        """A watcher primed with what it missed: every object (no resourceVersion) or the history."""
        self._compact()
        oldest = max(self._compacted_rv, self._windows.floor(rt))
        if since_rv is not None and since_rv < oldest:
            raise ResourceGone(f"too old resource version: {since_rv} ({oldest})")
        watcher = Watcher(rt, namespace, labels, fields)
        if since_rv is None:
            for obj in self.list(rt, namespace, labels, fields):
                rv = int(obj["metadata"]["resourceVersion"])
                watcher.queue.put_nowait((EventType.ADDED, Change(rv, EventType.ADDED, rt, obj, None)))
        else:
            for change in self._history:
                if change.rv > since_rv and change.rt is rt:
                    watcher.offer(change)
        self._watchers[rt].add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self._watchers[watcher.rt].discard(watcher)
        watcher.close()

    def close_watches(self) -> None:
        for watchers in self._watchers.values():
            for watcher in list(watchers):
                watcher.close()
            watchers.clear()
