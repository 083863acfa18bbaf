"""The resume journal: what a sync finished before it was killed, so the next run does not send it again.

Records are appended as they happen: an object verified at the target, a multipart upload started (its
upload id and part size), a part accepted by the target. A run that starts over the same journal trusts
a finished object only if the target still lists it with the recorded size and ETag, and a finished part
only if the target's ListParts still has it, so a stale journal costs a re-send, never a wrong object.

`LocalJournal` appends JSON lines to a file. In an event loop it hands the records of one loop iteration to
the kernel together, at the end of that iteration (one write for the many small objects that finish in
it, where a write per record was a syscall per object); outside a loop it flushes each record. A SIGKILL
loses at most the records of the iteration it interrupts, whose objects are then sent again (a machine
crash may lose the last records too): a lost record costs a re-send, never a wrong object. The sync
removes the journal once its marker is written. `MemoryJournal` is the fake for unit tests.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from datasync.marker import VerifiedObject, normalize_etag
from datasync.store import PartInfo


@dataclass
class UploadState:
    upload_id: str
    part_size_bytes: int
    parts: dict[int, PartInfo] = field(default_factory=dict)


@dataclass
class JournalState:
    finished: dict[str, VerifiedObject] = field(default_factory=dict)
    uploads: dict[str, UploadState] = field(default_factory=dict)

    def apply(self, record: dict[str, object]) -> None:
        kind, path = record.get("t"), str(record.get("p"))
        if kind == "obj":
            self.finished[path] = VerifiedObject(
                int(str(record["s"])),
                normalize_etag(str(record["e"]) if record["e"] else None),
                str(record["h"]),
            )
            self.uploads.pop(path, None)
        elif kind == "mp":
            self.uploads[path] = UploadState(str(record["u"]), int(str(record["ps"])))
        elif kind == "part":
            upload = self.uploads.get(path)
            if upload is not None and upload.upload_id == record["u"]:
                n = int(str(record["n"]))
                upload.parts[n] = PartInfo(n, str(record["e"]), int(str(record["s"])))


class Journal(Protocol):
    def state(self) -> JournalState: ...

    def object_finished(self, path: str, obj: VerifiedObject) -> None: ...

    def upload_started(self, path: str, upload_id: str, part_size_bytes: int) -> None: ...

    def part_finished(self, path: str, upload_id: str, part: PartInfo) -> None: ...

    def clear(self) -> None: ...


def _obj_record(path: str, obj: VerifiedObject) -> dict[str, object]:
    return {"t": "obj", "p": path, "s": obj.size_bytes, "e": obj.etag, "h": obj.sha256}


def _part_record(path: str, upload_id: str, part: PartInfo) -> dict[str, object]:
    return {
        "t": "part",
        "p": path,
        "u": upload_id,
        "n": part.part_number,
        "e": part.etag,
        "s": part.size_bytes,
    }


class MemoryJournal:
    def __init__(self) -> None:
        self.records: list[dict[str, object]] = []

    def state(self) -> JournalState:
        state = JournalState()
        for r in self.records:
            state.apply(r)
        return state

    def object_finished(self, path: str, obj: VerifiedObject) -> None:
        self.records.append(_obj_record(path, obj))

    def upload_started(self, path: str, upload_id: str, part_size_bytes: int) -> None:
        self.records.append({"t": "mp", "p": path, "u": upload_id, "ps": part_size_bytes})

    def part_finished(self, path: str, upload_id: str, part: PartInfo) -> None:
        self.records.append(_part_record(path, upload_id, part))

    def clear(self) -> None:
        self.records.clear()


class LocalJournal:
    """JSON lines in `path`; a torn last line (the process died mid-write) is ignored on reading."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None
        self._flush_scheduled = False

    @staticmethod
    def for_sync(directory: Path, *key_parts: str) -> LocalJournal:
        """The journal of one sync (source, target, manifest digest), in `directory`."""
        digest = hashlib.sha256("\0".join(key_parts).encode()).hexdigest()[:24]
        return LocalJournal(Path(directory) / f"sync-{digest}.jsonl")

    def state(self) -> JournalState:
        state = JournalState()
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                try:
                    state.apply(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    continue
        return state

    def _append(self, record: dict[str, object]) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a")
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        if self._flush_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._file.flush()
            return
        self._flush_scheduled = True
        loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._file is not None:
            self._file.flush()

    def object_finished(self, path: str, obj: VerifiedObject) -> None:
        self._append(_obj_record(path, obj))

    def upload_started(self, path: str, upload_id: str, part_size_bytes: int) -> None:
        self._append({"t": "mp", "p": path, "u": upload_id, "ps": part_size_bytes})

    def part_finished(self, path: str, upload_id: str, part: PartInfo) -> None:
        self._append(_part_record(path, upload_id, part))

    def close(self) -> None:
        """Close the file but keep the records: a sync that failed or was cancelled resumes from them."""
        self._flush_scheduled = False
        if self._file is not None:
            self._file.close()
            self._file = None

    def clear(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
