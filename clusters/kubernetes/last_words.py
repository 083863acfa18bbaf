"""The logs of gang pods that are killed while they run, read in the moment before they go.

A pod's log lives as long as the pod object. Most of a gang's pods end by themselves and stay until
gpufed collects the gang, after it has kept the attempt's logs. Some are killed while they run and
go within their grace period: Volcano's `TaskCompleted: CompleteJob` kills the workers still running
when the master ends first, an operator deletes a pod, a drain evicts it. Containers stop promptly on
SIGTERM, so such a pod is gone a moment after its `deletionTimestamp` appears, long before the
reconciler's next pass keeps the attempt.

So the pod watch hands every pod event here. A gang pod seen running with a `deletionTimestamp` has
its log read at once, on a small pool of its own (the watch thread never waits on it), and kept in
memory until the entry ages out. Once the pod is gone, and while other pods of its gang remain,
`replicas()` and `pod_log()` answer for it from this copy, so the keeper and `gpufed logs` see every
replica.

What it cannot catch: a pod whose container ends by itself a moment after the kill is removed at
once, and a read that starts after that finds nothing; and a gang deleted whole (every pod gone
before the keeper looks) leaves the keeper nothing to merge this copy with. A node-level log agent
is the complete answer; this one closes the common case, workers killed when the master ends.

Bounded: at most `max_bytes_per_pod` per pod (the tail, from a whole line), `max_total_bytes` in
all (oldest dropped first), each entry kept `ttl_s`. It is memory only: a server that restarts in
the moment between a kill and the keep loses those lines, as a log agent that restarts would.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import structlog

from clusters.api import LogOptions, ReplicaState
from clusters.kubernetes.inventory import GANG_LABEL
from clusters.logtext import last_bytes, select_lines

Json = dict[str, Any]
# Reads the whole (tail of the) log of one pod: (namespace, pod, container, options) -> bytes.
LogFetch = Callable[[str, str, str, LogOptions], bytes]

log = structlog.get_logger("gpufed.k8s.last_words")

MAX_BYTES_PER_POD = 256 * 1024
MAX_TOTAL_BYTES = 64 * 1024 * 1024
TTL_S = 3600.0
# Kills come in bursts (a gang's workers at once); a few readers keep up, and never crowd the API.
FETCH_THREADS = 4
# How long a reader of the gang waits for a killed pod's log still being read.
READ_WAIT_S = 2.0


@dataclass(slots=True)
class _Entry:
    namespace: str
    gang: str
    state: ReplicaState
    caught_at_s: float
    data: bytes | None = None
    gone: bool = False
    reading: bool = True


def shaped(data: bytes, options: LogOptions, now_s: float) -> bytes:
    """A log kept with timestamps, cut as the pod log API would cut it for `options`."""
    lines = select_lines(data, options, now_s)
    out = "".join(f"{line}\n" for line in lines).encode()
    return out[: options.limit_bytes] if options.limit_bytes is not None else out


class LastWords:
    """Logs of killed gang pods, read from the pod watch's events while the pods still exist."""

    def __init__(
        self,
        cluster: str,
        fetch: LogFetch,
        replica_of: Callable[[Json], ReplicaState],
        *,
        max_bytes_per_pod: int = MAX_BYTES_PER_POD,
        max_total_bytes: int = MAX_TOTAL_BYTES,
        ttl_s: float = TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._cluster = cluster
        self._fetch = fetch
        self._replica_of = replica_of
        self._max_bytes_per_pod = max_bytes_per_pod
        self._max_total_bytes = max_total_bytes
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        # (namespace, pod uid) -> entry, oldest first.
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        # (namespace, pod name) -> its entries' keys, oldest first: the watch thread looks a name up
        # on every gang pod event, which must not cost a scan of every entry.
        self._by_name: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self._total_bytes = 0
        self._pool = ThreadPoolExecutor(
            max_workers=FETCH_THREADS, thread_name_prefix=f"gpufed-k8s-lastwords-{cluster}"
        )
        # Counters for tests and metrics: logs read, and reads that found the pod already gone.
        self.caught = 0
        self.missed = 0

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- the watch side (the informer's thread) -------------------------------------------------

    def observe(self, kind: str, pod: Json) -> None:
        meta = pod.get("metadata") or {}
        gang = (meta.get("labels") or {}).get(GANG_LABEL)
        if not gang:
            return
        key = (str(meta.get("namespace", "")), str(meta.get("uid", "")))
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                # The last state it was seen in (killed, exit 137) is the one `describe` shows.
                entry.state = self._replica_of(pod)
                entry.gone = entry.gone or kind == "DELETED"
                return
            if kind != "DELETED":
                self._forget_replaced(key[0], str(meta.get("name", "")))
            running = (pod.get("status") or {}).get("phase") == "Running"
            if kind == "DELETED" or not meta.get("deletionTimestamp") or not running:
                return
            entry = _Entry(key[0], str(gang), self._replica_of(pod), self._clock())
            self._entries[key] = entry
            self._by_name.setdefault((key[0], entry.state.pod), []).append(key)
            self._prune()
        with contextlib.suppress(RuntimeError):  # closed: the server is stopping
            self._pool.submit(self._read, key, entry)

    def _read(self, key: tuple[str, str], entry: _Entry) -> None:
        options = LogOptions(timestamps=True, tail_lines=max(1000, self._max_bytes_per_pod // 16))
        try:
            data = self._fetch(entry.namespace, entry.state.pod, entry.state.container, options)
        except Exception as error:
            # Gone before the read (a slow watch); the keeper notes the replica as without a log.
            self.missed += 1
            entry.reading = False
            log.info(
                "killed_pod_log_missed",
                cluster=self._cluster,
                pod=entry.state.pod,
                error=str(error)[:200],
                after_s=round(self._clock() - entry.caught_at_s, 3),
            )
            return
        data = last_bytes(data, self._max_bytes_per_pod)
        with self._lock:
            entry.reading = False
            if self._entries.get(key) is not entry:
                return
            entry.data = data
            self._total_bytes += len(data)
            self.caught += 1
            self._prune()

    def _forget_replaced(self, namespace: str, pod: str) -> None:
        """A new pod of the same name (a Volcano RestartTask) is the replica now: its own log is
        read live, never the copy of the one it replaced (the lock is held)."""
        for key in list(self._by_name.get((namespace, pod), ())):
            if self._entries[key].gone:
                self._drop(key)

    def _prune(self) -> None:
        """Drop aged entries, then the oldest while over the byte bound (the lock is held)."""
        oldest_s = self._clock() - self._ttl_s
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.caught_at_s >= oldest_s and self._total_bytes <= self._max_total_bytes:
                return
            self._drop(key)

    def _drop(self, key: tuple[str, str]) -> None:
        """Forget one entry, its bytes and its name (the lock is held)."""
        entry = self._entries.pop(key)
        self._total_bytes -= len(entry.data or b"")
        name = (entry.namespace, entry.state.pod)
        keys = self._by_name[name]
        keys.remove(key)
        if not keys:
            del self._by_name[name]

    # ---- the read side (the event loop) ---------------------------------------------------------

    async def settled(self, namespace: str, gang: str, wait_s: float = READ_WAIT_S) -> None:
        """Wait (briefly) for the reads of the gang's killed pods still in flight."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with self._lock:
                reading = any(
                    e.reading for e in self._entries.values() if e.namespace == namespace and e.gang == gang
                )
            if not reading:
                return
            await asyncio.sleep(0.02)

    def gone_replicas(self, namespace: str, gang: str, present: Sequence[str]) -> list[ReplicaState]:
        """The gang's killed pods with a log kept that are not among `present`.

        `present` is the API's listing, which is ahead of the watch: a pod it no longer lists is
        gone, whether or not its DELETED event has arrived here yet.
        """
        with self._lock:
            return [
                e.state
                for e in self._entries.values()
                if e.namespace == namespace
                and e.gang == gang
                and e.data is not None
                and e.state.pod not in present
            ]

    def log_of(
        self, namespace: str, pod: str, options: LogOptions, *, only_gone: bool = True
    ) -> bytes | None:
        """The kept log of a killed pod, shaped by `options`; None if none is kept.

        `only_gone`: only once the watch has seen it go (until then the live log is the one to read).
        """
        with self._lock:
            found = [
                e
                for e in (self._entries[k] for k in self._by_name.get((namespace, pod), ()))
                if e.gone or not only_gone
            ]
        if not found or found[-1].data is None:
            return None
        return shaped(found[-1].data, options, self._clock())
