"""PATCH bodies: JSON merge patch, strategic merge patch and JSON patch.

A strategic merge patch differs from a merge patch in its lists: a list with a patch merge key
(a pod's `containers` by `name`, a Service's `ports` by `port`, a container's `ports` by
`containerPort`, `env` by `name`...) is merged item by item, a list with the merge strategy and no
key (`finalizers`) as a set, and every other list is replaced whole (`tolerations`, `args`). The
directives `$patch` (`delete`, `replace`), `$retainKeys`, `$deleteFromPrimitiveList/<field>` and
`$setElementOrder/<field>` are obeyed. The keys are those the Kubernetes API reference gives for
the kinds served; custom resources (Volcano's) have none, and a real server refuses a strategic
patch for them (the caller does).
"""

from __future__ import annotations

import copy
from typing import Any

from clusters.sim.errors import ApiError, bad_request, unsupported_media

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"

# (field holding the object the list is in, list field) -> merge key; "" marks a merged set of
# primitives. Keyed on the parent field because `ports` means different things in a Service spec and
# in a container.
_CONTAINERS = ("containers", "initContainers", "ephemeralContainers")
MERGE_KEYS: dict[tuple[str, str], str] = {
    **{("spec", c): "name" for c in _CONTAINERS},
    **{(c, "ports"): "containerPort" for c in _CONTAINERS},
    **{(c, "env"): "name" for c in _CONTAINERS},
    **{(c, "volumeMounts"): "mountPath" for c in _CONTAINERS},
    **{(c, "volumeDevices"): "devicePath" for c in _CONTAINERS},
    **{(c, "resizePolicy"): "resourceName" for c in _CONTAINERS},
    ("spec", "volumes"): "name",
    ("spec", "imagePullSecrets"): "name",
    ("spec", "hostAliases"): "ip",
    ("spec", "topologySpreadConstraints"): "topologyKey",
    ("spec", "resourceClaims"): "name",
    ("spec", "schedulingGates"): "name",
    ("spec", "ports"): "port",  # a Service's ports; a pod spec has none
    ("metadata", "ownerReferences"): "uid",
    ("metadata", "finalizers"): "",
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
}


def merge_key(parent: str, field: str) -> str | None:
    return MERGE_KEYS.get((parent, field))


def apply(content_type: str, target: dict[str, Any], patch: Any) -> dict[str, Any]:
    media = content_type.split(";", 1)[0].strip()
    if media in (MERGE, STRATEGIC):
        if not isinstance(patch, dict):
            raise bad_request("a merge patch must be a JSON object")
        merged = merge(target, patch) if media == MERGE else strategic(target, patch, "")
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
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


def strategic(target: Any, patch: dict[str, Any], parent: str) -> dict[str, Any]:
    """A strategic merge patch of one object; `parent` is the field that holds it."""
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
    if patch.get("$patch") == "delete":
        return {}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            drop = value if isinstance(value, list) else []
            result[field] = [v for v in result.get(field) or [] if v not in drop]
        elif key.startswith("$"):
            continue
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = strategic(result.get(key), value, key)
        elif isinstance(value, list) and merge_key(parent, key) is not None:
            result[key] = _merge_list(result.get(key), value, merge_key(parent, key) or "", key)
        else:
            result[key] = copy.deepcopy(value)
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    for key, order in patch.items():
        if key.startswith("$setElementOrder/") and isinstance(order, list):
            field = key.split("/", 1)[1]
            result[field] = _ordered(result.get(field) or [], order, merge_key(parent, field) or "")
    return result


def _merge_list(current: Any, patch: list[Any], key: str, field: str) -> list[Any]:
    items = list(current) if isinstance(current, list) else []
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    if not key:  # a set of primitives
        return items + [copy.deepcopy(p) for p in patch if p not in items]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise bad_request(f"map: {item!r} does not contain declared merge key: {key}")
        index = next(
            (i for i, c in enumerate(items) if isinstance(c, dict) and c.get(key) == item[key]), None
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del items[index]
        elif index is None:
            items.append(strategic({}, item, field))
        else:
            items[index] = strategic(items[index], item, field)
    return items


def _ordered(items: list[Any], order: list[Any], key: str) -> list[Any]:
    def rank(item: Any) -> int:
        wanted = item.get(key) if key and isinstance(item, dict) else item
        for i, o in enumerate(order):
            if (o.get(key) if key and isinstance(o, dict) else o) == wanted:
                return i
        return len(order)

    return sorted(items, key=rank)


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc: Any, parts: list[str], op: dict[str, Any]) -> Any:
    current = doc
    try:
        for part in parts:
            current = current[int(part)] if isinstance(current, list) else current[part]
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise bad_request(f"JSON patch failed at {op.get('from')}: {exc}") from exc
    return current


def json_patch(target: dict[str, Any], ops: list[Any]) -> dict[str, Any]:
    """RFC 6902 add, remove, replace, move, copy and test."""
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict):
            raise bad_request("each JSON patch operation must be an object")
        kind = op.get("op")
        if kind in ("move", "copy"):
            # RFC 6902: read `from`, then add it at `path` (removing the source for a move).
            source = _pointer(str(op.get("from", "")))
            value = _resolve(doc, source, op)
            if kind == "move":
                doc = json_patch(doc, [{"op": "remove", "path": op.get("from")}])
            doc = json_patch(doc, [{"op": "add", "path": op.get("path"), "value": copy.deepcopy(value)}])
            continue
        parts = _pointer(str(op.get("path", "")))
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last = parts[-1]
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
