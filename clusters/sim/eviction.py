"""Evictions: the API's `pods/eviction` subresource and the kubelet's node-pressure eviction.

They look different to clients, which is why they are two functions. An eviction through the API
(what `kubectl drain` sends) is a policy-checked delete: the pod gets `DisruptionTarget`
(`EvictionByEvictionAPI`) and a `deletionTimestamp`, its containers are stopped within the grace
period, and the object goes. A node-pressure eviction is the kubelet's own decision: the pod ends
Failed with reason `Evicted` and stays in the API until its owner or the pod garbage collector
deletes it. The simulator serves no PodDisruptionBudgets, so every API eviction is allowed.
"""

from __future__ import annotations

from typing import Any

from clusters.sim import podstatus
from clusters.sim.clock import Clock
from clusters.sim.events import EventRecorder
from clusters.sim.lifecycle import Lifecycle
from clusters.sim.resources import PODS
from clusters.sim.store import Store, edit

Obj = dict[str, Any]


def evict_by_api(
    store: Store, clock: Clock, lifecycle: Lifecycle, namespace: str, name: str, grace_s: float | None = None
) -> Obj:
    pod = store.require(PODS, namespace, name)
    if podstatus.is_deleting(pod):
        return pod
    if podstatus.node_name(pod) and not podstatus.is_terminal(pod):
        marked = edit(pod, "status")
        podstatus.set_condition(
            marked,
            podstatus.DISRUPTION_TARGET,
            "True",
            clock.wall_s(),
            "EvictionByEvictionAPI",
            "Eviction API: evicting",
        )
        store.update(PODS, marked)
    return lifecycle.delete(PODS, namespace, name, grace_s=grace_s)


def evict_by_kubelet(store: Store, clock: Clock, recorder: EventRecorder, namespace: str, name: str) -> Obj:
    pod = store.require(PODS, namespace, name)
    if podstatus.is_terminal(pod):
        return pod
    message = "The node was low on resource: memory. "
    ended = store.update(
        PODS,
        podstatus.disrupted(
            pod,
            clock.wall_s(),
            condition_reason="TerminationByKubelet",
            condition_message=message,
            reason="Evicted",
            message=message,
        ),
    )
    recorder.record(PODS, ended, "Evicted", message, warning=True, component="kubelet")
    for c in podstatus.containers(ended):
        recorder.record(
            PODS,
            ended,
            "Killing",
            f"Stopping container {c.get('name')}",
            component="kubelet",
            field_path=f"spec.containers{{{c.get('name')}}}",
        )
    return ended
