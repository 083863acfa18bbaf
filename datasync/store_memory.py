"""An in-memory `ObjectStore`: the fake that unit tests and the Ray shard tests run the sync engine on.

It behaves like S3 where the engine can tell: ETags are the MD5 of a single-part object and
`md5(part md5s)-N` of a multipart one, unfinished uploads keep their parts until completed or aborted,
and server-side copies work between fakes that share an `endpoint_key`. It counts requests and bytes
written, and can be told to fail the next calls, so tests can check what the engine sent and retried.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from datasync.errors import DatasyncError, ObjectNotFound, StoreUnavailable
from datasync.store import Blob, ObjectMeta, ObjectStore, PartInfo

_PAGE = 1000
_upload_ids = itertools.count(1)


def md5_etag(data: Blob) -> str:
    return f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'


def multipart_etag(part_md5s: Sequence[bytes]) -> str:
    joined = hashlib.md5(b"".join(part_md5s), usedforsecurity=False).hexdigest()
    return f'"{joined}-{len(part_md5s)}"'


@dataclass
class _Upload:
    path: str
    parts: dict[int, bytes] = field(default_factory=dict)


class MemoryStore:
    """Objects in a dict. `fail(op, times, error)` makes the next `times` calls of `op` raise `error`."""

    def __init__(self, name: str = "memory", *, endpoint: str = "memory") -> None:
        self._name = name
        self._endpoint = endpoint
        self.objects: dict[str, tuple[bytes, str, float]] = {}
        self.uploads: dict[str, _Upload] = {}
        self.requests: Counter[str] = Counter()
        self.bytes_written = 0
        self._failures: dict[str, list[DatasyncError]] = {}

    def __repr__(self) -> str:
        return f"MemoryStore(name={self._name!r}, objects={len(self.objects)})"

    @property
    def name(self) -> str:
        return self._name

    @property
    def endpoint_key(self) -> str:
        return f"memory:{self._endpoint}"

    @property
    def supports_resumable_multipart(self) -> bool:
        return True

    def fail(self, op: str, times: int = 1, error: DatasyncError | None = None) -> None:
        err = error if error is not None else StoreUnavailable(f"injected failure of {op}")
        self._failures.setdefault(op, []).extend([err] * times)

    def _enter(self, op: str) -> None:
        self.requests[op] += 1
        pending = self._failures.get(op)
        if pending:
            raise pending.pop(0)

    def write(self, path: str, data: Blob) -> None:
        """Set an object directly (no request counted): for test setup and corruption."""
        self.objects[path] = (bytes(data), md5_etag(data), time.time())

    async def list_prefix(self, prefix: str) -> AsyncIterator[Sequence[ObjectMeta]]:
        self._enter("list")
        metas = [
            ObjectMeta(p, len(d), etag, t)
            for p, (d, etag, t) in sorted(self.objects.items())
            if p.startswith(prefix)
        ]
        for i in range(0, len(metas), _PAGE):
            yield metas[i : i + _PAGE]

    async def get(self, path: str, *, start: int | None = None, end: int | None = None) -> bytes:
        self._enter("get")
        if path not in self.objects:
            raise ObjectNotFound(f"{self._name}: no object {path}")
        data = self.objects[path][0]
        return data[start or 0 : end if end is not None else len(data)]

    async def put(self, path: str, data: Blob) -> str | None:
        self._enter("put")
        self.bytes_written += len(data)
        self.write(path, data)
        return self.objects[path][1]

    async def create_multipart(self, path: str) -> str:
        self._enter("create_multipart")
        upload_id = f"u{next(_upload_ids)}"
        self.uploads[upload_id] = _Upload(path)
        return upload_id

    def _upload(self, path: str, upload_id: str) -> _Upload:
        upload = self.uploads.get(upload_id)
        if upload is None or upload.path != path:
            raise ObjectNotFound(f"{self._name}: no upload {upload_id} for {path}")
        return upload

    async def put_part(self, path: str, upload_id: str, part_number: int, data: Blob) -> PartInfo:
        self._enter("put_part")
        self._upload(path, upload_id).parts[part_number] = bytes(data)
        self.bytes_written += len(data)
        return PartInfo(part_number, md5_etag(data), len(data))

    async def list_parts(self, path: str, upload_id: str) -> list[PartInfo]:
        self._enter("list_parts")
        parts = self._upload(path, upload_id).parts
        return [PartInfo(n, md5_etag(d), len(d)) for n, d in sorted(parts.items())]

    async def complete_multipart(self, path: str, upload_id: str, parts: Sequence[PartInfo]) -> str | None:
        self._enter("complete_multipart")
        held = self._upload(path, upload_id).parts
        chunks = []
        for p in sorted(parts, key=lambda p: p.part_number):
            if p.part_number not in held or md5_etag(held[p.part_number]) != p.etag:
                raise ObjectNotFound(f"{self._name}: upload {upload_id} has no part {p.part_number}")
            chunks.append(held[p.part_number])
        data = b"".join(chunks)
        etag = multipart_etag([hashlib.md5(c, usedforsecurity=False).digest() for c in chunks])
        self.objects[path] = (data, etag, time.time())
        del self.uploads[upload_id]
        return etag

    async def abort_multipart(self, path: str, upload_id: str) -> None:
        self._enter("abort_multipart")
        self.uploads.pop(upload_id, None)

    def can_copy_from(self, source: ObjectStore) -> bool:
        return isinstance(source, MemoryStore) and source.endpoint_key == self.endpoint_key

    async def copy_from(self, source: ObjectStore, src_path: str, dst_path: str) -> str | None:
        self._enter("copy")
        if not isinstance(source, MemoryStore) or not self.can_copy_from(source):
            raise StoreUnavailable(f"{self._name}: cannot copy server-side from {source.name}")
        if src_path not in source.objects:
            raise ObjectNotFound(f"{source.name}: no object {src_path}")
        data, etag, _ = source.objects[src_path]
        self.objects[dst_path] = (data, etag, time.time())
        return etag

    async def delete(self, paths: Sequence[str]) -> None:
        self._enter("delete")
        for p in paths:
            self.objects.pop(p, None)

    async def close(self) -> None:
        return None
