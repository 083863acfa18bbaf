"""Kubernetes resource quantities (`500m`, `16Gi`, `1e3`) as a manifest may write them.

A template's `resources`, an emptyDir's `sizeLimit` and a task's `shmSize` are quantities. A real
API server refuses one it cannot parse (`quantities must match the regular expression ...`), and by
then gpufed would have accepted and queued the job: so they are checked at submission, by the same
grammar (k8s.io/apimachinery `resource.ParseQuantity`), and compared as exact decimals.
"""

from __future__ import annotations

import re
from decimal import Decimal

# The grammar of resource.ParseQuantity: a signed decimal number, then a binary suffix (Ki..Ei), a
# decimal suffix (n, u, m, k, M, G, T, P, E) or an exponent (e3, E-2). No spaces, no "1.5 Gi".
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]{1,3})?"
)
_SCALE = {
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
# A number of more digits than this is no resource anyone has, and Decimal would build it slowly.
_MAX_CHARS = 64

RULE = "a Kubernetes quantity such as '500m', '4', '16Gi' or '1e9' (no spaces)"


def parse_quantity(value: object) -> Decimal | None:
    """The quantity's value in base units, or None when `value` is not one.

    A JSON number is a quantity too (`cpu: 4`), as a real server reads it; a boolean is not."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        value = str(value)
    if not isinstance(value, str) or len(value) > _MAX_CHARS:
        return None
    match = _QUANTITY.fullmatch(value)
    if match is None:
        return None
    number = Decimal(match["number"])
    suffix = match["suffix"] or ""
    if suffix[:1] in ("e", "E") and suffix not in _SCALE:
        return number.scaleb(int(suffix[1:]))
    return number * _SCALE[suffix]


def quantity_text(value: object) -> str | None:
    """The quantity as the string a manifest stores (`4` for a JSON number 4), or None."""
    if parse_quantity(value) is None:
        return None
    return value if isinstance(value, str) else str(value)
