"""The dataset registry in etcd: datasets with their versions and manifests, and the copies near clusters.

A dataset belongs to a tenant, lives in a home store, and has immutable versions, each pinned by a
manifest (path, size, sha256) built when the version was registered. The values and their JSON are
datasync's (`Dataset`, `Manifest`, `CachedCopy`); this module only keys them in etcd and writes them
with compare-and-swap, so two registrations of one dataset cannot lose each other's version.

Keys (<name> is the registry's name of a dataset, `<tenant>/<name>`):
  /gpufed/datasets/<name>                        the Dataset (tenant, home store, versions, sharing)
  /gpufed/manifests/<name>/<version>             the version's manifest (JSON rows)
  /gpufed/caches/<store>/<name>/<version>        a copy in a store other than home: size, last use, pins
  /gpufed/copy-etags/<store>/<name>/<version>    the copy's objects as last verified (path -> ETag) and
                                                 when: written with the copy record, the truth a copy
                                                 is checked against (its marker in the bucket is a hint)

Dataset names are per tenant (issue 16): with global names, registering a name another tenant uses
answered "taken" where reading it answered NOT_FOUND, an existence oracle. The registry's name of a
dataset is `<tenant>/<name>`, so its copies, syncs and cache prefix (`gpufed-cache/<tenant>/<name>/<v>/`)
are the tenant's too. A reference is `name` (the caller's own tenant's) or `tenant/name` (another
tenant's, usable only when shared with the caller's tenant); an outsider's reference to an unshared
dataset answers exactly as one to a dataset that does not exist, after the same etcd reads.

Datasets registered before names were per tenant keep their key (`/gpufed/datasets/<name>`), their name
and their copies: `lookup` reads that key as the fallback of `<tenant>/<name>` when it belongs to
`<tenant>`, so old state directories keep working without moving any object.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from datasync import (
    CachedCopy,
    CacheState,
    CopyKey,
    Dataset,
    DatasetName,
    DatasetVersion,
    ExistingCopy,
    Manifest,
    StoreName,
    VersionId,
    dataset_from_json,
    dataset_to_json,
    manifest_from_json,
    manifest_to_json,
)
from federation.errors import Conflict, FailedPrecondition, InvalidSpec
from federation.spec.validate import shown
from federation.store.kv import Compare, Delete, KeyValueStore, Op, Put
from federation.store.records import DatasetLocation, SchedulingSettings
from federation.store.schema_version import checked, dumps, loads, stamp_json
from placement.model import TenantId

DATASETS = b"/gpufed/datasets/"
MANIFESTS = b"/gpufed/manifests/"
CACHES = b"/gpufed/caches/"
COPY_ETAGS = b"/gpufed/copy-etags/"
# A manifest row is about 100 bytes: past this a manifest would crowd etcd's 1.5 MiB request limit.
MAX_MANIFEST_BYTES = 1_000_000

_DATASET_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
# Starts with a letter or digit, so a version is never '.' or '..' inside an object path.
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_MAX_PREFIX = 512
# Every store's `gpufed-cache/` holds copies only (each version under its own prefix, so evicting one never
# deletes an object another version or dataset references); `.gpufed/` holds datasync's state.
CACHE_ROOT = "gpufed-cache"
RESERVED_ROOTS = frozenset({CACHE_ROOT, ".gpufed"})


_TENANT = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
REF_RULE = "'name' (your tenant's) or 'tenant/name' (a dataset another tenant shared with yours)"


def dataset_name_field(value: Any, field: str = "name") -> DatasetName:
    if not isinstance(value, str) or len(value) > 253 or not _DATASET_NAME.fullmatch(value):
        raise InvalidSpec(
            field, f"must be a dataset name (lowercase letters, digits, '-' and '.'), got {shown(value)}"
        )
    return DatasetName(value)


def dataset_ref_field(value: Any, field: str = "name") -> str:
    """A reference to a dataset: a bare name, or `tenant/name`."""
    if isinstance(value, str):
        owner, slash, bare = value.rpartition("/")
        if (not slash or _TENANT.fullmatch(owner)) and len(bare) <= 253 and _DATASET_NAME.fullmatch(bare):
            return value
    raise InvalidSpec(
        field, f"must be {REF_RULE}, with lowercase letters, digits, '-' and '.', got {shown(value)}"
    )


def qualified(tenant: str, reference: str) -> str:
    """The registry's name a reference means to `tenant`: `tenant/name` as given, a bare name in its own."""
    return reference if "/" in reference else f"{tenant}/{reference}"


def reference(dataset: Dataset) -> str:
    """How anyone names the dataset (`tenant/name`), a dataset registered before per-tenant names too."""
    return dataset.name if "/" in dataset.name else f"{dataset.tenant}/{dataset.name}"


def version_field(value: Any, field: str = "version") -> VersionId:
    if not isinstance(value, str) or not _VERSION.fullmatch(value):
        raise InvalidSpec(
            field, f"must be 1 to 64 letters, digits, '.', '_' or '-', starting with one, got {shown(value)}"
        )
    return VersionId(value)


def prefix_field(value: Any, field: str = "prefix") -> str:
    """An object prefix inside a store: relative, no '..' or empty segments, no control characters."""
    if not isinstance(value, str) or not value or len(value) > _MAX_PREFIX:
        raise InvalidSpec(
            field, f"must be an object prefix of 1 to {_MAX_PREFIX} characters, got {shown(value)}"
        )
    text = value if value.endswith("/") else value + "/"
    segments = text[:-1].split("/")
    if segments[0] in RESERVED_ROOTS:
        # A home under the cache would be deleted with the copy evicted there (another dataset's data).
        raise InvalidSpec(
            field, f"{segments[0]}/ is reserved for gpufed's copies and state, got {shown(value)}"
        )
    if (
        text.startswith("/")
        or any(s in ("", ".", "..") for s in segments)
        or any(ord(c) < 32 or c == "\x7f" for c in text)
    ):
        raise InvalidSpec(
            field,
            "must be a relative prefix such as 'imagenet/v3/' (no leading '/', no empty, '.' or '..' "
            f"parts, no control characters), got {shown(value)}",
        )
    return text


def cache_prefix(dataset: str, version: str) -> str:
    """Where a copy of a version lives in a store that is not its home."""
    return f"{CACHE_ROOT}/{dataset}/{version}/"


def resolve(dataset: Dataset, version: str | None) -> DatasetVersion | None:
    """The version a reference names: the given one, or the latest when it names none."""
    return dataset.latest() if version is None else dataset.version(VersionId(version))


@dataclass(frozen=True, slots=True)
class CopyEtags:
    """What a copy held when it was last verified (hashed by a sync, a repair or a scrub)."""

    etags: dict[str, str]
    verified_at_s: float


@dataclass(frozen=True, slots=True)
class StoredDataset:
    value: Dataset
    mod_revision: int


def _dataset_key(name: str) -> bytes:
    return DATASETS + name.encode()


def _manifest_key(name: str, version: str) -> bytes:
    return MANIFESTS + f"{name}/{version}".encode()


def _cache_key(key: CopyKey) -> bytes:
    return CACHES + f"{key.store}/{key.dataset}/{key.version}".encode()


def _etags_key(key: CopyKey) -> bytes:
    return COPY_ETAGS + f"{key.store}/{key.dataset}/{key.version}".encode()


def _copy_to_json(c: CachedCopy) -> bytes:
    return dumps(
        {"size_bytes": c.size_bytes, "last_used_s": c.last_used_s, "pinned_by": sorted(c.pinned_by)},
        sort_keys=True,
    )


def _copy_from_json(key: bytes, value: bytes) -> CachedCopy:
    # The store first and the version last (neither has a '/'); between them the dataset's name, which
    # is `tenant/name` (or a bare name registered before names were per tenant).
    store, rest = key[len(CACHES) :].decode().split("/", 1)
    dataset, version = rest.rsplit("/", 1)
    d = loads(value, key)
    return CachedCopy(
        CopyKey(StoreName(store), DatasetName(dataset), VersionId(version)),
        int(d["size_bytes"]),
        float(d["last_used_s"]),
        frozenset(str(j) for j in d["pinned_by"]),
    )


class DatasetRegistry:
    """Datasets, manifests and cached copies over any `KeyValueStore` (etcd, or the in-memory twin)."""

    def __init__(self, kv: KeyValueStore) -> None:
        self._kv = kv

    @property
    def kv(self) -> KeyValueStore:
        """The store the registry is in, for the copy fences (`federation.datasets.fence`)."""
        return self._kv

    async def get(self, name: str) -> StoredDataset | None:
        """The dataset of this registry name (`tenant/name`, or a bare legacy name), exactly."""
        kv = await self._kv.get(_dataset_key(name))
        return (
            None
            if kv is None
            else StoredDataset(dataset_from_json(checked(kv.value, kv.key)), kv.mod_revision)
        )

    async def lookup(self, tenant: str, ref: str) -> StoredDataset | None:
        """The dataset `ref` means to `tenant` (whether the tenant may see it is the caller's check).

        Both keys are always read, whichever answers: the time taken says nothing about which exists.
        """
        name = qualified(tenant, ref)
        owner, _, bare = name.partition("/")
        stored = await self.get(name)
        legacy = await self.get(bare)
        if stored is not None:
            return stored
        return legacy if legacy is not None and legacy.value.tenant == owner else None

    async def list(self) -> list[Dataset]:
        page = await self._kv.range_prefix(DATASETS)
        return [dataset_from_json(checked(kv.value, kv.key)) for kv in page.kvs]

    async def manifest(self, name: str, version: str) -> Manifest | None:
        kv = await self._kv.get(_manifest_key(name, version))
        return None if kv is None else manifest_from_json(checked(kv.value, kv.key))

    async def add_version(
        self,
        tenant: TenantId,
        version: DatasetVersion,
        manifest: Manifest,
        shared_with: frozenset[TenantId],
    ) -> tuple[Dataset, bool]:
        """Register `version` of the tenant's dataset `version.dataset` (a bare name: the registry
        names it `tenant/name`), in one transaction with its manifest. Returns (dataset, created).

        The same content under an existing version is a no-op (a retried register); different content
        is refused: a version names exactly one content, or jobs could not trust it.
        """
        dataset_name_field(version.dataset)  # a name in the tenant's own namespace, never `other/name`
        body = manifest_to_json(manifest)
        if len(body) > MAX_MANIFEST_BYTES:
            raise FailedPrecondition(
                f"prefix: {manifest.object_count} objects make a manifest of {len(body)} bytes, more than "
                f"the registry keeps ({MAX_MANIFEST_BYTES}); register a smaller prefix"
            )
        stored = await self.lookup(tenant, version.dataset)
        if stored is None:
            name = DatasetName(qualified(tenant, version.dataset))
            version = replace(version, dataset=name)
            dataset = Dataset(name, tenant, version.home.store, (version,), shared_with)
            compare = Compare.absent(_dataset_key(name))
        else:
            old = stored.value
            # The tenant's own (lookup finds no other): a legacy dataset keeps its bare name.
            assert old.tenant == tenant
            version = replace(version, dataset=old.name)
            if old.home_store != version.home.store:
                raise FailedPrecondition(
                    f"store: dataset {old.name} lives in store {old.home_store}; register its versions there"
                )
            existing = old.version(version.version)
            if existing is not None:
                if existing.manifest_digest == version.manifest_digest:
                    return old, False
                raise FailedPrecondition(
                    f"version: {old.name}@{version.version} exists with other content; "
                    "versions are immutable, register a new version"
                )
            dataset = replace(
                old, versions=(*old.versions, version), shared_with=old.shared_with | shared_with
            )
            compare = Compare.mod_revision_is(_dataset_key(old.name), stored.mod_revision)
        result = await self._kv.txn(
            [compare],
            [
                Put(_dataset_key(dataset.name), stamp_json(dataset_to_json(dataset))),
                Put(_manifest_key(dataset.name, version.version), stamp_json(body)),
            ],
        )
        if not result.succeeded:
            raise Conflict(f"dataset {dataset.name} changed while registering; try again")
        return dataset, True

    # ---- cached copies

    async def copies(self, store: str | None = None) -> CacheState:
        prefix = CACHES if store is None else CACHES + f"{store}/".encode()
        page = await self._kv.range_prefix(prefix)
        return CacheState(tuple(_copy_from_json(kv.key, kv.value) for kv in page.kvs))

    async def get_copy(self, key: CopyKey) -> tuple[CachedCopy, int] | None:
        kv = await self._kv.get(_cache_key(key))
        return None if kv is None else (_copy_from_json(kv.key, kv.value), kv.mod_revision)

    async def put_copy(
        self,
        copy: CachedCopy,
        *,
        expect_revision: int | None,
        etags: CopyEtags | None = None,
        also: Sequence[Compare] = (),
    ) -> bool:
        """Compare-and-swap one copy record (expect_revision None: it must not exist yet), with its
        verified ETags when given (a sync's or a repair's result), and `also` (the fence still held)."""
        key = _cache_key(copy.key)
        compare = (
            Compare.absent(key) if expect_revision is None else Compare.mod_revision_is(key, expect_revision)
        )
        ops = [Put(key, _copy_to_json(copy))]
        if etags is not None:
            body = {"etags": etags.etags, "verified_at_s": etags.verified_at_s}
            ops.append(Put(_etags_key(copy.key), dumps(body, sort_keys=True)))
        result = await self._kv.txn([compare, *also], ops)
        return result.succeeded

    async def copy_etags(self, key: CopyKey) -> CopyEtags | None:
        kv = await self._kv.get(_etags_key(key))
        if kv is None:
            return None
        d = loads(kv.value, kv.key)
        return CopyEtags({str(p): str(e) for p, e in d["etags"].items()}, float(d["verified_at_s"]))

    async def reusable(self, store: str, dataset: str, version: str) -> tuple[ExistingCopy, ...]:
        """Copies of the dataset's other versions in `store`, with their recorded ETags: a new version
        copies only what changed, the rest server-side from these (see datasync.plan)."""
        out: tuple[ExistingCopy, ...] = ()
        for copy in (await self.copies(store)).copies:
            if copy.key.dataset != dataset or copy.key.version == version:
                continue
            manifest = await self.manifest(copy.key.dataset, copy.key.version)
            etags = await self.copy_etags(copy.key)
            if manifest is not None and etags is not None:
                prefix = cache_prefix(copy.key.dataset, copy.key.version)
                out = (*out, ExistingCopy(prefix, manifest, etags.etags))
        return out

    async def delete_copy(
        self, key: CopyKey, *, expect_revision: int, also: Sequence[Compare] = (), extra: Sequence[Op] = ()
    ) -> bool:
        """Delete the copy record and its ETags at once (with `extra` deletes, if `also` holds)."""
        key_bytes = _cache_key(key)
        compare = Compare.mod_revision_is(key_bytes, expect_revision)
        ops: list[Op] = [Delete(key_bytes), Delete(_etags_key(key)), *extra]
        return (await self._kv.txn([compare, *also], ops)).succeeded


# ---- what the placer sees: every version's home store and size, and the stores holding a copy.

DatasetLocations = Callable[[], Awaitable[tuple[DatasetLocation, ...]]]


def placer_locations(datasets: Sequence[Dataset], copies: CacheState) -> tuple[DatasetLocation, ...]:
    """One location per `tenant/name@version`, and one per `tenant/name` for its latest version
    (a job's reference is qualified with its tenant before it is looked up:
    `federation.scheduling.snapshot`)."""
    out: list[DatasetLocation] = []
    for d in datasets:
        latest = d.latest()
        ref = reference(d)
        for v in d.versions:
            cached = tuple(sorted({c.key.store for c in copies.locations(d.name, v.version)}))
            refs = [f"{ref}@{v.version}"] + ([ref] if v is latest else [])
            out.extend(DatasetLocation(r, v.home.store, v.size_bytes, cached) for r in refs)
    return tuple(out)


def with_registry_locations(
    settings: SchedulingSettings, registry: Sequence[DatasetLocation]
) -> SchedulingSettings:
    known = {loc.dataset for loc in registry}
    seed = tuple(loc for loc in settings.datasets if loc.dataset not in known)
    return replace(settings, datasets=(*registry, *seed))


def locations_reader(registry: DatasetRegistry) -> DatasetLocations:
    async def read() -> tuple[DatasetLocation, ...]:
        return placer_locations(await registry.list(), await registry.copies())

    return read
