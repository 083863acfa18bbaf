"""The array range a user writes (`--array 0-199%20`), parsed into indices and a limit.

The grammar is Slurm's `--array`: comma-separated items, each an index (`7`) or a range (`0-199`)
with an optional step (`0-15:4`), and an optional `%N` at the end, the most copies running at once.
Errors name the part of the text at fault, so `0-199%0`, `5-1` and `0-99999999` each say what is
wrong with them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from federation.errors import InvalidArgument

# The most copies one array may have (Slurm's default MaxArraySize is 1001), and the highest index.
# A set record holds every member, and etcd caps a value at 1.5 MiB.
MAX_ARRAY_COPIES = 1000
MAX_ARRAY_INDEX = 999_999
MAX_ARRAY_TEXT = 256

_ITEM = re.compile(r"(\d{1,9})(?:-(\d{1,9})(?::(\d{1,9}))?)?")


@dataclass(frozen=True, slots=True)
class ArrayRange:
    """The indices, ascending and distinct, and the most copies at once (0: no limit)."""

    indices: tuple[int, ...]
    max_parallel: int = 0

    def text(self) -> str:
        """A canonical spelling, for the set's status: `0-199%20`, `1,3,5`."""
        parts: list[str] = []
        run_start = prev = self.indices[0]
        for index in (*self.indices[1:], None):
            if index is not None and index == prev + 1:
                prev = index
                continue
            parts.append(str(run_start) if run_start == prev else f"{run_start}-{prev}")
            if index is not None:
                run_start = prev = index
        limit = f"%{self.max_parallel}" if self.max_parallel else ""
        return ",".join(parts) + limit


def _fail(text: str, problem: str) -> InvalidArgument:
    return InvalidArgument(f"array {text!r}: {problem}")


def parse_array(text: str) -> ArrayRange:
    """`0-199%20` to its 200 indices and the limit 20; InvalidArgument naming the problem otherwise."""
    if len(text) > MAX_ARRAY_TEXT:
        raise InvalidArgument(f"array: at most {MAX_ARRAY_TEXT} characters, got {len(text)}")
    body, percent, limit_text = text.strip().partition("%")
    max_parallel = 0
    if percent:
        if not limit_text.isdigit() or len(limit_text) > 9:
            raise _fail(text, f"the limit after % must be a whole number, got {limit_text!r}")
        max_parallel = int(limit_text)
        if max_parallel < 1:
            raise _fail(text, "the limit after % must be at least 1 (at most that many copies run at once)")
    if not body:
        raise _fail(text, "no indices: expected for example 0-199, 0-15:4 or 1,3,5 (and %N for a limit)")
    indices: set[int] = set()
    for item in body.split(","):
        found = _ITEM.fullmatch(item.strip())
        if found is None:
            raise _fail(text, f"{item!r} is not an index, a range A-B or a stepped range A-B:S")
        low = int(found.group(1))
        high = low if found.group(2) is None else int(found.group(2))
        step = 1 if found.group(3) is None else int(found.group(3))
        if high < low:
            raise _fail(text, f"range {item.strip()!r} ends before it starts ({high} < {low})")
        if step < 1:
            raise _fail(text, f"range {item.strip()!r} has step {step}; it must be at least 1")
        if high > MAX_ARRAY_INDEX:
            raise _fail(text, f"index {high} is above the highest allowed, {MAX_ARRAY_INDEX}")
        count = (high - low) // step + 1
        if count > MAX_ARRAY_COPIES or len(indices) + count > MAX_ARRAY_COPIES:
            raise _fail(
                text,
                f"more than {MAX_ARRAY_COPIES} copies (the most one array may have); split it into "
                "several arrays",
            )
        indices.update(range(low, high + 1, step))
        if len(indices) > MAX_ARRAY_COPIES:
            raise _fail(text, f"more than {MAX_ARRAY_COPIES} copies (the most one array may have)")
    return ArrayRange(indices=tuple(sorted(indices)), max_parallel=max_parallel)
