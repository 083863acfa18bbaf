"""`/openapi/v2` in protobuf, the form kubectl asks for (gnostic's `openapi.v2.Document`).

kubectl falls back to the v2 document when the v3 one has no answer, as for `kubectl apply` of a
`v1/List` (no List paths exist in either version; the v2 answer tells kubectl to validate the items
itself). It asks for v2 only as protobuf. The encoder covers what the simulator's Swagger carries:
paths with their operations, query parameters, responses and vendor extensions, and definitions
(`$ref`, type, format, description, properties, items, additionalProperties, allOf). Field
numbers are those of gnostic's OpenAPIv2.proto; extension values travel as YAML (JSON is YAML).
"""

from __future__ import annotations

import json
from typing import Any

Obj = dict[str, Any]
MEDIA = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
_VERBS = {"get": 2, "put": 3, "post": 4, "delete": 5, "patch": 8}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _str(number: int, text: str) -> bytes:
    return _bytes(number, text.encode()) if text else b""


def _bool(number: int, value: bool) -> bytes:
    return _varint(number << 3) + _varint(1) if value else b""


def _extensions(number: int, obj: Obj) -> bytes:
    out = b""
    for key, value in obj.items():
        if key.startswith("x-"):
            any_value = _str(2, json.dumps(value))  # Any.yaml
            out += _bytes(number, _str(1, key) + _bytes(2, any_value))
    return out


def schema(obj: Obj) -> bytes:
    ref = obj.get("$ref") or next((a.get("$ref") for a in obj.get("allOf") or [] if "$ref" in a), "")
    out = _str(1, str(ref)) + _str(2, str(obj.get("format", ""))) + _str(4, str(obj.get("description", "")))
    extra = obj.get("additionalProperties")
    if isinstance(extra, dict):
        out += _bytes(21, _bytes(1, schema(extra)))
    kind = obj.get("type")
    if isinstance(kind, str):
        out += _bytes(22, _str(1, kind))
    items = obj.get("items")
    if isinstance(items, dict):
        out += _bytes(23, _bytes(1, schema(items)))
    properties = obj.get("properties")
    if isinstance(properties, dict):
        named = b"".join(_bytes(1, _str(1, k) + _bytes(2, schema(v))) for k, v in properties.items())
        out += _bytes(25, named)
    return out + _extensions(31, obj)


def _operation(op: Obj) -> bytes:
    out = _str(5, str(op.get("operationId", "")))
    for param in op.get("parameters") or []:
        sub = (
            _str(2, str(param.get("in", "")))
            + _str(4, str(param.get("name", "")))
            + _str(6, str(param.get("type", "")))
            + _bool(20, bool(param.get("uniqueItems")))
        )
        out += _bytes(8, _bytes(1, _bytes(2, _bytes(3, sub))))  # ParametersItem.Parameter.NonBody.Query
    codes = b""
    for code, response in (op.get("responses") or {}).items():
        body = _str(1, str(response.get("description", "")))
        if isinstance(response.get("schema"), dict):
            body += _bytes(2, _bytes(1, schema(response["schema"])))
        codes += _bytes(1, _str(1, str(code)) + _bytes(2, _bytes(1, body)))
    out += _bytes(9, codes)
    return out + _extensions(13, op)


def document(swagger: Obj) -> bytes:
    """The Swagger 2.0 document (as `openapi.swagger` builds it) as a protobuf `Document`."""
    info = swagger.get("info") or {}
    out = _str(1, str(swagger.get("swagger", "2.0")))
    out += _bytes(2, _str(1, str(info.get("title", ""))) + _str(2, str(info.get("version", ""))))
    paths = b""
    for path, item in (swagger.get("paths") or {}).items():
        ops = b"".join(_bytes(_VERBS[verb], _operation(op)) for verb, op in item.items() if verb in _VERBS)
        paths += _bytes(2, _str(1, path) + _bytes(2, ops))
    out += _bytes(8, paths)
    definitions = b"".join(
        _bytes(1, _str(1, name) + _bytes(2, schema(value)))
        for name, value in (swagger.get("definitions") or {}).items()
    )
    return out + _bytes(9, definitions)
