"""Kubernetes resource quantities (`500m`, `4Gi`, `2`) as numbers the scheduler can add.

CPU is kept in millicores and everything else in base units, as integers, so that summing the
requests of a node's pods never drifts. `canonical` gives the string form a real API server stores.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from enum import StrEnum

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


# -- canonical form -------------------------------------------------------------------------------
# A real API server decodes every quantity and writes it back in canonical form: `1000m` is read
# back as `1`, a JSON number 4 as the string "4", `1024Mi` as `1Gi`. Clients depend on it (the
# python client's models reject a number where a quantity string belongs), so the simulator stores
# quantities the same way.

_NUMBER = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(.*)")
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIXES = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL_BY_EXPONENT = {e: s for s, e in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_POWER = {p: s for s, p in _BINARY_SUFFIXES.items()}
_NANO = Decimal("1e-9")


class Format(StrEnum):
    DECIMAL_SI = "DecimalSI"
    BINARY_SI = "BinarySI"
    DECIMAL_EXPONENT = "DecimalExponent"


def parse_with_format(value: object) -> tuple[Decimal, Format]:
    """A quantity's value and the notation it was written in, as the API server parses it."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise QuantityError(f"quantities must be strings or numbers, not {type(value).__name__}")
    text = repr(value) if isinstance(value, float) else str(value)
    match = _NUMBER.fullmatch(text.strip() if isinstance(value, str) else text)
    if match is None or (isinstance(value, str) and value != value.strip()):
        raise QuantityError(f"quantities must match the regular expression '{_PATTERN}'")
    number, suffix = Decimal(match.group(1)), match.group(2)
    if suffix in _BINARY_SUFFIXES:
        return number * Decimal(1024) ** _BINARY_SUFFIXES[suffix], Format.BINARY_SI
    if suffix in _DECIMAL_SUFFIXES:
        return number.scaleb(_DECIMAL_SUFFIXES[suffix]), Format.DECIMAL_SI
    if suffix[:1] in ("e", "E") and re.fullmatch(r"[eE][+-]?[0-9]+", suffix):
        return number.scaleb(int(suffix[1:])), Format.DECIMAL_EXPONENT
    raise QuantityError(f"quantities must match the regular expression '{_PATTERN}'")


_PATTERN = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"


def canonical(value: object) -> str:
    """The string a real API server returns for a quantity: `1000m` -> `1`, 4 -> `4`, `1Gi` stays."""
    amount, fmt = parse_with_format(value)
    # Anything finer than a nano-unit is rounded up, as the server rounds.
    amount = (amount / _NANO).to_integral_value(rounding=ROUND_CEILING) * _NANO
    if amount == 0:
        return "0"
    if fmt is Format.BINARY_SI and (abs(amount) < 1024 or amount != amount.to_integral_value()):
        fmt = Format.DECIMAL_SI
    if fmt is Format.BINARY_SI:
        whole_amount = int(amount)
        power = 0
        while power < 6 and whole_amount % 1024 == 0:
            whole_amount //= 1024
            power += 1
        return f"{whole_amount}{_BINARY_BY_POWER.get(power, '')}"
    # Decimal: an integer mantissa times a power of ten that is a multiple of three, as large as
    # it can be.
    sign, digits, exponent = amount.normalize().as_tuple()
    assert isinstance(exponent, int)
    mantissa = int("".join(map(str, digits)))
    shift = exponent % 3
    mantissa *= 10**shift
    exponent -= shift
    if fmt is Format.DECIMAL_SI and exponent > 18:
        mantissa *= 10 ** (exponent - 18)
        exponent = 18
    text = f"{'-' if sign else ''}{mantissa}"
    if fmt is Format.DECIMAL_EXPONENT:
        return text if exponent == 0 else f"{text}e{exponent}"
    return f"{text}{_DECIMAL_BY_EXPONENT[exponent]}"
