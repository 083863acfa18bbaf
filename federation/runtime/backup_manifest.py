"""A backup's manifest: what `gpufed admin backup` wrote, from when, and each file's checksum.

`manifest.json` sits beside the files it names. Restore reads it first, checks every file's size and
SHA-256 against it, and refuses the backup, naming the file, if one is missing or differs: a backup
copied over a flaky link or half-overwritten must fail before anything is restored, not after.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from federation.errors import GpufedError

MANIFEST = "manifest.json"
FORMAT = "gpufed-backup"
FORMAT_VERSION = 1
_CHUNK_BYTES = 1 << 20


class BackupDamaged(GpufedError):
    """A backup's manifest or one of its files is missing, unreadable or not what the manifest says."""


class BackupRefused(GpufedError):
    """The caller may not back up or restore, or the restore's target is not empty."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    size_bytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class AdminToken:
    """An admin's token as the snapshot holds it (its hash only): whom restore accepts."""

    sha256: str
    user: str
    expires_at_s: float | None = None


@dataclass(frozen=True, slots=True)
class BackupManifest:
    gpufed_version: str
    created_at: str
    created_by: str
    # etcd: the member that served the snapshot, the revision it holds, etcd's own hash and key count
    # (its internal keys included), and how many keys lay under /gpufed/.
    etcd_endpoint: str
    etcd_revision: int
    etcd_hash: int
    etcd_total_keys: int
    gpufed_keys: int
    # history: which backend it was dumped from, its schema revision, rows per table.
    history_backend: str
    history_revision: str
    history_rows: dict[str, int]
    datasets: int
    dataset_versions: int
    admin_tokens: tuple[AdminToken, ...]
    files: dict[str, FileEntry]
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    notes: tuple[str, ...] = field(default=())


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def file_entry(path: Path) -> FileEntry:
    return FileEntry(size_bytes=path.stat().st_size, sha256=sha256_file(path))


def write_manifest(directory: Path, manifest: BackupManifest) -> None:
    doc = asdict(manifest)
    (directory / MANIFEST).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def read_manifest(directory: Path) -> BackupManifest:
    path = directory / MANIFEST
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError as error:
        raise BackupDamaged(f"{path}: no manifest; is {directory} a gpufed backup?") from error
    except (OSError, ValueError) as error:
        raise BackupDamaged(f"{path}: unreadable manifest ({error})") from error
    if doc.get("format") != FORMAT or doc.get("format_version") != FORMAT_VERSION:
        raise BackupDamaged(
            f"{path}: not a gpufed backup of format version {FORMAT_VERSION} "
            f"(format {doc.get('format')!r}, version {doc.get('format_version')!r})"
        )
    try:
        files = {name: FileEntry(**entry) for name, entry in doc.pop("files").items()}
        tokens = tuple(AdminToken(**t) for t in doc.pop("admin_tokens"))
        notes = tuple(doc.pop("notes", ()))
        return BackupManifest(**doc, files=files, admin_tokens=tokens, notes=notes)
    except (KeyError, TypeError, AttributeError) as error:
        raise BackupDamaged(f"{path}: the manifest lacks or mistypes a field ({error})") from error


def verify_files(directory: Path, manifest: BackupManifest) -> None:
    """Raise BackupDamaged naming the first file that is missing or differs from the manifest."""
    for name, entry in sorted(manifest.files.items()):
        path = directory / name
        if Path(name).name != name:
            raise BackupDamaged(f"{directory / MANIFEST}: names a file outside the backup ({name!r})")
        if not path.is_file():
            raise BackupDamaged(f"{path}: missing from the backup")
        size = path.stat().st_size
        if size != entry.size_bytes:
            raise BackupDamaged(f"{path}: {size} bytes, the manifest says {entry.size_bytes}; damaged")
        if sha256_file(path) != entry.sha256:
            raise BackupDamaged(f"{path}: its SHA-256 differs from the manifest's; damaged")
