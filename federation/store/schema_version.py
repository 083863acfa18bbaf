"""The schema version every JSON document gpufed keeps in etcd carries, in one place.

A document is written with `"schema": SCHEMA_VERSION` (`dumps`, `stamped`); a reader checks it
before decoding (`loads`, `check`, `check_json`). A document without the field was written by a
build before versions existed and reads as version 0, whose form version 1 keeps (version 1 only
added the field). A version newer than this build knows is refused with `SchemaTooNew`, which
names the key and says to upgrade gpufed: guessing at a newer form could misread a job or an
interval, and a rewrite in the old form would drop what the newer build added.

The rule that keeps rolling upgrades safe (docs/deploy.md, "Upgrades"): a build that introduces
version N+1 of a document reads it but keeps writing N; only the next release writes N+1. So
servers one release apart, running side by side during an upgrade, never meet a document newer
than they know.

Four kinds are written without the field, as version 0, because the build before versions
decoded them with `Record(**doc)`, which refuses a key it does not know: sync records
(`/gpufed/syncs/`), audit records (`/gpufed/audit/`), kept-log attempt summaries and the `logs:`
settings (`federation.joblogs.archive`). This build reads
them tolerantly and checks the field, so the next release may write it. Wait reasons
(`/gpufed/waits/`) are a JSON list, not an object, and are rewritten by every cycle: unversioned.
This build reads that list zlib-compressed too, and writes it so only when told to
(`gpufed serve --compress-wait-reasons`, `federation.store.job_store.encode_wait_reasons`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec

from federation.errors import FailedPrecondition

SCHEMA_FIELD = "schema"
SCHEMA_VERSION = 1
# What a document without the field is: the form written before versions existed.
UNVERSIONED = 0


class SchemaTooNew(FailedPrecondition):
    """A stored document was written by a newer gpufed than this one. Permanent until upgraded.
    Only an admin reads the key (a key names a tenant's job or dataset); others read that an
    admin must upgrade."""

    public_message = (
        "a stored object has a newer schema version than this gpufed build reads: "
        "an admin must upgrade gpufed"
    )

    def __init__(self, key: str, version: object) -> None:
        super().__init__(
            f"stored object {key} has schema version {version}, newer than this build reads "
            f"(up to {SCHEMA_VERSION}): upgrade gpufed to a release that knows it; "
            "the object was left as it is"
        )
        self.key = key
        self.version = version
        # Whose the object is, when its reader could tell (a job's `tenant`), so that the API can
        # answer another tenant as it answers for an object that is not there.
        self.tenant: str | None = None


def _key_text(key: bytes | str | None) -> str:
    if key is None:
        return "(key unknown)"
    return key.decode(errors="replace") if isinstance(key, bytes) else key


def stamped(doc: Mapping[str, Any], *, version: int = SCHEMA_VERSION) -> dict[str, Any]:
    """The document with its schema version first (a reader of the raw JSON sees it at once)."""
    out: dict[str, Any] = {SCHEMA_FIELD: version}
    out.update((k, v) for k, v in doc.items() if k != SCHEMA_FIELD)
    return out


def dumps(doc: Mapping[str, Any], *, sort_keys: bool = False) -> bytes:
    """A document as the compact JSON kept in etcd, stamped with this build's schema version."""
    return json.dumps(stamped(doc), separators=(",", ":"), sort_keys=sort_keys).encode()


def check(doc: Mapping[str, Any], key: bytes | str | None) -> int:
    """The document's schema version; raises `SchemaTooNew` for one newer than this build's."""
    version = doc.get(SCHEMA_FIELD, UNVERSIONED)
    # bool is an int to Python, not a version to anyone.
    if not isinstance(version, int) or isinstance(version, bool) or version < UNVERSIONED:
        raise SchemaTooNew(_key_text(key), repr(version))
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(_key_text(key), version)
    return version


def loads(raw: bytes | str, key: bytes | str | None) -> Any:
    """A stored document's JSON, its version checked when it is an object (lists carry none)."""
    doc = json.loads(raw)
    if isinstance(doc, dict):
        check(doc, key)
    return doc


def unversioned(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The document without the version field, for a decoder that takes its keys as arguments."""
    return {k: v for k, v in doc.items() if k != SCHEMA_FIELD}


class _Version(msgspec.Struct):
    schema: int | None = None


# Only the one field is built; the rest of the document is skipped. About a microsecond on a job
# record, against the 13 µs of its typed decode.
_VERSION_JSON = msgspec.json.Decoder(_Version)


_HEAD = b'{"' + SCHEMA_FIELD.encode() + b'":'
# The field as `dumps` writes it in this build's version, with more fields after it.
_CURRENT_HEAD = _HEAD + str(SCHEMA_VERSION).encode() + b","
_NAME = b'"' + SCHEMA_FIELD.encode() + b'"'


def check_json(raw: bytes | str, key: bytes | str | None) -> int:
    """`check` on a document's JSON without decoding the rest, for the typed (msgspec) decoders.
    JSON that is not an object, or not JSON, is left to the decoder to refuse as it always did.

    A job record decodes in about 9 µs; a msgspec pass for the one field took 3.4 µs more on every
    read. So: no `"schema"` anywhere is version 0 (a substring search), and `dumps`'s own form (the
    field first, a plain integer) is read off the front; anything else takes the full pass."""
    data = raw.encode() if isinstance(raw, str) else raw
    if data.startswith(_CURRENT_HEAD):
        # `dumps`'s own form of this build's version, as nearly every record is: one comparison
        # (the steps below cost half a microsecond, paid at every watched write of a job).
        return SCHEMA_VERSION
    if _NAME not in data:
        return UNVERSIONED
    if data.startswith(_HEAD):
        end = data.find(b",", len(_HEAD))
        digits = data[len(_HEAD) : end if end >= 0 else data.find(b"}", len(_HEAD))]
        if digits.isdigit() and len(digits) < 10:
            version = int(digits)
            if version <= SCHEMA_VERSION:
                return version
    return _check_json_fully(data, key)


def _check_json_fully(raw: bytes, key: bytes | str | None) -> int:
    try:
        version = _VERSION_JSON.decode(raw).schema
    except msgspec.DecodeError:
        try:
            doc = json.loads(raw)
        except ValueError:
            return UNVERSIONED
        return check(doc, key) if isinstance(doc, dict) else UNVERSIONED
    if version is None:
        return UNVERSIONED
    return check({SCHEMA_FIELD: version}, key)


def checked(raw: bytes, key: bytes | str | None) -> bytes:
    """The JSON itself once `check_json` has passed it, for decoders that take the bytes."""
    check_json(raw, key)
    return raw


def stamp_json(raw: bytes) -> bytes:
    """A JSON object's bytes, made by a codec outside `federation` (datasync's), stamped with this
    build's version as its first key without decoding it again (a manifest may be megabytes)."""
    body = raw.lstrip()
    if not body.startswith(b"{"):
        raise ValueError("only a JSON object carries a schema version")
    rest = body[1:].lstrip()
    head = b'{"' + SCHEMA_FIELD.encode() + b'":' + str(SCHEMA_VERSION).encode()
    return head + (b"}" if rest.startswith(b"}") else b"," + rest)
