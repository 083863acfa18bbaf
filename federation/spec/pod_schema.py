"""A task's pod template checked against the Kubernetes schema, with errors that name the field.

The schema is the official `kubernetes` client's: its models (pydantic, one per API type) declare
every field of `PodTemplateSpec` with its JSON name, type and whether it is required, and are
regenerated from the API's OpenAPI document for each Kubernetes release. Checking against them
means a template gpufed accepts is one a real API server decodes, and a misspelt field
(`contaners`, or Python's `working_dir` for `workingDir`) is refused at submission with its path,
not by the member cluster minutes later.

Two passes: a walk over the document along the models, which finds unknown keys and offers the
closest field name; then the models' strict validation, which finds wrong types and missing
required fields. The semantic rules of the API server that the models do not hold (names, ports,
references between volumes and mounts) are `pod_template`'s.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from datetime import date
from functools import cache
from typing import TYPE_CHECKING, Any

from federation.errors import InvalidSpec
from federation.spec.manifest_text import key_path, shorten

if TYPE_CHECKING:
    from pydantic import BaseModel


@cache
def _root() -> type[BaseModel]:
    """PodTemplateSpec's model, imported on first use (pydantic too): the client's models take about
    0.7 s to import, and the CLI imports this package for its duration parser, never a template."""
    from kubernetes.client import models

    root: type[BaseModel] = models.V1PodTemplateSpec
    return root


Loc = tuple[int | str, ...]
# What a field holds, unwrapped from Optional and Annotated: a model, a list or map of something, or
# a scalar (which the models' validation checks).
Shape = tuple[str, Any]


@cache
def _fields(model: type[BaseModel]) -> dict[str, Shape]:
    """The model's fields by their JSON name (`workingDir`), each with the shape of its type."""
    return {
        (field.serialization_alias or name): _unwrap(field.annotation)
        for name, field in model.model_fields.items()
    }


def _unwrap(annotation: Any) -> Shape:
    """('model', cls), ('list', shape), ('map', shape) or ('scalar', None) for a field's annotation."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            options = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(options) != 1:
                return "scalar", None  # int-or-string: checked by the models
            annotation = options[0]
        elif origin is list:
            return "list", _unwrap(typing.get_args(annotation)[0])
        elif origin is dict:
            return "map", _unwrap(typing.get_args(annotation)[1])
        elif isinstance(annotation, type) and hasattr(annotation, "model_fields"):  # a pydantic model
            return "model", annotation
        else:
            return "scalar", None


def _unknown_key(value: dict[Any, Any], model: type[BaseModel], loc: Loc) -> tuple[Loc, str] | None:
    """The location of the first key in `value` (and below) that its model does not declare, and why."""
    fields = _fields(model)
    for key, item in value.items():
        shape = fields.get(key)
        if shape is None:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            camel = "".join(w.capitalize() if i else w for i, w in enumerate(str(key).split("_")))
            hint = (
                f"; did you mean {camel!r}?"
                if camel in fields
                else (f"; did you mean {close[0]!r}?" if close else "")
            )
            return (*loc, str(key)), f"unknown field {shorten(str(key))} of a Kubernetes {_kind(model)}{hint}"
        if shape[0] != "scalar":
            found = _walk(item, shape, (*loc, key))
            if found is not None:
                return found
    return None


def _walk(value: Any, shape: Shape, loc: Loc) -> tuple[Loc, str] | None:
    kind, inner = shape
    if kind == "model" and isinstance(value, dict):
        return _unknown_key(value, inner, loc)
    if kind == "list" and isinstance(value, list) and inner[0] != "scalar":
        for i, item in enumerate(value):
            found = _walk(item, inner, (*loc, i))
            if found is not None:
                return found
    if kind == "map" and isinstance(value, dict) and inner[0] != "scalar":
        for key, item in value.items():
            found = _walk(item, inner, (*loc, str(key)))
            if found is not None:
                return found
    return None


def _kind(model: type[BaseModel]) -> str:
    """`V1VolumeMount` as the API reference names it: VolumeMount."""
    name = model.__name__
    return name[2:] if name.startswith("V1") else name


_TYPE_WORDS = {
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "bool_type": "must be true or false (a YAML boolean, not a string)",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "missing": "is required",
}


_UNION_MEMBERS = frozenset({"int", "str"})


def _found(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return f"{shorten(value)} (a string)"
    return "a mapping" if isinstance(value, dict) else "a list" if isinstance(value, list) else "a value"


def _loc_path(path: str, loc: tuple[int | str, ...]) -> str:
    out = path
    for part in loc:
        out = f"{out}[{part}]" if isinstance(part, int) else key_path(out, part)
    return out


def _json_default(value: object) -> str:
    # A YAML timestamp where a string belongs (an unquoted date in a label): kubectl sends it as text.
    if isinstance(value, date):
        return value.isoformat()
    raise TypeError(type(value).__name__)


def check_schema(template: dict[str, Any], path: str) -> None:
    """InvalidSpec naming the first field of `template` that a Kubernetes API server would not decode."""
    from pydantic import ValidationError

    found = _unknown_key(template, _root(), ())
    if found is not None:
        raise InvalidSpec(_loc_path(path, found[0]), found[1])
    try:
        _root().model_validate_json(json.dumps(template, default=_json_default), strict=True)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        # An int-or-string field reports once per member of its union, the member's type last.
        loc = tuple(p for p in first["loc"] if p not in _UNION_MEMBERS)
        rule = _TYPE_WORDS.get(first["type"], first["msg"][:1].lower() + first["msg"][1:])
        if len(loc) < len(first["loc"]):
            rule = "must be an integer or a string"
        got = "" if first["type"] == "missing" else f", got {_found(first.get('input'))}"
        raise InvalidSpec(_loc_path(path, loc), f"{rule}{got}") from None
