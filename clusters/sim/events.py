"""Core v1 Event objects, the way components report what they did (`kubectl get events`).

Every component of the simulator (scheduler, kubelet, controllers, fault injection) records through
one `EventRecorder`, which caps how many Events are kept so that a long benchmark does not grow
without bound: the oldest are deleted, as a real cluster expires them after an hour.
"""

from __future__ import annotations

import secrets
from collections import deque
from typing import Any

from clusters.sim.clock import Clock, rfc3339
from clusters.sim.resources import EVENTS, NAMESPACES, ResourceType
from clusters.sim.store import Store

Obj = dict[str, Any]


class EventRecorder:
    def __init__(self, store: Store, clock: Clock, limit: int, host: str) -> None:
        self._store = store
        self._clock = clock
        self._limit = max(1, limit)
        self._host = host
        self._kept: deque[tuple[str, str]] = deque()

    def adopt(self, events: list[tuple[str, str]]) -> None:
        """Count a restored snapshot's Events (namespace, name), oldest first, against the limit."""
        self._kept.extend(events)

    def record(
        self,
        rt: ResourceType,
        obj: Obj,
        reason: str,
        message: str,
        *,
        warning: bool = False,
        component: str,
        field_path: str | None = None,
    ) -> None:
        m = obj.get("metadata") or {}
        name = str(m.get("name", ""))
        namespace = str(m.get("namespace") or "default")
        wall_s = self._clock.wall_s()
        involved: Obj = {
            "kind": rt.kind,
            "apiVersion": rt.api_version,
            "namespace": m.get("namespace") or "",
            "name": name,
            "uid": m.get("uid", ""),
            "resourceVersion": m.get("resourceVersion", ""),
        }
        if field_path:
            involved["fieldPath"] = field_path
        event_name = f"{name}.{secrets.token_hex(8)}"
        event: Obj = {
            "metadata": {"name": event_name, "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "source": {"component": component, **({"host": self._host} if component == "kubelet" else {})},
            "firstTimestamp": rfc3339(wall_s),
            "lastTimestamp": rfc3339(wall_s),
            "eventTime": None,
            "count": 1,
            "reportingComponent": component,
            "reportingInstance": self._host,
        }
        home = self._store.get(NAMESPACES, "", namespace)
        if home is None or home["metadata"].get("deletionTimestamp"):
            # The namespace is gone or being emptied: a real server refuses a late Event (403).
            return
        self._store.create(EVENTS, event)
        self._kept.append((namespace, event_name))
        while len(self._kept) > self._limit:
            old_ns, old_name = self._kept.popleft()
            if self._store.get(EVENTS, old_ns, old_name) is not None:
                self._store.remove(EVENTS, old_ns, old_name)
