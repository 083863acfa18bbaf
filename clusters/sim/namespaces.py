"""Namespace deletion as a real cluster does it: gradually, by the namespace controller.

`DELETE namespace` only marks it: a `deletionTimestamp`, `status.phase: Terminating`, and the
`kubernetes` finalizer in `spec.finalizers` holds it. While it is Terminating, the admission step
refuses every create in it with `403 Forbidden` (cause `NamespaceTerminating`). This controller then
deletes everything in it (owners in the background, pods gracefully, so they stop as the kubelet
stops them), and once nothing is left it removes its finalizer (`namespaces/finalize`) and the
namespace goes. Clients see each step: gpufed's backend backs off on the 403 and makes the
namespace again once it is gone; `kubectl delete namespace` waits for it to vanish.
"""

from __future__ import annotations

from typing import Any

import structlog

from clusters.sim import errors, podstatus
from clusters.sim.clock import Clock, rfc3339
from clusters.sim.lifecycle import BACKGROUND, Lifecycle
from clusters.sim.resources import EVENTS, NAMESPACES, ResourceType
from clusters.sim.store import Change, EventType, Store, clone

Obj = dict[str, Any]
log = structlog.get_logger("gpufed.clusters.sim")

KUBERNETES_FINALIZER = "kubernetes"


def deletion_conditions(remaining: list[tuple[ResourceType, Obj]]) -> list[tuple[str, str, str, str]]:
    """(type, status, reason, message) of each condition a real namespace controller reports."""
    counts: dict[str, int] = {}
    held: dict[str, int] = {}
    for rt, obj in remaining:
        resource = f"{rt.plural}.{rt.group}"
        counts[resource] = counts.get(resource, 0) + 1
        for finalizer in obj["metadata"].get("finalizers") or []:
            held[finalizer] = held.get(finalizer, 0) + 1
    content = (
        (
            "True",
            "SomeResourcesRemain",
            "Some resources are remaining: "
            + ", ".join(f"{r} has {n} resource instances" for r, n in sorted(counts.items())),
        )
        if counts
        else ("False", "ContentRemoved", "All content successfully removed")
    )
    finalizers = (
        (
            "True",
            "SomeFinalizersRemain",
            "Some content in the namespace has finalizers remaining: "
            + ", ".join(f"{f} in {n} resource instances" for f, n in sorted(held.items())),
        )
        if held
        else ("False", "ContentHasNoFinalizers", "All content-preserving finalizers finished")
    )
    return [
        (
            "NamespaceDeletionDiscoveryFailure",
            "False",
            "ResourcesDiscovered",
            "All resources successfully discovered",
        ),
        (
            "NamespaceDeletionGroupVersionParsingFailure",
            "False",
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed",
        ),
        (
            "NamespaceDeletionContentFailure",
            "False",
            "ContentDeleted",
            "All content successfully deleted, may be waiting on finalization",
        ),
        ("NamespaceContentRemaining", *content),
        ("NamespaceFinalizersRemaining", *finalizers),
    ]


class NamespaceController:
    """Empties Terminating namespaces, then lets them go."""

    def __init__(self, store: Store, clock: Clock, lifecycle: Lifecycle) -> None:
        self._store = store
        self._clock = clock
        self._lifecycle = lifecycle
        self._terminating: set[str] = set()
        self._dirty: set[str] = set()

    def observe(self, change: Change) -> None:
        obj = change.obj
        m = obj["metadata"]
        if change.rt is NAMESPACES:
            if change.type is EventType.DELETED:
                self._terminating.discard(m["name"])
            elif m.get("deletionTimestamp"):
                self._terminating.add(m["name"])
                self._dirty.add(m["name"])
            return
        namespace = m.get("namespace")
        if namespace in self._terminating and change.rt is not EVENTS:
            # Something in it went or changed (a finalizer removed): look again.
            self._dirty.add(namespace)

    def sync(self) -> bool:
        if not self._dirty:
            return False
        dirty, self._dirty = self._dirty, set()
        for name in sorted(dirty):
            ns = self._store.get(NAMESPACES, "", name)
            if ns is not None and ns["metadata"].get("deletionTimestamp"):
                self._empty(ns)
        return True

    def _empty(self, ns: Obj) -> None:
        name = ns["metadata"]["name"]
        # Every delete goes out in one pass, before any other controller syncs: owners (Jobs) are
        # removed at once and their pods deleted in the background, so no controller tries to
        # replace a pod in the namespace.
        for rt, namespace, obj_name in self._store.namespaces_in_use(name):
            obj = self._store.get(rt, namespace, obj_name)
            if obj is None or podstatus.is_deleting(obj):
                continue
            self._delete(rt, namespace, obj_name)
        left = self._store.namespaces_in_use(name)
        remaining = [(rt, self._store.get(rt, ns_, n)) for rt, ns_, n in left if rt is not EVENTS]
        ns = self._report(ns, [(rt, obj) for rt, obj in remaining if obj is not None])
        if remaining:
            return
        for rt, namespace, obj_name in left:
            self._store.remove(rt, namespace, obj_name)
        finalized = clone(ns)
        spec = finalized.setdefault("spec", {})
        if KUBERNETES_FINALIZER in (spec.get("finalizers") or []):
            spec["finalizers"] = [f for f in spec["finalizers"] if f != KUBERNETES_FINALIZER]
            finalized = self._store.update(NAMESPACES, finalized)
        if spec.get("finalizers") or finalized["metadata"].get("finalizers"):
            # Another finalizer holds it; whoever owns that removes it (an update brings us back).
            return
        self._store.remove(NAMESPACES, "", name)
        log.info("sim_namespace_deleted", namespace=name)

    def _report(self, ns: Obj, remaining: list[tuple[ResourceType, Obj]]) -> Obj:
        """The namespace's deletion conditions, as the namespace controller writes them (kubectl
        describe shows them); written only when one changes."""
        wanted = deletion_conditions(remaining)
        old = {c.get("type"): c for c in (ns.get("status") or {}).get("conditions") or []}
        now = rfc3339(self._clock.wall_s())
        conditions = []
        for kind, status, reason, message in wanted:
            before = old.get(kind) or {}
            same = (before.get("status"), before.get("reason"), before.get("message")) == (
                status,
                reason,
                message,
            )
            stamp = before.get("lastTransitionTime", now) if same else now
            conditions.append(
                {
                    "type": kind,
                    "status": status,
                    "lastTransitionTime": stamp,
                    "reason": reason,
                    "message": message,
                }
            )
        if conditions == list(old.values()):
            return ns
        reported = clone(ns)
        reported.setdefault("status", {})["conditions"] = conditions
        return self._store.update(NAMESPACES, reported)

    def _delete(self, rt: ResourceType, namespace: str, name: str) -> None:
        try:
            self._lifecycle.delete(rt, namespace, name, propagation=BACKGROUND)
        except errors.ApiError:
            # Gone meanwhile with its owner: nothing left to do for it.
            return
