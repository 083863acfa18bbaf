"""Kubernetes resource quantities (`500m`, `4Gi`, `2`) as numbers the scheduler can add.

CPU is kept in millicores and everything else in base units, as integers, so that summing the
requests of a node's pods never drifts.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

_SUFFIXES: dict[str, Decimal] = {
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}


class QuantityError(ValueError):
    pass


def parse(value: object) -> Decimal:
    text = str(value).strip()
    if not text:
        raise QuantityError("empty quantity")
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix) and text[: -len(suffix)]:
            number = text[: -len(suffix)]
            try:
                return Decimal(number) * _SUFFIXES[suffix]
            except InvalidOperation as exc:
                raise QuantityError(f"invalid quantity {text!r}") from exc
    try:
        return Decimal(text)
    except InvalidOperation as exc:
        raise QuantityError(f"invalid quantity {text!r}") from exc


def milli(value: object) -> int:
    """CPU in millicores, rounded up as the scheduler rounds requests."""
    return int((parse(value) * 1000).to_integral_value(rounding="ROUND_CEILING"))


def whole(value: object) -> int:
    """Memory, pods and extended resources in base units, rounded up."""
    return int(parse(value).to_integral_value(rounding="ROUND_CEILING"))
