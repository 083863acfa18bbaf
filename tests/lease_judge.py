"""Judging a leader's lease from outside: etcdctl's account of the leader key and of a lease, and a
stall of the calling event loop that asks etcdctl meanwhile (tests/integration/test_leader_stall.py,
test_leader_server.py)."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from federation.store.job_store import LEADER_KEY
from tests.etcdctl import etcdctl

# How often the blocked loop asks etcdctl while it is blocked.
PROBE_EVERY_S = 0.2


def leader_key(endpoint: str) -> tuple[str, int] | None:
    """etcd's own account of the leader key: (holder, create revision), or None if there is none."""
    answer = json.loads(etcdctl(endpoint, "get", LEADER_KEY.decode(), "-w", "json").stdout)
    kvs = answer.get("kvs") or []
    if not kvs:
        return None
    return base64.b64decode(kvs[0]["value"]).decode(), int(kvs[0]["create_revision"])


def lease_ttl_left(endpoint: str, lease: int) -> int:
    """`etcdctl lease timetolive`: seconds left, -1 once the lease is revoked or expired."""
    answer = json.loads(etcdctl(endpoint, "lease", "timetolive", format(lease, "x"), "-w", "json").stdout)
    return int(answer.get("ttl", -1))


def block_the_loop(
    seconds: float,
    probe: Callable[[], Any],
    done: Callable[[Any], bool] = lambda _: False,
    *,
    busy: bool = False,
) -> list[Any]:
    """Called on the event loop: blocks it for `seconds` (or until `done` holds of a probe's answer),
    calling `probe` every `PROBE_EVERY_S`; returns what it answered. Nothing else runs on the loop
    meanwhile: no task, no timer, no callback. Between probes it sleeps, or with `busy` computes in
    Python (holding the GIL but for the interpreter's switches, as a long scheduling cycle does)."""
    seen: list[Any] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen.append(probe())
        if done(seen[-1]):
            break
        if busy:
            _compute_for(PROBE_EVERY_S)
        else:
            time.sleep(PROBE_EVERY_S)
    return seen


def _compute_for(seconds: float) -> int:
    end, total = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        total += sum(i * i for i in range(1_000))
    return total


def keeper_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("gpufed-lease-")]
