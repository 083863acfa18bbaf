"""Stable JSON for datasets, versions and manifests: federation keeps them in etcd and compares bytes.

Stable means: sorted keys, no whitespace, entries in path order, so encoding the same value twice gives
the same bytes (and a CAS compare on etcd sees no spurious change). Every document carries a `format`
tag with a version number, so a later format can still read the old ones. A manifest is written as rows
`[path, size_bytes, sha256]` (about 100 bytes per object): 10,000 objects fit in etcd's 1.5 MiB value
limit; larger manifests should be kept as an object next to the data (`save_manifest`) and only the
version record, which carries the manifest's digest, in etcd.
"""

from __future__ import annotations

import json
from typing import Any

from datasync.model import (
    Dataset,
    DatasetName,
    DatasetVersion,
    Manifest,
    ManifestEntry,
    StoreLocation,
    StoreName,
    VersionId,
)
from placement.model import TenantId

MANIFEST_FORMAT = "gpufed.manifest/1"
VERSION_FORMAT = "gpufed.dataset_version/1"
DATASET_FORMAT = "gpufed.dataset/1"


class CodecError(ValueError):
    """A document that is not what its format tag says (or has none)."""


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _loads(data: bytes | str, expected_format: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise CodecError(f"not JSON: {e}") from e
    if not isinstance(doc, dict) or doc.get("format") != expected_format:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise CodecError(f"expected format {expected_format}, found {found!r}")
    return doc


def manifest_to_json(manifest: Manifest) -> bytes:
    rows = [[e.path, e.size_bytes, e.sha256] for e in manifest.entries]
    return _dumps({"format": MANIFEST_FORMAT, "entries": rows})


def manifest_from_json(data: bytes | str) -> Manifest:
    doc = _loads(data, MANIFEST_FORMAT)
    try:
        return Manifest(tuple(ManifestEntry(str(p), int(s), str(h)) for p, s, h in doc["entries"]))
    except (KeyError, TypeError, ValueError) as e:
        raise CodecError(f"bad manifest entries: {e}") from e


def _version_doc(v: DatasetVersion) -> dict[str, Any]:
    return {
        "dataset": v.dataset,
        "version": v.version,
        "home": {"store": v.home.store, "prefix": v.home.prefix},
        "manifest_digest": v.manifest_digest,
        "size_bytes": v.size_bytes,
        "object_count": v.object_count,
        "created_at_s": v.created_at_s,
    }


def _version_from_doc(d: dict[str, Any]) -> DatasetVersion:
    try:
        return DatasetVersion(
            dataset=DatasetName(d["dataset"]),
            version=VersionId(d["version"]),
            home=StoreLocation(StoreName(d["home"]["store"]), d["home"]["prefix"]),
            manifest_digest=d["manifest_digest"],
            size_bytes=int(d["size_bytes"]),
            object_count=int(d["object_count"]),
            created_at_s=float(d["created_at_s"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CodecError(f"bad dataset version: {e!r}") from e


def version_to_json(version: DatasetVersion) -> bytes:
    return _dumps({"format": VERSION_FORMAT, **_version_doc(version)})


def version_from_json(data: bytes | str) -> DatasetVersion:
    return _version_from_doc(_loads(data, VERSION_FORMAT))


def dataset_to_json(dataset: Dataset) -> bytes:
    return _dumps(
        {
            "format": DATASET_FORMAT,
            "name": dataset.name,
            "tenant": dataset.tenant,
            "home_store": dataset.home_store,
            "versions": [_version_doc(v) for v in dataset.versions],
            "shared_with": sorted(dataset.shared_with),
        }
    )


def dataset_from_json(data: bytes | str) -> Dataset:
    doc = _loads(data, DATASET_FORMAT)
    try:
        return Dataset(
            name=DatasetName(doc["name"]),
            tenant=TenantId(doc["tenant"]),
            home_store=StoreName(doc["home_store"]),
            versions=tuple(_version_from_doc(v) for v in doc["versions"]),
            shared_with=frozenset(TenantId(t) for t in doc["shared_with"]),
        )
    except (KeyError, TypeError) as e:
        raise CodecError(f"bad dataset: {e!r}") from e
