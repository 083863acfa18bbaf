"""Field checks shared by the federation config and admin requests; errors name the field."""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any

from federation.errors import InvalidSpec

# fullmatch, never `^...$` with match: `$` also matches before a final "\n", which let "alice\n" in.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


# Characters that change how text reads on a terminal or in a log without being visible: the
# bidirectional controls (Trojan Source, CVE-2021-42574). Control characters (NUL, ESC, ...) are
# caught by their category; tab and newlines stay allowed (a script, a certificate in an env value).
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_ALLOWED_CONTROLS = frozenset("\t\n\r")


def unsafe_character(text: str) -> tuple[int, str] | None:
    """The first control or bidirectional-control character in `text` (index, 'U+001B'), or None."""
    for i, c in enumerate(text):
        if c in _BIDI_CONTROLS or (unicodedata.category(c) == "Cc" and c not in _ALLOWED_CONTROLS):
            return i, f"U+{ord(c):04X}"
    return None


def free_text(text: str, field: str) -> str:
    """Text a caller writes freely (a reason), refused if it holds control or bidi characters."""
    found = unsafe_character(text)
    if found is not None:
        raise InvalidSpec(
            field, f"must not contain control or bidirectional characters: {found[1]} at character {found[0]}"
        )
    return text


def shown(value: Any, limit: int = 80) -> str:
    """A value as an error message may quote it: its repr, cut short so a huge input is not echoed."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def name_field(value: Any, field: str) -> str:
    """A DNS label, as Kubernetes names namespaces: tenants, users, clusters, stores."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise InvalidSpec(field, f"must be a DNS label (lowercase letters, digits, '-'), got {shown(value)}")
    return value


def number_field(value: Any, field: str, *, minimum: float, maximum: float | None = None) -> float:
    # NaN compares false with everything, so `value < minimum` alone would let it (and infinity) in.
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"from {_figure(minimum)} to {_figure(maximum)}"
        raise InvalidSpec(field, f"must be a number {bound}, got {shown(value)}")
    return float(value)


def _figure(x: float) -> str:
    """A bound as a reader reads it: 1,000,000 rather than 1e+06."""
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def int_field(value: Any, field: str, *, minimum: int, maximum: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"from {_figure(minimum)} to {_figure(maximum)}"
        raise InvalidSpec(field, f"must be an integer {bound}, got {shown(value)}")
    return value


def flag_field(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidSpec(field, f"must be true or false, got {shown(value)}")
    return value
