"""The pod garbage collector of kube-controller-manager, as far as the simulator needs it.

Without it a pod bound to a node that was deleted would stay Running forever, and a cluster that
runs many short pods would keep every ended one. Like the real one it force-deletes pods bound to
a node that no longer exists, after marking them Failed with `DisruptionTarget`
(`DeletionByPodGC`), and deletes the oldest ended pods once there are more than
`terminated_threshold` of them (kube-controller-manager's `--terminated-pod-gc-threshold`).
The real collector looks every 20 s; this one acts in the next round, which only makes it prompter.
"""

from __future__ import annotations

from typing import Any

from clusters.sim import podstatus
from clusters.sim.clock import Clock
from clusters.sim.lifecycle import Lifecycle
from clusters.sim.resources import NODES, PODS
from clusters.sim.store import Change, EventType, Key, Store, key_of

Obj = dict[str, Any]


class PodGC:
    def __init__(self, store: Store, clock: Clock, lifecycle: Lifecycle, terminated_threshold: int) -> None:
        self._store = store
        self._clock = clock
        self._lifecycle = lifecycle
        self._threshold = max(1, terminated_threshold)
        # Pods to look at because their node may be gone, by key, with their uid.
        self._orphans: dict[Key, str] = {}
        self._gone_nodes: set[str] = set()
        # Ended pods in the order they ended, for the threshold.
        self._ended: dict[str, Key] = {}

    def observe(self, change: Change) -> None:
        if change.rt is NODES and change.type is EventType.DELETED:
            self._gone_nodes.add(change.obj["metadata"]["name"])
            return
        if change.rt is not PODS:
            return
        pod = change.obj
        uid = pod["metadata"]["uid"]
        if change.type is EventType.DELETED:
            self._ended.pop(uid, None)
            return
        if podstatus.is_terminal(pod):
            self._ended.setdefault(uid, key_of(pod))
        # Created bound, or bound later (the scheduler's node list is a cache: it may bind to a node
        # deleted in the same moment, after the node's own pods were looked at): a pod whose node is
        # gone is the collector's whenever it got there, as the real one finds it on every pass.
        node = podstatus.node_name(pod)
        if node and self._store.get(NODES, "", node) is None:
            self._orphans[key_of(pod)] = uid

    def sync(self) -> bool:
        worked = False
        for node in self._gone_nodes:
            for pod in self._store.pods_on_node(node):
                self._orphans[key_of(pod)] = pod["metadata"]["uid"]
        self._gone_nodes.clear()
        orphans, self._orphans = self._orphans, {}
        for key, uid in orphans.items():
            worked = self._collect(key, uid) or worked
        while len(self._ended) > self._threshold:
            oldest, key = next(iter(self._ended.items()))
            del self._ended[oldest]
            ended = self._store.get(PODS, *key)
            if ended is not None and ended["metadata"]["uid"] == oldest and not podstatus.is_deleting(ended):
                self._lifecycle.delete(PODS, *key, grace_s=0)
                worked = True
        return worked

    def _collect(self, key: Key, uid: str) -> bool:
        pod = self._store.get(PODS, *key)
        if pod is None or pod["metadata"]["uid"] != uid:
            return False
        node = podstatus.node_name(pod)
        if node is None or self._store.get(NODES, "", node) is not None:
            return False
        if not podstatus.is_terminal(pod):
            message = "PodGC: node no longer exists"
            pod = self._store.update(
                PODS,
                podstatus.disrupted(
                    pod,
                    self._clock.wall_s(),
                    condition_reason="DeletionByPodGC",
                    condition_message=message,
                    reason="NodeLost",
                    message=message,
                ),
            )
        self._lifecycle.delete(PODS, *key, grace_s=0)
        return True
