"""A local directory as an `ObjectStore`: datasets on a shared filesystem, and a target for tests.

Object paths map to files under `root`. A write goes to a temporary file renamed into place, so a
reader never sees half an object (as with S3). Multipart parts are files under `root/.multipart/<id>/`
until completed, so an upload survives the process. The ETag is the file's mtime and size, like
obstore's LocalStore: a change token, not a content hash.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from datasync.errors import DatasyncError, ObjectNotFound, StoreUnavailable
from datasync.store import Blob, ObjectMeta, ObjectStore, PartInfo

_STAGING = ".multipart"
_PAGE = 1000


def _etag(st: os.stat_result) -> str:
    return f'"{st.st_mtime_ns:x}-{st.st_size:x}"'


class LocalStore:
    def __init__(self, name: str, root: Path) -> None:
        self._name = name
        self.root = Path(root).resolve()

    def __repr__(self) -> str:
        return f"LocalStore(name={self._name!r}, root={str(self.root)!r})"

    @property
    def name(self) -> str:
        return self._name

    @property
    def endpoint_key(self) -> str:
        return f"local:{self.root}"

    @property
    def supports_resumable_multipart(self) -> bool:
        return True

    def _file(self, path: str) -> Path:
        target = (self.root / path).resolve()
        if self.root not in target.parents or path.startswith(_STAGING + "/"):
            err = DatasyncError(f"{self._name}: path {path!r} escapes the store")
            err.retryable = False
            raise err
        return target

    def _scan(self, prefix: str) -> list[ObjectMeta]:
        out: list[ObjectMeta] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            if Path(dirpath) == self.root and _STAGING in dirnames:
                dirnames.remove(_STAGING)
            rel_dir = os.path.relpath(dirpath, self.root)
            for f in filenames:
                if f.startswith(".tmp-"):
                    continue
                rel = f if rel_dir == "." else f"{rel_dir}/{f}"
                if rel.startswith(prefix):
                    st = os.stat(os.path.join(dirpath, f))
                    out.append(ObjectMeta(rel, st.st_size, _etag(st), st.st_mtime))
        out.sort(key=lambda m: m.path)
        return out

    async def list_prefix(self, prefix: str) -> AsyncIterator[Sequence[ObjectMeta]]:
        metas = await asyncio.to_thread(self._scan, prefix)
        for i in range(0, len(metas), _PAGE):
            yield metas[i : i + _PAGE]

    def _read(self, path: str, start: int | None, end: int | None) -> bytes:
        try:
            with self._file(path).open("rb") as f:
                f.seek(start or 0)
                return f.read() if end is None else f.read(end - (start or 0))
        except FileNotFoundError:
            raise ObjectNotFound(f"{self._name}: no object {path}") from None
        except OSError as e:
            raise StoreUnavailable(f"{self._name}: read {path}: {e.strerror}") from None

    async def get(self, path: str, *, start: int | None = None, end: int | None = None) -> bytes:
        return await asyncio.to_thread(self._read, path, start, end)

    def _write(self, target: Path, data: bytes | Sequence[Path]) -> str:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".tmp-{uuid.uuid4().hex}"
        with tmp.open("wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                for part in data:
                    with part.open("rb") as p:
                        shutil.copyfileobj(p, f, 8 * 1024 * 1024)
        tmp.replace(target)
        return _etag(target.stat())

    async def put(self, path: str, data: Blob) -> str | None:
        return await asyncio.to_thread(self._write, self._file(path), bytes(data))

    def _upload_dir(self, upload_id: str) -> Path:
        return self.root / _STAGING / upload_id

    async def create_multipart(self, path: str) -> str:
        self._file(path)
        upload_id = uuid.uuid4().hex
        await asyncio.to_thread(self._upload_dir(upload_id).mkdir, parents=True)
        return upload_id

    async def put_part(self, path: str, upload_id: str, part_number: int, data: Blob) -> PartInfo:
        folder = self._upload_dir(upload_id)
        if not folder.is_dir():
            raise ObjectNotFound(f"{self._name}: no upload {upload_id}")
        etag = await asyncio.to_thread(self._write, folder / f"{part_number:05d}", bytes(data))
        return PartInfo(part_number, etag, len(data))

    async def list_parts(self, path: str, upload_id: str) -> list[PartInfo]:
        folder = self._upload_dir(upload_id)
        if not folder.is_dir():
            raise ObjectNotFound(f"{self._name}: no upload {upload_id}")
        parts = []
        for f in sorted(folder.iterdir()):
            if not f.name.startswith(".tmp-"):
                st = f.stat()
                parts.append(PartInfo(int(f.name), _etag(st), st.st_size))
        return parts

    async def complete_multipart(self, path: str, upload_id: str, parts: Sequence[PartInfo]) -> str | None:
        folder = self._upload_dir(upload_id)
        files = [folder / f"{p.part_number:05d}" for p in sorted(parts, key=lambda p: p.part_number)]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ObjectNotFound(f"{self._name}: upload {upload_id} lacks parts {missing}")
        etag = await asyncio.to_thread(self._write, self._file(path), files)
        await asyncio.to_thread(shutil.rmtree, folder, True)
        return etag

    async def abort_multipart(self, path: str, upload_id: str) -> None:
        await asyncio.to_thread(shutil.rmtree, self._upload_dir(upload_id), True)

    def can_copy_from(self, source: ObjectStore) -> bool:
        return isinstance(source, LocalStore)

    async def copy_from(self, source: ObjectStore, src_path: str, dst_path: str) -> str | None:
        if not isinstance(source, LocalStore):
            raise StoreUnavailable(f"{self._name}: cannot copy server-side from {source.name}")
        src = source._file(src_path)
        if not src.is_file():
            raise ObjectNotFound(f"{source.name}: no object {src_path}")
        return await asyncio.to_thread(self._write, self._file(dst_path), [src])

    async def delete(self, paths: Sequence[str]) -> None:
        def _delete() -> None:
            for p in paths:
                self._file(p).unlink(missing_ok=True)

        await asyncio.to_thread(_delete)

    async def close(self) -> None:
        return None
