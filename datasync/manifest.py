"""Building a version's manifest: list a prefix once, read every object, and record its sha256.

The listing streams page by page and objects are hashed as pages arrive, with at most `concurrency`
reads in flight, so memory stays bounded by `concurrency x chunk_bytes` however large the dataset. Large
objects are read in ranged chunks (hashlib releases the GIL, so big chunks are hashed on a thread).
Paths under `.gpufed/` are ours (sync markers, journals) and never part of a dataset.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable

import structlog

from datasync.codec import manifest_from_json, manifest_to_json
from datasync.errors import SourceChanged
from datasync.model import Manifest, ManifestEntry
from datasync.store import Blob, ObjectMeta, ObjectStore

_log = structlog.get_logger(__name__)

INTERNAL_DIR = ".gpufed/"
DEFAULT_CHUNK_BYTES = 8 * 1024 * 1024
_THREAD_HASH_BYTES = 1024 * 1024


def is_internal(relative_path: str) -> bool:
    return relative_path.startswith(INTERNAL_DIR)


async def hash_update(h: hashlib._Hash, data: Blob) -> None:
    """Feed `data` to `h`, on a thread when it is big enough to stall the event loop."""
    if len(data) >= _THREAD_HASH_BYTES:
        await asyncio.to_thread(h.update, data)
    else:
        h.update(data)


async def sha256_of(
    store: ObjectStore, path: str, size_bytes: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> str:
    """The sha256 of an object's bytes, read in ranges of `chunk_bytes`. Raises if the size differs."""
    h = hashlib.sha256()
    if size_bytes <= chunk_bytes:
        data = await store.get(path)
        await hash_update(h, data)
        read = len(data)
    else:
        read = 0
        while read < size_bytes:
            data = await store.get(path, start=read, end=min(read + chunk_bytes, size_bytes))
            if not data:
                break
            await hash_update(h, data)
            read += len(data)
    if read != size_bytes:
        raise SourceChanged(f"{store.name}: {path} has {read} bytes, the listing said {size_bytes}")
    return h.hexdigest()


async def build_manifest(
    store: ObjectStore,
    prefix: str,
    *,
    concurrency: int = 16,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    on_object: Callable[[ManifestEntry], None] | None = None,
) -> Manifest:
    """The manifest of every object under `prefix` (paths relative to it). Reads every byte once."""
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    entries: list[ManifestEntry] = []
    slots = asyncio.Semaphore(concurrency)
    pending: set[asyncio.Task[None]] = set()

    async def one(meta: ObjectMeta) -> None:
        try:
            digest = await sha256_of(store, meta.path, meta.size_bytes, chunk_bytes)
        finally:
            slots.release()
        entry = ManifestEntry(meta.path[len(prefix) :], meta.size_bytes, digest)
        entries.append(entry)
        if on_object is not None:
            on_object(entry)

    try:
        async for page in store.list_prefix(prefix):
            for meta in page:
                if is_internal(meta.path[len(prefix) :]):
                    continue
                await slots.acquire()
                task = asyncio.create_task(one(meta))
                pending.add(task)
                for t in [t for t in pending if t.done()]:
                    pending.discard(t)
                    t.result()
        if pending:
            await asyncio.gather(*pending)
    finally:
        for t in pending:
            t.cancel()
    manifest = Manifest(tuple(entries))
    _log.info(
        "manifest_built",
        store=store.name,
        prefix=prefix,
        objects=manifest.object_count,
        size_bytes=manifest.total_size_bytes,
    )
    return manifest


def manifest_path(dataset: str, version: str) -> str:
    """Where `save_manifest` keeps a version's manifest in its home store."""
    return f"{INTERNAL_DIR}manifests/{dataset}/{version}.json"


async def save_manifest(store: ObjectStore, path: str, manifest: Manifest) -> None:
    await store.put(path, manifest_to_json(manifest))


async def load_manifest(store: ObjectStore, path: str) -> Manifest:
    return manifest_from_json(bytes(await store.get(path)))
