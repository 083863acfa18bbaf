"""What the backend remembers of gangs it stopped after their objects are gone.

Kubernetes forgets a deleted Job; federation still asks how the attempt ended. A gang that gpufed
cancelled or evicted while it ran is therefore reported CANCELLED or EVICTED for a while (as the
in-memory backend keeps a cancelled gang listed), instead of vanishing, which federation would read
as "disappeared" and restart. The memory is the process's own: after a restart the gang is simply
absent, as it is on the cluster.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from clusters.api import GangPhase, GangStatus
from placement.model import JobId

Key = tuple[JobId, int]


@dataclass(frozen=True, slots=True)
class _Tombstone:
    status: GangStatus
    expires_at_s: float


class Tombstones:
    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._items: dict[Key, _Tombstone] = {}
        self.version = 0

    def add(self, key: Key, *, evicted: str | None, at_s: float) -> None:
        phase = GangPhase.CANCELLED if evicted is None else GangPhase.EVICTED
        message = "cancelled" if evicted is None else evicted
        status = GangStatus(job_id=key[0], attempt=key[1], phase=phase, message=message, finished_at_s=at_s)
        self._items[key] = _Tombstone(status, at_s + self._ttl_s)
        self.version += 1

    def forget(self, key: Key) -> None:
        if self._items.pop(key, None) is not None:
            self.version += 1

    def retain(self, keys: Collection[Key]) -> None:
        for key in [k for k in self._items if k not in keys]:
            self.forget(key)

    def expire(self, now_s: float) -> None:
        for key in [k for k, t in self._items.items() if t.expires_at_s <= now_s]:
            self.forget(key)

    def by_key(self) -> dict[Key, GangStatus]:
        return {k: t.status for k, t in self._items.items()}

    def statuses(self, *, exclude: Collection[Key]) -> tuple[GangStatus, ...]:
        return tuple(t.status for k, t in self._items.items() if k not in exclude)
