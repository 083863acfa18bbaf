"""The simulated kubelet: runs every bound pod for its simulated duration and reports how it ended.

A real kubelet would start the containers; this one reads two annotations instead
(`sim.gpufed.io/duration` in seconds and `sim.gpufed.io/exit-code`), so tests and benchmarks decide
how long each pod runs and how it ends. It enforces `activeDeadlineSeconds` from the pod's start
time, as a real kubelet does, and writes the same status fields (phase, conditions, container
states, start time, IPs) that clients read.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

from clusters.sim import podstatus
from clusters.sim.clock import Clock
from clusters.sim.events import EventRecorder
from clusters.sim.resources import NODES, PODS
from clusters.sim.store import Change, EventType, Key, Store, key_of
from clusters.sim.timers import Timers

Obj = dict[str, Any]
DURATION_ANNOTATION = "sim.gpufed.io/duration"
EXIT_CODE_ANNOTATION = "sim.gpufed.io/exit-code"


def duration_s(pod: Obj, default_s: float) -> float:
    text = (pod["metadata"].get("annotations") or {}).get(DURATION_ANNOTATION)
    try:
        return max(0.0, float(text)) if text is not None else default_s
    except ValueError:
        return default_s


def exit_code(pod: Obj) -> int:
    text = (pod["metadata"].get("annotations") or {}).get(EXIT_CODE_ANNOTATION)
    try:
        return int(text) if text is not None else 0
    except ValueError:
        return 1


class Kubelet:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        timers: Timers,
        recorder: EventRecorder,
        *,
        default_duration_s: float,
        container_start_s: float,
    ) -> None:
        self._store = store
        self._clock = clock
        self._timers = timers
        self._recorder = recorder
        self._default_duration_s = default_duration_s
        self._container_start_s = container_start_s
        self._to_start: dict[Key, str] = {}
        self._starting: set[str] = set()
        self._ips = itertools.count(2)

    def observe(self, change: Change) -> None:
        if change.rt is not PODS or change.type is EventType.DELETED:
            return
        pod = change.obj
        if (
            podstatus.node_name(pod)
            and podstatus.phase(pod) == "Pending"
            and not podstatus.is_deleting(pod)
            and pod["metadata"]["uid"] not in self._starting
        ):
            self._to_start[key_of(pod)] = pod["metadata"]["uid"]

    def sync(self) -> bool:
        if not self._to_start:
            return False
        batch, self._to_start = self._to_start, {}
        for key, uid in batch.items():
            self._starting.add(uid)
            self._timers.after(self._container_start_s, functools.partial(self._start, key, uid))
        return True

    def _current(self, key: Key, uid: str) -> Obj | None:
        pod = self._store.get(PODS, *key)
        return pod if pod is not None and pod["metadata"]["uid"] == uid else None

    def _start(self, key: Key, uid: str) -> None:
        self._starting.discard(uid)
        pod = self._current(key, uid)
        if pod is None or podstatus.phase(pod) != "Pending" or podstatus.is_deleting(pod):
            return
        node_name = podstatus.node_name(pod) or ""
        node = self._store.get(NODES, "", node_name)
        host_ip = _host_ip(node)
        n = next(self._ips)
        pod_ip = f"10.244.{(n >> 8) & 255}.{n & 255}"
        started = self._store.update(PODS, podstatus.running(pod, self._clock.wall_s(), host_ip, pod_ip))
        for c in podstatus.containers(started):
            self._recorder.record(
                PODS,
                started,
                "Started",
                f"Started container {c.get('name')}",
                component="kubelet",
                field_path=f"spec.containers{{{c.get('name')}}}",
            )
        now = self._clock.now_s()
        self._timers.at(now + duration_s(started, self._default_duration_s), lambda: self._finish(key, uid))
        deadline = (started.get("spec") or {}).get("activeDeadlineSeconds")
        if deadline is not None:
            self._timers.at(now + float(deadline), lambda: self._deadline(key, uid))

    def _finish(self, key: Key, uid: str) -> None:
        pod = self._current(key, uid)
        if pod is None or podstatus.phase(pod) != "Running":
            return
        self._store.update(PODS, podstatus.terminated(pod, self._clock.wall_s(), exit_code=exit_code(pod)))

    def _deadline(self, key: Key, uid: str) -> None:
        pod = self._current(key, uid)
        if pod is None or podstatus.is_terminal(pod):
            return
        message = "Pod was active on the node longer than the specified deadline"
        ended = self._store.update(
            PODS,
            podstatus.terminated(
                pod, self._clock.wall_s(), exit_code=137, reason="DeadlineExceeded", message=message
            ),
        )
        self._recorder.record(PODS, ended, "DeadlineExceeded", message, warning=True, component="kubelet")


def _host_ip(node: Obj | None) -> str:
    for address in ((node or {}).get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address.get("address"))
    return "10.0.0.1"
