"""The `ObjectStore` protocol: what the manifest builder and the sync engine need from any object store.

One protocol for S3-compatible endpoints, GCS, Azure Blob, a local directory and the in-memory fake, so
the sync engine has one code path. Multipart uploads are explicit (create, put part, list parts,
complete, abort) rather than hidden inside a `put`, because resuming a killed sync means continuing an
upload whose id and finished parts were journaled. Every method raises only `DatasyncError`s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

# Object bytes: stores may hand out a memoryview over their client's buffer rather than copy it to bytes.
Blob = bytes | memoryview


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """One object as a listing reports it. `etag` is an opaque change token, never a content hash."""

    path: str
    size_bytes: int
    etag: str | None
    last_modified_s: float


@dataclass(frozen=True, slots=True)
class PartInfo:
    part_number: int
    etag: str
    size_bytes: int


@runtime_checkable
class ObjectStore(Protocol):
    """An object store. `name` is for logs and errors; `repr` and logs never show a credential."""

    @property
    def name(self) -> str: ...

    @property
    def endpoint_key(self) -> str:
        """Same value for two stores on one endpoint and account: they can copy server-side."""
        ...

    @property
    def supports_resumable_multipart(self) -> bool: ...

    def list_prefix(self, prefix: str) -> AsyncIterator[Sequence[ObjectMeta]]:
        """Every object under `prefix` (recursively), in pages, from one listing call stream."""
        ...

    async def get(self, path: str, *, start: int | None = None, end: int | None = None) -> Blob:
        """The object's bytes, or bytes [start, end) of it."""
        ...

    async def put(self, path: str, data: Blob) -> str | None:
        """Write the object in one request; returns its new ETag when the store reports one."""
        ...

    async def create_multipart(self, path: str) -> str:
        """Start a multipart upload; returns its upload id."""
        ...

    async def put_part(self, path: str, upload_id: str, part_number: int, data: Blob) -> PartInfo: ...

    async def list_parts(self, path: str, upload_id: str) -> list[PartInfo]:
        """Parts the store holds for an unfinished upload (raises ObjectNotFound once it is gone)."""
        ...

    async def complete_multipart(
        self, path: str, upload_id: str, parts: Sequence[PartInfo]
    ) -> str | None: ...

    async def abort_multipart(self, path: str, upload_id: str) -> None: ...

    def can_copy_from(self, source: ObjectStore) -> bool:
        """True when `copy_from(source, ...)` is a server-side copy (no bytes through this process)."""
        ...

    async def copy_from(self, source: ObjectStore, src_path: str, dst_path: str) -> str | None: ...

    async def delete(self, paths: Sequence[str]) -> None:
        """Delete the objects; missing ones are not an error."""
        ...

    async def close(self) -> None: ...


async def list_all(store: ObjectStore, prefix: str) -> list[ObjectMeta]:
    out: list[ObjectMeta] = []
    async for page in store.list_prefix(prefix):
        out.extend(page)
    return out
