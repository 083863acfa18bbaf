"""The sync marker: a small record in the target of what a sync wrote there and verified.

It is what makes a no-op re-sync cheap: one listing of the target plus one GET of this object tells,
without a HEAD or a read per object, that every object is still the one we verified (same size and
ETag as when its sha256 was checked). It lives at `<target prefix>.gpufed/sync-state.json` and maps each
relative path to (size, ETag, sha256). It also says which objects we wrote, so that a later version
that drops a path deletes only objects a sync put there, never anything else under the prefix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from datasync.errors import ObjectNotFound
from datasync.manifest import INTERNAL_DIR
from datasync.store import ObjectStore

MARKER_NAME = f"{INTERNAL_DIR}sync-state.json"
_FORMAT = "gpufed.sync_state/1"


def normalize_etag(etag: str | None) -> str | None:
    """ETags compared without their quotes (stores and APIs disagree on whether to send them)."""
    return etag.strip('"') if etag else None


@dataclass(frozen=True, slots=True)
class VerifiedObject:
    """An object at the target whose bytes hashed to `sha256` while it had this size and ETag."""

    size_bytes: int
    etag: str | None
    sha256: str


@dataclass(frozen=True, slots=True)
class SyncState:
    manifest_digest: str
    objects: dict[str, VerifiedObject]

    def to_json(self) -> bytes:
        doc = {
            "format": _FORMAT,
            "manifest_digest": self.manifest_digest,
            "objects": {p: [o.size_bytes, o.etag, o.sha256] for p, o in sorted(self.objects.items())},
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @staticmethod
    def from_json(data: bytes) -> SyncState:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            raise ValueError("not a gpufed sync state")
        return SyncState(
            manifest_digest=str(doc["manifest_digest"]),
            objects={
                p: VerifiedObject(int(s), normalize_etag(e), str(h))
                for p, (s, e, h) in doc["objects"].items()
            },
        )


async def read_marker(store: ObjectStore, prefix: str) -> SyncState | None:
    """The target's sync state, or None when there is none or it is unreadable (then nothing is trusted)."""
    try:
        data = bytes(await store.get(prefix + MARKER_NAME))
    except ObjectNotFound:
        return None
    try:
        return SyncState.from_json(data)
    except (ValueError, KeyError, TypeError):
        return None


async def write_marker(store: ObjectStore, prefix: str, state: SyncState) -> None:
    await store.put(prefix + MARKER_NAME, state.to_json())
