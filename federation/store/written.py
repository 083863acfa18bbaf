"""The job records a process wrote, kept until its own watch of the jobs shows them.

Every job record the leader writes (a submission, an admission, each transition) comes back to it
through the job cache's watch, and was decoded there again: five records a job, 5.7 µs each (a
one-pod job's 1.5 KB record, timed alone), about 30 µs of the server's 5 to 6 ms a job at 100
clusters (py-spy `--gil` put `job_from_json` under `KvStore.watch_jobs` at 3 % of its samples, which
timing alone did not bear out). The writer holds the record it encoded: when the watch brings back
exactly the bytes it wrote under that key, the record is the one it wrote, and the watch yields that
record rather than decoding the bytes again.

Why this is safe: the bytes are compared whole, so an event carries this record only where its value
is the very encoding of it; a record another process wrote, or this one wrote differently since, is
decoded as before. A write that failed (lost its compare, or raised) takes its entry back, and one
that was never seen (the watch broke and the cache listed again) is dropped when the key is next
written or deleted, or when more than `MAX_KEPT` wait: then the record is decoded, as it always was.

What it rests on: a record equals the decoding of its own encoding. A field held in memory as
something its encoding decodes to differently (a list for a tuple, an int for a float) would leave
the leader's cache unlike every other reader's. The test suite checks it on every record taken
(`CHECK_ENV`, set by tests/conftest.py and inherited by the servers the tests start): a record unlike
its decoding stops the process (`WrittenRecordDiffers`, a `BaseException`, so that no `except
Exception` on the watch's way turns it into a relist and a log line).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Sequence
from typing import Final, Protocol, TypeVar

from federation.store.jobs import JobRecord, job_from_json

# Records kept for the watch at most. A burst's writes are seen within a second or so; a watch that
# broke leaves its entries until their keys are written again, and this bounds what they hold.
MAX_KEPT = 16_384
# "1": every record taken is checked against the decoding of its bytes (the test suite sets it).
CHECK_ENV: Final = "GPUFED_CHECK_WRITTEN"


class WrittenRecordDiffers(BaseException):
    """A record this process wrote is not what its bytes decode to (only raised under `CHECK_ENV`)."""


class _Settled(Protocol):
    @property
    def succeeded(self) -> bool: ...


R = TypeVar("R", bound=_Settled)


class WrittenRecords:
    """Records written, by key, with the bytes they were written as."""

    def __init__(self, max_kept: int = MAX_KEPT, *, check: bool | None = None) -> None:
        self._max_kept = max_kept
        self._check = os.environ.get(CHECK_ENV) == "1" if check is None else check
        self._kept: dict[bytes, tuple[bytes, JobRecord]] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def add(self, key: bytes, value: bytes, record: JobRecord) -> None:
        """`record`, encoded as `value`, is about to be written under `key`."""
        kept = self._kept
        kept.pop(key, None)  # to the end: the oldest go first
        kept[key] = (value, record)
        if len(kept) > self._max_kept:
            del kept[next(iter(kept))]

    def take(self, key: bytes, value: bytes) -> JobRecord | None:
        """The record written as `value` under `key`, if this process wrote exactly that; once."""
        entry = self._kept.get(key)
        if entry is None or entry[0] != value:
            return None
        del self._kept[key]
        if self._check:
            decoded = job_from_json(value, key)
            if decoded != entry[1]:
                differ = [
                    name
                    for name in type(decoded).__dataclass_fields__
                    if getattr(decoded, name) != getattr(entry[1], name)
                ]
                raise WrittenRecordDiffers(
                    f"{key.decode()}: the record written differs from its decoding in {differ}"
                )
        return entry[1]

    def forget(self, key: bytes) -> None:
        self._kept.pop(key, None)

    def drop(self, written: Sequence[tuple[bytes, bytes]]) -> None:
        """Writes that did not happen: their entries go, where no later write replaced them."""
        for key, value in written:
            entry = self._kept.get(key)
            if entry is not None and entry[0] is value:
                del self._kept[key]

    async def settled(self, write: Awaitable[R], written: Sequence[tuple[bytes, bytes]]) -> R:
        """`write`'s result; its entries dropped if it failed or raised."""
        try:
            result = await write
        except BaseException:
            self.drop(written)
            raise
        if not result.succeeded:
            self.drop(written)
        return result
