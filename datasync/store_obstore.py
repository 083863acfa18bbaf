"""`ObjectStore` on obstore (the Rust `object_store` crate): S3-compatible endpoints, GCS and Azure Blob.

obstore was picked for speed: against a local SeaweedFS it did about 1,500 PUTs and 2,200 GETs of 4 KiB
objects per second from one Python process on 2 cores, where a boto3 thread pool managed about 210, and
a listing of 20,000 objects takes about half a second. GCS, Azure and S3 without credentials (anonymous
reads) go through it entirely. For S3 with credentials, every GET (whole or ranged), PUT, copy, listing
and multipart call goes through `S3Requests` (signed requests on our lean HTTP/1.1 client, over TCP or
TLS: one client path for http and https endpoints, issue 36); only bulk deletes stay with obstore. On
4 KiB objects the lean client did 1,860 PUTs and 2,930 GETs a second over HTTPS where obstore did 1,440
and 1,930, at 40 % of its CPU per request (docs/datasync.md, "HTTP client"). GCS and Azure upload
large objects with obstore's own multipart `put`, which is not resumable part by part
(`supports_resumable_multipart` is False there).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

import obstore
import obstore.exceptions as obx

from datasync.errors import AccessDenied, DatasyncError, ObjectNotFound, StoreUnavailable
from datasync.s3_requests import S3Requests
from datasync.store import Blob, ObjectMeta, ObjectStore, PartInfo

_T = TypeVar("_T")
_MULTIPART_CHUNK_BYTES = 16 * 1024 * 1024
# S3's limit for one PUT. Below it an S3 store always writes in one request, so the ETag is the plain MD5
# of the bytes: obstore's own multipart `put` (which gave `md5-of-parts-2` for a 16-32 MiB object and made
# every such object fail its ETag check) is used only where the protocol needs it.
_S3_SINGLE_PUT_MAX_BYTES = 5 * 1024**3
# obstore raises the builtin FileNotFoundError / PermissionError for some statuses, its own errors for others.
_ERRORS = (obx.BaseError, FileNotFoundError, PermissionError)
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def map_error(e: Exception, what: str) -> DatasyncError:
    """obstore's exceptions as ours. The message keeps obstore's first line: it names the URL, no secret."""
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    text = f"{what}: {first}"
    if isinstance(e, obx.NotFoundError | FileNotFoundError):
        return ObjectNotFound(text)
    if isinstance(e, obx.PermissionDeniedError | obx.UnauthenticatedError | PermissionError):
        return AccessDenied(text)
    if isinstance(e, obx.GenericError) and "status code: 4" in str(e) and "status code: 429" not in str(e):
        err = DatasyncError(text)
        err.retryable = False
        return err
    if isinstance(e, obx.InvalidPathError | obx.NotSupportedError | obx.UnknownConfigurationKeyError):
        err = DatasyncError(text)
        err.retryable = False
        return err
    return StoreUnavailable(text)


def obstore_can_name(key: str) -> bool:
    """False for legal S3 keys that obstore's `Path` rejects or silently rewrites: a key ending (or
    starting) in '/' (a folder marker; obstore strips the slash), an empty segment, '.' or '..' as a
    segment, or a control character (newline included). Those go through `S3Requests` instead."""
    if not key or key[0] == "/" or key[-1] == "/" or "//" in key:
        return False
    if _CONTROL.search(key):
        return False
    return not any(part in (".", "..") for part in key.split("/"))


class ObstoreStore:
    """One bucket or container through obstore. `raw` is the obstore store; `s3` the signed extras."""

    def __init__(
        self,
        name: str,
        raw: Any,
        *,
        endpoint_key: str,
        bucket: str,
        s3: S3Requests | None = None,
    ) -> None:
        self._name = name
        self.raw = raw
        self._endpoint_key = endpoint_key
        self.bucket = bucket
        self._s3 = s3

    def __repr__(self) -> str:
        return f"ObstoreStore(name={self._name!r}, endpoint={self._endpoint_key!r}, bucket={self.bucket!r})"

    __str__ = __repr__

    @property
    def name(self) -> str:
        return self._name

    @property
    def endpoint_key(self) -> str:
        return self._endpoint_key

    @property
    def supports_resumable_multipart(self) -> bool:
        return self._s3 is not None

    def _raw(self, key: str) -> S3Requests | None:
        """The signed client for a key obstore cannot name (None: obstore can). Without one, such a key
        is refused by name rather than silently read or written under another name."""
        if obstore_can_name(key):
            return None
        if self._s3 is None:
            err = DatasyncError(f"{self._name}: key {key!r} is not supported on this store")
            err.retryable = False
            raise err
        return self._s3

    async def list_prefix(self, prefix: str) -> AsyncIterator[Sequence[ObjectMeta]]:
        if self._s3 is not None:
            # Our own ListObjectsV2: obstore's listing fails as a whole on one key it cannot parse.
            async for s3_page in self._s3.list_objects(prefix):
                yield s3_page
            return
        try:
            async for page in obstore.list(self.raw, prefix=prefix or None, chunk_size=1000):
                yield [
                    ObjectMeta(m["path"], m["size"], m["e_tag"], m["last_modified"].timestamp()) for m in page
                ]
        except _ERRORS as e:
            raise map_error(e, f"{self._name}: list {prefix!r}") from None

    async def get(self, path: str, *, start: int | None = None, end: int | None = None) -> Blob:
        raw = self._raw(path) or self._s3
        if raw is not None:
            return await self._named(raw.get_object(path, start, end))
        try:
            if start is None and end is None:
                result = await obstore.get_async(self.raw, path)
                return memoryview(await result.bytes_async())
            if end is None:
                result = await obstore.get_async(self.raw, path, options={"range": {"offset": start or 0}})
                return memoryview(await result.bytes_async())
            return memoryview(await obstore.get_range_async(self.raw, path, start=start or 0, end=end))
        except _ERRORS as e:
            raise map_error(e, f"{self._name}: get {path}") from None

    async def put(self, path: str, data: Blob) -> str | None:
        named = self._raw(path)
        raw = named or self._s3
        if raw is not None and (named is not None or len(data) <= _S3_SINGLE_PUT_MAX_BYTES):
            return await self._named(raw.put_object(path, data))
        limit = _S3_SINGLE_PUT_MAX_BYTES if self._s3 is not None else _MULTIPART_CHUNK_BYTES
        try:
            result = await obstore.put_async(
                self.raw,
                path,
                data,
                use_multipart=len(data) > limit,
                chunk_size=_MULTIPART_CHUNK_BYTES,
            )
        except _ERRORS as e:
            raise map_error(e, f"{self._name}: put {path}") from None
        return result["e_tag"]

    async def _named(self, call: Awaitable[_T]) -> _T:
        """`S3Requests`' errors name the request, not the store: name the store as obstore's path does."""
        try:
            return await call
        except DatasyncError as e:
            named = type(e)(f"{self._name}: {e}")
            named.retryable = e.retryable
            raise named from e

    def _multipart(self) -> S3Requests:
        if self._s3 is None:
            err = DatasyncError(f"{self._name}: no resumable multipart on this store")
            err.retryable = False
            raise err
        return self._s3

    async def create_multipart(self, path: str) -> str:
        return await self._multipart().create_multipart(path)

    async def put_part(self, path: str, upload_id: str, part_number: int, data: Blob) -> PartInfo:
        return await self._multipart().put_part(path, upload_id, part_number, data)

    async def list_parts(self, path: str, upload_id: str) -> list[PartInfo]:
        return await self._multipart().list_parts(path, upload_id)

    async def complete_multipart(self, path: str, upload_id: str, parts: Sequence[PartInfo]) -> str | None:
        return await self._multipart().complete_multipart(path, upload_id, parts)

    async def abort_multipart(self, path: str, upload_id: str) -> None:
        await self._multipart().abort_multipart(path, upload_id)

    def can_copy_from(self, source: ObjectStore) -> bool:
        if not isinstance(source, ObstoreStore) or source.endpoint_key != self._endpoint_key:
            return False
        return source.bucket == self.bucket or self._s3 is not None

    async def copy_from(self, source: ObjectStore, src_path: str, dst_path: str) -> str | None:
        if not isinstance(source, ObstoreStore) or not self.can_copy_from(source):
            raise StoreUnavailable(f"{self._name}: cannot copy server-side from {source.name}")
        if self._s3 is not None:
            return await self._s3.copy_object(source.bucket, src_path, dst_path)
        try:
            await obstore.copy_async(self.raw, src_path, dst_path)
        except _ERRORS as e:
            raise map_error(e, f"{self._name}: copy {src_path}") from None
        return None

    async def delete(self, paths: Sequence[str]) -> None:
        named = [p for p in paths if obstore_can_name(p)]
        for path in paths:
            raw = self._raw(path) if not obstore_can_name(path) else None
            if raw is not None:
                await raw.delete_object(path)
        paths = named
        try:
            for i in range(0, len(paths), 1000):
                await obstore.delete_async(self.raw, list(paths[i : i + 1000]))
        except (obx.NotFoundError, FileNotFoundError):
            return
        except _ERRORS as e:
            raise map_error(e, f"{self._name}: delete") from None

    async def close(self) -> None:
        if self._s3 is not None:
            await self._s3.close()
