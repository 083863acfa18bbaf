"""PATCH bodies: JSON merge patch, strategic merge patch (read as a merge patch), JSON patch.

The simulator's clients patch small things (a node's `spec.unschedulable`, labels, annotations, a
status field), for which a strategic merge patch and a merge patch agree. Lists are replaced whole;
strategic-merge directives (`$patch`, `$retainKeys`, `$setElementOrder/...`) are dropped rather than
obeyed, which is the one place a client could see a difference from a real server.
"""

from __future__ import annotations

import copy
from typing import Any

from clusters.sim.errors import ApiError, bad_request, unsupported_media

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def apply(content_type: str, target: dict[str, Any], patch: Any) -> dict[str, Any]:
    media = content_type.split(";", 1)[0].strip()
    if media in (MERGE, STRATEGIC):
        if not isinstance(patch, dict):
            raise bad_request("a merge patch must be a JSON object")
        merged = merge(target, patch)
        assert isinstance(merged, dict)
        return merged
    if media == JSON_PATCH:
        if not isinstance(patch, list):
            raise bad_request("a JSON patch must be a JSON array")
        return json_patch(target, patch)
    raise unsupported_media(content_type)


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(target: dict[str, Any], ops: list[Any]) -> dict[str, Any]:
    """RFC 6902 add, remove, replace and test: what kubectl and the python client send."""
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict):
            raise bad_request("each JSON patch operation must be an object")
        parts = _pointer(str(op.get("path", "")))
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last = parts[-1]
        kind = op.get("op")
        try:
            if kind in ("add", "replace"):
                if isinstance(parent, list):
                    index = len(parent) if last == "-" else int(last)
                    if kind == "add":
                        parent.insert(index, op.get("value"))
                    else:
                        parent[index] = op.get("value")
                else:
                    if kind == "replace" and last not in parent:
                        raise bad_request(f"path {op.get('path')} does not exist")
                    parent[last] = op.get("value")
            elif kind == "remove":
                if isinstance(parent, list):
                    del parent[int(last)]
                else:
                    del parent[last]
            elif kind == "test":
                current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
                if current != op.get("value"):
                    raise ApiError(422, "Invalid", f"test operation failed at {op.get('path')}")
            else:
                raise bad_request(f"unsupported JSON patch operation {kind!r}")
        except (KeyError, IndexError, ValueError) as exc:
            raise bad_request(f"JSON patch failed at {op.get('path')}: {exc}") from exc
    return doc
