"""The JSON form of a manifest: what the client sends, and how the server reads it safely.

Users write YAML. Parsing YAML in Python was the largest single cost of a submission on the server
(libyaml hands every event to Python), so `GpufedClient` parses the user's YAML with the same strict
loader on the user's machine and sends JSON, which the server reads in a fraction of the time. The
server still accepts YAML, and applies the same limits to both: JSON has no anchors or tags, and
duplicate keys, nesting, value counts, long numbers and lone surrogates are refused here.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from federation.errors import InvalidSpec

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def looks_like_json(text: str) -> bool:
    return text.lstrip()[:1] == "{"


def _pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in items:
        if key in out:
            raise InvalidSpec("manifest", f"duplicate key {key!r}; JSON readers disagree on which one wins")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise InvalidSpec("manifest", f"{name} is not a number a manifest may hold")


def _number(kind: type[int] | type[float], max_number_chars: int) -> Any:
    def parse(literal: str) -> int | float:
        if len(literal) > max_number_chars:
            raise InvalidSpec("manifest", f"numbers may have at most {max_number_chars} characters")
        return kind(literal)

    return parse


# One decoder per number limit (one in practice), kept: `json.loads` with hooks builds a decoder and
# its scanner at every call, a tenth of reading a manifest. A decoder holds nothing of a document
# between calls but its scanner's memo of keys, which only shares equal strings and is emptied after
# each document, so threads may share one.
_DECODERS: dict[int, json.JSONDecoder] = {}


def _decoder(max_number_chars: int) -> json.JSONDecoder:
    decoder = _DECODERS.get(max_number_chars)
    if decoder is None:
        decoder = _DECODERS[max_number_chars] = json.JSONDecoder(
            object_pairs_hook=_pairs,
            parse_int=_number(int, max_number_chars),
            parse_float=_number(float, max_number_chars),
            parse_constant=_constant,
        )
    return decoder


def load_json_manifest(text: str, *, max_depth: int, max_values: int, max_number_chars: int) -> object:
    try:
        value = _decoder(max_number_chars).decode(text)
    except json.JSONDecodeError as error:
        raise InvalidSpec(
            "manifest", f"is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}"
        ) from None
    except RecursionError:
        raise InvalidSpec("manifest", f"nests deeper than {max_depth} levels") from None
    if len(text) <= max_values and "\\u" not in text and (text.isascii() or not _SURROGATE.search(text)):
        # Every value takes at least one character of the text, and a decoded string holds a lone
        # surrogate only if the text does or a \u escape made one: the depth is all that is left to
        # check, and only containers have one. Most manifests take this way; the whole walk looked
        # at every string too, half the cost of reading a manifest (issue 33).
        _check_depth(value, max_depth=max_depth)
    else:
        _check_tree(value, max_depth=max_depth, max_values=max_values)
    return value


def _check_depth(root: object, *, max_depth: int) -> None:
    """`_check_tree`'s depth check alone: the same refusal for a container nested too deep."""
    stack: list[tuple[object, int]] = [(root, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, _CONTAINERS):
            if depth >= max_depth:
                raise InvalidSpec("manifest", f"nests deeper than {max_depth} levels")
            for item in value.values() if isinstance(value, dict) else value:
                if isinstance(item, _CONTAINERS):
                    stack.append((item, depth + 1))


# A tuple, not `dict | list`: isinstance with a union type is several times slower.
_CONTAINERS = (dict, list)


def _check_tree(root: object, *, max_depth: int, max_values: int) -> None:
    """Depth, size and Unicode checks the YAML path makes while scanning, made on the JSON tree."""
    count = 0
    stack: list[tuple[object, int]] = [(root, 0)]
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > max_values:
            raise InvalidSpec("manifest", f"holds more than {max_values} keys and values")
        if isinstance(value, str):
            if _SURROGATE.search(value):
                raise InvalidSpec("manifest", "holds a lone surrogate (not valid Unicode)")
            continue
        if isinstance(value, _CONTAINERS):
            if depth >= max_depth:
                raise InvalidSpec("manifest", f"nests deeper than {max_depth} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and _SURROGATE.search(key):
                    raise InvalidSpec("manifest", "holds a lone surrogate (not valid Unicode)")
                stack.append((item, depth + 1))


def to_json_text(document: object) -> str | None:
    """The JSON a client sends for a manifest it parsed, or None if the document has no JSON form."""

    def default(value: object) -> str:
        if isinstance(value, datetime):
            return value.isoformat()
        raise TypeError(type(value).__name__)

    try:
        return json.dumps(document, default=default, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return None
