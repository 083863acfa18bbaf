"""Server-side field validation (`fieldValidation=Strict|Warn|Ignore`) against `openapi`'s tables.

kubectl sends `fieldValidation=Strict` once `/openapi/v3` says the server supports it: a misspelt
or unknown field must then fail the request with `400 BadRequest` (`strict decoding error: unknown
field "spec.contaners"`), as on a real server, instead of being silently stored. `Warn` (a real
server's default) answers with `Warning` headers, `Ignore` says nothing. Open (`object`) parts of
the schema are not checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clusters.sim import errors, openapi
from clusters.sim.resources import ResourceType

_MODES = ("", "Ignore", "Warn", "Strict")


def check_mode(query: Mapping[str, str]) -> None:
    mode = query.get("fieldValidation", "")
    if mode not in _MODES:
        raise errors.bad_request(
            f'fieldValidation: Unsupported value: "{mode}": supported values: "Ignore", "Strict", "Warn"'
        )


def unknown_fields(type_text: str, value: Any, path: str, *, top: bool = False) -> list[str]:
    """The dotted paths in `value` that its type does not declare."""
    if type_text.startswith("[]"):
        if not isinstance(value, list):
            return []
        return [u for i, v in enumerate(value) for u in unknown_fields(type_text[2:], v, f"{path}[{i}]")]
    if type_text.startswith("{}"):
        if not isinstance(value, dict):
            return []
        return [u for k, v in value.items() for u in unknown_fields(type_text[2:], v, f"{path}.{k}")]
    if not type_text.startswith("#") or not isinstance(value, dict):
        return []
    declared = openapi.fields_of(type_text[1:])
    if declared is None:
        return []
    if top:
        declared = {"apiVersion": "string", "kind": "string", "metadata": "#ObjectMeta", **declared}
    out: list[str] = []
    for key, sub in value.items():
        if key.startswith("$"):
            continue  # strategic-merge directives
        where = f"{path}.{key}" if path else key
        if key not in declared:
            out.append(where)
        else:
            out += unknown_fields(declared[key], sub, where)
    return out


def check(rt: ResourceType, body: Any, query: Mapping[str, str], *, partial: bool = False) -> list[str]:
    """Warnings to send, or `400` for Strict; `partial` for patch bodies (checked as far as given)."""
    mode = query.get("fieldValidation", "") or "Warn"
    if mode == "Ignore" or not isinstance(body, dict):
        return []
    unknown = unknown_fields(f"#{openapi.schema_name(rt)}", body, "", top=True)
    if not unknown:
        return []
    messages = [f'unknown field "{u}"' for u in unknown]
    if mode == "Strict":
        raise errors.bad_request("strict decoding error: " + ", ".join(messages))
    return messages
