"""The command blocks README.md and docs/ mark as runnable, for the tests that run them as written.

A block is runnable when the line before its opening fence (blank lines aside) is a marker comment,
invisible in the rendered page: `<!-- runnable -->` (run against `gpufed up`, in the page's order, by
tests/e2e/test_docs_commands.py), or `<!-- runnable: KIND -->` for a block another test runs (KIND
`postgres`: psql against a real PostgreSQL, tests/e2e/test_docs_postgres_guide.py). Blocks without a
marker are illustrations (a config excerpt, a command for a real cloud) and are not run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
_MARKER = re.compile(r"^<!--\s*runnable(?::\s*(?P<kind>[\w-]+))?\s*-->\s*$")
_FENCE = re.compile(r"^(```+)\s*(\w*)\s*$")


@dataclass(frozen=True, slots=True)
class Block:
    page: Path
    line: int  # the opening fence's line, 1-based
    kind: str  # "gpufed" for `<!-- runnable -->`
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def runnable_blocks(page: Path) -> list[Block]:
    """The page's marked blocks, in page order."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    kind: str | None = None
    i = 0
    while i < len(lines):
        marker = _MARKER.match(lines[i].strip())
        if marker is not None:
            kind = marker.group("kind") or "gpufed"
            i += 1
            continue
        fence = _FENCE.match(lines[i])
        if fence is not None:
            closing = fence.group(1)
            body_start = i + 1
            j = body_start
            while j < len(lines) and lines[j].rstrip() != closing:
                j += 1
            if kind is not None:
                blocks.append(Block(page, i + 1, kind, "\n".join(lines[body_start:j]) + "\n"))
            kind = None
            i = j + 1
            continue
        if lines[i].strip():
            kind = None  # a marker must be followed by its block
        i += 1
    return blocks
