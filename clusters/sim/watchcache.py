"""How far back a watch can resume, per kind, as the API server's watch cache decides it.

kube-apiserver serves watches from a cache per resource that holds a window of recent events:
at least `--default-watch-cache-size` (100) of them, growing (doubling, up to 100 x 1024) while the
oldest is younger than 75 s, so a burst of fresh changes is kept, and shrinking back once the
oldest is older than twice that. It cannot serve a watch from before its window, nor from before
it started (it starts from a list when the server starts): such a watch answers `410 Gone`. The
store's own history (`Store`) is the etcd side and is usually longer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from clusters.sim.resources import ALL, ResourceType

LOWER_BOUND_EVENTS = 100
UPPER_BOUND_EVENTS = 100 * 1024
EVENT_FRESH_S = 75.0


class WatchWindows:
    def __init__(self, wall_s: Callable[[], float]) -> None:
        self._wall_s = wall_s
        self._events: dict[ResourceType, deque[tuple[int, float]]] = {rt: deque() for rt in ALL}
        self._capacity: dict[ResourceType, int] = dict.fromkeys(ALL, LOWER_BOUND_EVENTS)
        self._floor: dict[ResourceType, int] = dict.fromkeys(ALL, 0)

    def start(self, rv: int) -> None:
        """The caches start (the API server starts): nothing before `rv` can be watched from."""
        for rt in ALL:
            self._floor[rt] = max(self._floor[rt], rv)

    def record(self, rt: ResourceType, rv: int) -> None:
        now = self._wall_s()
        events = self._events[rt]
        events.append((rv, now))
        capacity = self._capacity[rt]
        if len(events) <= capacity:
            return
        oldest_age_s = now - events[0][1]
        if oldest_age_s < EVENT_FRESH_S and capacity < UPPER_BOUND_EVENTS:
            self._capacity[rt] = capacity * 2
            return
        if oldest_age_s > 2 * EVENT_FRESH_S and capacity > LOWER_BOUND_EVENTS:
            self._capacity[rt] = capacity = max(LOWER_BOUND_EVENTS, capacity // 2)
        while len(events) > capacity:
            self._floor[rt] = max(self._floor[rt], events.popleft()[0])

    def floor(self, rt: ResourceType) -> int:
        """A watch of `rt` from a resourceVersion below this is `410 Gone`."""
        return self._floor[rt]
