"""Cache decisions: which dataset versions have a copy in which store, and which copies to evict.

Pure functions over frozen values, with time as an argument, so federation can keep one `CachedCopy`
record per (store, dataset, version) in etcd, apply these functions in a transaction, and then delete
what `plan_eviction` returned. A copy is pinned by the jobs using it (a set of job ids, so a retried pin
or unpin is idempotent) and a pinned copy is never chosen for eviction. Beyond a store's capacity,
unpinned copies go least recently used first; when pinned copies alone exceed the capacity, the decision
says the space does not fit rather than evicting them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from datasync.model import DatasetName, StoreName, VersionId


@dataclass(frozen=True, slots=True, order=True)
class CopyKey:
    store: StoreName
    dataset: DatasetName
    version: VersionId


@dataclass(frozen=True, slots=True)
class CachedCopy:
    key: CopyKey
    size_bytes: int
    last_used_s: float
    pinned_by: frozenset[str] = frozenset()

    @property
    def pinned(self) -> bool:
        return bool(self.pinned_by)


@dataclass(frozen=True, slots=True)
class CacheState:
    copies: tuple[CachedCopy, ...] = ()

    def get(self, key: CopyKey) -> CachedCopy | None:
        return next((c for c in self.copies if c.key == key), None)

    def in_store(self, store: StoreName) -> tuple[CachedCopy, ...]:
        return tuple(c for c in self.copies if c.key.store == store)

    def used_bytes(self, store: StoreName) -> int:
        return sum(c.size_bytes for c in self.in_store(store))

    def locations(self, dataset: DatasetName, version: VersionId) -> tuple[CachedCopy, ...]:
        """Every store holding this version, for the placer (sizes included)."""
        return tuple(c for c in self.copies if c.key.dataset == dataset and c.key.version == version)

    def _put(self, copy: CachedCopy) -> CacheState:
        others = tuple(c for c in self.copies if c.key != copy.key)
        return CacheState(tuple(sorted((*others, copy), key=lambda c: c.key)))


def record_copy(state: CacheState, key: CopyKey, size_bytes: int, now_s: float) -> CacheState:
    """A sync finished: the version is in the store (pins of an earlier record are kept)."""
    old = state.get(key)
    pins = old.pinned_by if old is not None else frozenset()
    return state._put(CachedCopy(key, size_bytes, now_s, pins))


def touch(state: CacheState, key: CopyKey, now_s: float) -> CacheState:
    old = state.get(key)
    return state if old is None else state._put(replace(old, last_used_s=max(old.last_used_s, now_s)))


def pin(state: CacheState, key: CopyKey, job_id: str, now_s: float) -> CacheState:
    """A job starts using the copy. Raises KeyError when there is no such copy."""
    old = state.get(key)
    if old is None:
        raise KeyError(key)
    return state._put(
        replace(old, pinned_by=old.pinned_by | {job_id}, last_used_s=max(old.last_used_s, now_s))
    )


def unpin(state: CacheState, key: CopyKey, job_id: str, now_s: float) -> CacheState:
    """The job is done with the copy; it becomes evictable once no job pins it."""
    old = state.get(key)
    if old is None:
        return state
    return state._put(
        replace(old, pinned_by=old.pinned_by - {job_id}, last_used_s=max(old.last_used_s, now_s))
    )


def forget(state: CacheState, keys: Iterable[CopyKey]) -> CacheState:
    """The copies were deleted."""
    gone = set(keys)
    return CacheState(tuple(c for c in state.copies if c.key not in gone))


@dataclass(frozen=True, slots=True)
class EvictionDecision:
    evict: tuple[CopyKey, ...]
    freed_bytes: int
    fits: bool
    reason: str = ""


def plan_eviction(
    state: CacheState, store: StoreName, capacity_bytes: int, incoming_bytes: int = 0
) -> EvictionDecision:
    """Which copies to delete so that the store holds at most `capacity_bytes` after `incoming_bytes`
    arrive: unpinned copies, least recently used first (ties by key). Never a pinned copy."""
    copies = state.in_store(store)
    excess = sum(c.size_bytes for c in copies) + incoming_bytes - capacity_bytes
    if excess <= 0:
        return EvictionDecision((), 0, True)
    chosen: list[CopyKey] = []
    freed = 0
    for c in sorted((c for c in copies if not c.pinned), key=lambda c: (c.last_used_s, c.key)):
        if freed >= excess:
            break
        chosen.append(c.key)
        freed += c.size_bytes
    if freed >= excess:
        return EvictionDecision(tuple(chosen), freed, True)
    pinned = sum(c.size_bytes for c in copies if c.pinned)
    return EvictionDecision(
        tuple(chosen),
        freed,
        False,
        f"store {store}: {pinned} bytes pinned by running jobs, {incoming_bytes} incoming, "
        f"capacity {capacity_bytes}",
    )
