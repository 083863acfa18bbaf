"""When the pods of an attempt ran, remembered after the pods are gone.

A third party that deletes a gang (its object and its pods) moments after the pods start can do so
between two of the reconciler's looks: the reconciler then never sees the gang running, and would
charge nothing for GPUs the pods held (the chaos test's "known issue": pods that ran up to 2 s with
no ledger interval). The pod watch sees every deletion, with the pod's last state in the DELETED
event; this keeps, per (job, attempt), when its pods started and when the last of them went, so that
the reconciler can charge an attempt it only learns of once it has disappeared.

The memory is the process's own and bounded by time (`ttl_s`), like the tombstones: after a restart
an attempt that vanished meanwhile is not charged, as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from clusters.api import VanishedAttempt
from clusters.kubernetes.inventory import pod_info
from placement.model import JobId

Key = tuple[JobId, int]


class VanishedPods:
    """Fed by the pod informer's observer (its watch thread); read by the backend (any thread)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        # key -> (latest pod start, latest pod end or deletion, when to forget it)
        self._items: dict[Key, tuple[float, float, float]] = {}

    def observe_pod(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED":
            return
        pod = pod_info(obj)
        if pod.job_id is None or pod.attempt is None or pod.started_at_s is None:
            return  # not gpufed's, or never started: it held a node but ran nothing to charge
        now_s = self._clock()
        # A finished pod freed its GPUs when its containers ended; a running one when it went.
        ended_s = pod.finished_at_s if pod.finished_at_s is not None else now_s
        key = (JobId(pod.job_id), pod.attempt)
        with self._lock:
            self._expire(now_s)
            known = self._items.get(key)
            # The gang runs once its last pod has started (as `status.summarize_pods` counts it), and
            # holds GPUs until its last pod has gone.
            started_s = pod.started_at_s if known is None else max(known[0], pod.started_at_s)
            last_s = ended_s if known is None else max(known[1], ended_s)
            self._items[key] = (started_s, max(last_s, started_s), now_s + self._ttl_s)

    def get(self, key: Key) -> VanishedAttempt | None:
        with self._lock:
            self._expire(self._clock())
            found = self._items.get(key)
        if found is None:
            return None
        return VanishedAttempt(started_at_s=found[0], ended_at_s=found[1])

    def _expire(self, now_s: float) -> None:
        for key in [k for k, item in self._items.items() if item[2] <= now_s]:
            del self._items[key]
