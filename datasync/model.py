"""Datasets as values: what federation stores in etcd and what the sync engine works from.

A dataset version is pinned by its manifest: the exact list of (path, size, sha256) it contains. The
content hash is ours (sha256 of the bytes), never an S3 ETag: an ETag is an MD5 only for objects uploaded
in one piece, and differs for the same bytes uploaded in different part sizes. Paths in a manifest are
relative to the version's prefix, so the same manifest describes every copy of the version.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import NewType

from placement.model import TenantId

DatasetName = NewType("DatasetName", str)
StoreName = NewType("StoreName", str)
VersionId = NewType("VersionId", str)


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    path: str
    size_bytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class Manifest:
    """Entries sorted by path (the constructor sorts), so equal contents give equal manifests."""

    entries: tuple[ManifestEntry, ...]
    total_size_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.entries, key=lambda e: e.path))
        paths = [e.path for e in ordered]
        if len(set(paths)) != len(paths):
            raise ValueError("a manifest lists each path once")
        object.__setattr__(self, "entries", ordered)
        object.__setattr__(self, "total_size_bytes", sum(e.size_bytes for e in ordered))

    @property
    def object_count(self) -> int:
        return len(self.entries)

    def by_path(self) -> dict[str, ManifestEntry]:
        return {e.path: e for e in self.entries}

    @property
    def digest(self) -> str:
        """sha256 over the entries: one short value that names this exact content (for etcd records)."""
        h = hashlib.sha256()
        for e in self.entries:
            h.update(f"{e.path}\0{e.size_bytes}\0{e.sha256}\n".encode())
        return h.hexdigest()


@dataclass(frozen=True, slots=True)
class StoreLocation:
    """Where a copy lives: a named store (see `StoreConfig`) and a prefix inside it ('' or ending in '/')."""

    store: StoreName
    prefix: str

    def __post_init__(self) -> None:
        if self.prefix and not self.prefix.endswith("/"):
            object.__setattr__(self, "prefix", self.prefix + "/")


@dataclass(frozen=True, slots=True)
class DatasetVersion:
    dataset: DatasetName
    version: VersionId
    home: StoreLocation
    manifest_digest: str
    size_bytes: int
    object_count: int
    created_at_s: float


@dataclass(frozen=True, slots=True)
class Dataset:
    name: DatasetName
    tenant: TenantId
    home_store: StoreName
    versions: tuple[DatasetVersion, ...] = ()
    shared_with: frozenset[TenantId] = frozenset()

    def visible_to(self, tenant: TenantId) -> bool:
        return tenant == self.tenant or tenant in self.shared_with

    def version(self, version: VersionId) -> DatasetVersion | None:
        return next((v for v in self.versions if v.version == version), None)

    def latest(self) -> DatasetVersion | None:
        return max(self.versions, key=lambda v: v.created_at_s, default=None)
