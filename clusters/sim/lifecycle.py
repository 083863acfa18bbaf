"""Deletion as a real API server and garbage collector do it: grace periods and propagation.

Clients observe deletion through watches, and each propagation policy looks different there:
`Foreground` leaves the owner visible with a `deletionTimestamp` until its dependents are gone,
`Background` removes the owner at once and its dependents after, `Orphan` keeps the dependents and
strips their owner references. A running pod deleted with a grace period stays visible (with its
`deletionTimestamp`) until the simulated kubelet has stopped it. A `batch/v1` Job deleted without a
policy orphans its pods, as on a real server, which is why gpufed asks for `Foreground` explicitly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from clusters.sim import errors, podstatus
from clusters.sim.clock import Clock, parse_rfc3339, rfc3339
from clusters.sim.events import EventRecorder
from clusters.sim.resources import BATCH_JOBS, NAMESPACES, PODS, ResourceType
from clusters.sim.store import Change, EventType, Store, clone, edit
from clusters.sim.timers import Timers

Obj = dict[str, Any]
FOREGROUND = "Foreground"
BACKGROUND = "Background"
ORPHAN = "Orphan"
FOREGROUND_FINALIZER = "foregroundDeletion"
# A pod whose containers ignore SIGTERM (a trainer busy writing a checkpoint) stays Terminating for
# its whole grace period; without it containers exit within `termination_s` of being told to stop.
IGNORE_SIGTERM = "sim.gpufed.io/ignore-sigterm"
_STILL_EMPTYING = (
    "The system is ensuring all content is removed from this namespace.  Upon completion, this "
    "namespace will automatically be purged by the system."
)


def ignores_sigterm(pod: Obj) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(IGNORE_SIGTERM, "")).lower() == "true"


class Lifecycle:
    def __init__(
        self, store: Store, clock: Clock, timers: Timers, recorder: EventRecorder, termination_s: float
    ) -> None:
        self._store = store
        self._clock = clock
        self._timers = timers
        self._recorder = recorder
        self._termination_s = termination_s
        # Owners deleted in the foreground, by uid, waiting for their last dependent to go.
        self._waiting: dict[str, tuple[ResourceType, str, str]] = {}
        self._ready: set[str] = set()
        # Deleted, ended pods whose finalizers are gone, by uid: removed on the next sync.
        self._reap: dict[str, tuple[str, str]] = {}

    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        *,
        grace_s: float | None = None,
        propagation: str | None = None,
    ) -> Obj:
        obj = self._store.require(rt, namespace, name)
        if propagation is None:
            propagation = ORPHAN if rt is BATCH_JOBS else BACKGROUND
        if rt is NAMESPACES:
            return self._delete_namespace(obj)
        if rt is PODS:
            return self._delete_pod(obj, grace_s)
        uid = obj["metadata"]["uid"]
        dependents = self._store.dependents_of(uid)
        if propagation == FOREGROUND and dependents:
            if podstatus.is_deleting(obj):
                return obj
            # Only its metadata changes: the rest (a Volcano Job's whole spec) is shared.
            marked = edit(obj)
            m = marked["metadata"]
            m["deletionTimestamp"] = rfc3339(self._clock.wall_s())
            m["deletionGracePeriodSeconds"] = 0
            m["finalizers"] = [*m.get("finalizers", []), FOREGROUND_FINALIZER]
            marked = self._store.update(rt, marked)
            self._waiting[uid] = (rt, namespace, name)
            for dep in dependents:
                self._delete_quietly(*dep, propagation=BACKGROUND)
            return marked
        if propagation == ORPHAN:
            for dep_rt, dep_ns, dep_name in dependents:
                dependent = self._store.get(dep_rt, dep_ns, dep_name)
                if dependent is not None:
                    freed = clone(dependent)
                    refs = [r for r in freed["metadata"].get("ownerReferences", []) if r.get("uid") != uid]
                    freed["metadata"]["ownerReferences"] = refs
                    self._store.update(dep_rt, freed)
            return self._store.remove(rt, namespace, name)
        gone = self._store.remove(rt, namespace, name)
        for dep in dependents:
            self._delete_quietly(*dep, propagation=BACKGROUND)
        return gone

    def _delete_quietly(self, rt: ResourceType, namespace: str, name: str, *, propagation: str) -> None:
        if self._store.get(rt, namespace, name) is not None:
            self.delete(rt, namespace, name, propagation=propagation)

    def _delete_pod(self, pod: Obj, grace_s: float | None) -> Obj:
        m = pod["metadata"]
        if grace_s is None:
            grace_s = float(pod.get("spec", {}).get("terminationGracePeriodSeconds", 30))
        running = podstatus.node_name(pod) is not None and not podstatus.is_terminal(pod)
        held = bool(m.get("finalizers"))
        if (grace_s <= 0 or not running) and not held:
            return self._store.remove(PODS, m.get("namespace", ""), m["name"])
        if podstatus.is_deleting(pod):
            return pod
        marked = edit(pod)
        wait_s = grace_s if running else 0.0
        marked["metadata"]["deletionTimestamp"] = rfc3339(self._clock.wall_s() + wait_s)
        marked["metadata"]["deletionGracePeriodSeconds"] = int(wait_s)
        marked = self._store.update(PODS, marked)
        if not running:
            # Already ended: it goes as soon as its finalizers are removed (see `observe`).
            return marked
        for c in podstatus.containers(pod):
            self._recorder.record(
                PODS,
                marked,
                "Killing",
                f"Stopping container {c.get('name')}",
                component="kubelet",
                field_path=f"spec.containers{{{c.get('name')}}}",
            )
        # Containers exit promptly on SIGTERM unless marked as ignoring it: those are killed
        # (SIGKILL, exit 137) only when the grace period ends, as a real kubelet does.
        stop_after_s = grace_s if ignores_sigterm(pod) else min(grace_s, self._termination_s)
        self._timers.after(stop_after_s, self._stopper(pod))
        return marked

    def _stopper(self, pod: Obj) -> Callable[[], None]:
        """What ends a pod's graceful deletion: its containers killed, then (no finalizer) the pod gone."""
        m = pod["metadata"]
        uid = m["uid"]
        namespace, name = m.get("namespace", ""), m["name"]

        def stopped() -> None:
            current = self._store.get(PODS, namespace, name)
            if current is None or current["metadata"]["uid"] != uid:
                return
            if not podstatus.is_terminal(current):
                # The kubelet reports the killed containers before the pod object goes, so that
                # controllers (the Job's failure policy) see how it ended.
                current = self._store.update(
                    PODS, podstatus.terminated(current, self._clock.wall_s(), exit_code=137)
                )
            if not current["metadata"].get("finalizers"):
                self._store.remove(PODS, namespace, name)

        return stopped

    def _delete_namespace(self, ns: Obj) -> Obj:
        """The first delete marks it Terminating (the namespace controller, `namespaces.py`,
        empties it and lets it go); one while it empties is a conflict, as on a real server."""
        if ns["metadata"].get("deletionTimestamp"):
            raise errors.conflict(NAMESPACES, ns["metadata"]["name"], _STILL_EMPTYING)
        marked = clone(ns)
        marked["metadata"]["deletionTimestamp"] = rfc3339(self._clock.wall_s())
        marked["status"] = {"phase": "Terminating"}
        return self._store.update(NAMESPACES, marked)

    def resume(self, pods: list[Obj]) -> None:
        """Take up the graceful deletions of a cluster restored from a snapshot: a running pod marked
        for deletion stops when it would have (see `_delete_pod`), counted from when it was marked
        (its deletionTimestamp less its grace period), or at once when that time has passed."""
        wall_now = self._clock.wall_s()
        for pod in pods:
            m = pod["metadata"]
            if not m.get("deletionTimestamp") or podstatus.is_terminal(pod) or not podstatus.node_name(pod):
                continue
            grace_s = float(m.get("deletionGracePeriodSeconds") or 0)
            marked_s = parse_rfc3339(m["deletionTimestamp"]) - grace_s
            stop_after_s = grace_s if ignores_sigterm(pod) else min(grace_s, self._termination_s)
            self._timers.after(marked_s + stop_after_s - wall_now, self._stopper(pod))

    def observe(self, change: Change) -> None:
        if change.rt is PODS and change.type is EventType.MODIFIED:
            # A deleted pod that has ended goes once its last finalizer is removed, by whoever.
            m = change.obj["metadata"]
            if (
                m.get("deletionTimestamp")
                and not m.get("finalizers")
                and (podstatus.is_terminal(change.obj) or podstatus.node_name(change.obj) is None)
            ):
                self._reap[m["uid"]] = (m.get("namespace", ""), m["name"])
            return
        if change.type is not EventType.DELETED or not self._waiting:
            return
        for ref in change.obj["metadata"].get("ownerReferences") or []:
            uid = ref.get("uid")
            if uid in self._waiting and not self._store.dependents_of(uid):
                self._ready.add(uid)

    def sync(self) -> bool:
        """Remove foreground-deleted owners whose last dependent has gone, and released pods."""
        if not self._ready and not self._reap:
            return False
        reap, self._reap = self._reap, {}
        for uid, (namespace, name) in reap.items():
            pod = self._store.get(PODS, namespace, name)
            if pod is not None and pod["metadata"]["uid"] == uid:
                self._store.remove(PODS, namespace, name)
        ready, self._ready = self._ready, set()
        for uid in ready:
            rt, namespace, name = self._waiting.pop(uid)
            current = self._store.get(rt, namespace, name)
            if current is not None and current["metadata"]["uid"] == uid:
                self._store.remove(rt, namespace, name)
        return True
