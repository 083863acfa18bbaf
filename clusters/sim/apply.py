"""Server-side apply and `metadata.managedFields`, simplified but with the documented semantics.

Every write records which manager set which fields (`operation: Update` for create, update and
patch; `operation: Apply` for an apply patch), in the real `FieldsV1` format. An apply
(`application/apply-patch+yaml` with `fieldManager`) sets the fields of its configuration, removes
the fields that manager applied before and no longer applies (unless another manager owns them too),
and fails with `409 Conflict`, naming each field and its owner, when it would change a value
another manager owns; `force=true` takes the fields over instead. Simplified: lists without a merge
key are atomic, field sets are not versioned, and ownership is tracked only for changes made through
the HTTP API (controllers' writes keep the entries as they were).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from clusters.sim import errors, patch
from clusters.sim.clock import rfc3339
from clusters.sim.errors import ApiError
from clusters.sim.resources import ResourceType
from clusters.sim.store import clone

Obj = dict[str, Any]
Path = tuple[str, ...]
# Fields the server owns: never part of a manager's set.
_SERVER_META = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "managedFields",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    }
)
_now_s: list[Any] = []
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def set_clock(wall_s: Any) -> None:
    """The clock that stamps managedFields entries (the cluster's), set when the server starts."""
    _now_s[:] = [wall_s]


def _stamp() -> str:
    import time

    return rfc3339(_now_s[0]() if _now_s else time.time())


def fields(obj: Any, parent: str = "", top: bool = True) -> set[Path]:
    """The leaf paths of an object as field-set steps: `f:<field>`, `k:<merge key>` for items."""
    out: set[Path] = set()
    if not isinstance(obj, dict):
        return out
    for key, value in obj.items():
        if top and key in ("apiVersion", "kind", "status"):
            continue
        if top and key == "metadata" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in _SERVER_META}
            if not value:
                continue
        step = f"f:{key}"
        mkey = patch.merge_key(parent, key)
        if isinstance(value, dict) and value:
            out |= {(step, *p) for p in fields(value, key, False)}
        elif isinstance(value, list) and mkey:
            for item in value:
                if isinstance(item, dict) and mkey in item:
                    item_step = "k:" + json.dumps({mkey: item[mkey]}, separators=(",", ":"))
                    out.add((step, item_step, "."))
                    out |= {(step, item_step, *p) for p in fields(item, key, False)}
                else:
                    out.add((step, "v:" + json.dumps(item, separators=(",", ":"))))
        else:
            out.add((step,))
    return out


def _value(obj: Any, path: Path) -> Any:
    current = obj
    for step in path:
        if step == ".":
            return current
        if step.startswith("f:") and isinstance(current, dict):
            current = current.get(step[2:])
        elif step.startswith("k:") and isinstance(current, list):
            key, wanted = next(iter(json.loads(step[2:]).items()))
            current = next((i for i in current if isinstance(i, dict) and i.get(key) == wanted), None)
        elif step.startswith("v:") and isinstance(current, list):
            value = json.loads(step[2:])
            return value if value in current else None
        else:
            return None
    return current


def _remove(obj: Obj, path: Path) -> None:
    parents: list[Any] = [obj]
    for step in path[:-1]:
        nxt = _value(parents[-1], (step,))
        if nxt is None:
            return
        parents.append(nxt)
    container, last = parents[-1], path[-1]
    if last == ".":
        container, last = parents[-2], path[-2]
    if last.startswith("f:") and isinstance(container, dict):
        container.pop(last[2:], None)
    elif last.startswith("k:") and isinstance(container, list):
        item = _value(container, (last,))
        if item is not None:
            container.remove(item)
    elif last.startswith("v:") and isinstance(container, list):
        value = json.loads(last[2:])
        if value in container:
            container.remove(value)


def _to_v1(paths: set[Path]) -> Obj:
    tree: Obj = {}
    for path in sorted(paths):
        node = tree
        for step in path:
            node = node.setdefault(step, {})
    return tree


def _from_v1(tree: Any, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    if not isinstance(tree, dict):
        return out
    for step, sub in tree.items():
        if isinstance(sub, dict) and sub:
            out |= _from_v1(sub, (*prefix, step))
        else:
            out.add((*prefix, step))
    return out


def _entries(obj: Obj) -> list[tuple[str, str, str | None, set[Path]]]:
    out = []
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        if isinstance(entry, dict):
            out.append(
                (
                    str(entry.get("manager", "")),
                    str(entry.get("operation", "Update")),
                    entry.get("subresource"),
                    _from_v1(entry.get("fieldsV1")),
                )
            )
    return out


def _write(
    obj: Obj, entries: list[tuple[str, str, str | None, set[Path]]], changed: set[tuple[str, str]]
) -> None:
    old_times = {
        (e.get("manager"), e.get("operation")): e.get("time")
        for e in (obj.get("metadata") or {}).get("managedFields") or []
        if isinstance(e, dict)
    }
    managed = []
    for manager, operation, sub, paths in entries:
        if not paths:
            continue
        entry: Obj = {
            "manager": manager,
            "operation": operation,
            "apiVersion": obj.get("apiVersion", ""),
            "time": _stamp()
            if (manager, operation) in changed
            else old_times.get((manager, operation), _stamp()),
            "fieldsType": "FieldsV1",
            "fieldsV1": _to_v1(paths),
        }
        if sub:
            entry["subresource"] = sub
        managed.append(entry)
    obj.setdefault("metadata", {})["managedFields"] = managed


def manager_of(query: Mapping[str, str], user_agent: str = "") -> str:
    """`fieldManager`, or the client's name from its User-Agent, as a real server defaults it."""
    manager = query.get("fieldManager", "")
    if len(manager) > 128:
        raise errors.bad_request("fieldManager: Too long: may not be longer than 128")
    return manager or (user_agent.split("/", 1)[0] if user_agent else "unknown")


def record_update(
    obj: Obj, old: Obj | None, query: Mapping[str, str], operation: str, sub: str | None = None
) -> None:
    """Give `query`'s manager the fields this update changed, taking them from other managers.

    A request that itself rewrites `managedFields` is taken as given (kubectl does this to hand a
    client-side applier's fields to its server-side apply); `[{}]` strips them all, and an empty
    list or no list leaves them to the server, as the server-side apply documentation describes.
    """
    incoming = (obj.get("metadata") or {}).get("managedFields")
    current = (old or {}).get("metadata", {}).get("managedFields") or []
    if incoming == [{}]:
        obj["metadata"]["managedFields"] = []
        return
    if incoming and incoming != current and all(isinstance(e, dict) and e.get("manager") for e in incoming):
        return
    manager = query.get("fieldManager") or "unknown"
    entries = _entries(old) if old is not None else []
    new_paths = (
        fields(obj)
        if sub != "status"
        else {("f:status", *p) for p in fields(obj.get("status") or {}, "status", False)}
    )
    changed = new_paths if old is None else {p for p in new_paths if _value(obj, p) != _value(old, p)}
    if not changed and old is not None:
        obj.setdefault("metadata", {})["managedFields"] = clone(old["metadata"].get("managedFields") or [])
        return
    entries = [(m, op, s, paths - changed) for m, op, s, paths in entries]
    mine = next((e for e in entries if e[0] == manager and e[1] == operation and e[2] == sub), None)
    if mine is None:
        entries.append((manager, operation, sub, set(changed)))
    else:
        mine[3].update(changed)
    _write(obj, entries, {(manager, operation)})


def _config(rt: ResourceType, body: Any, query: Mapping[str, str]) -> tuple[Obj, str, bool]:
    if not isinstance(body, dict):
        raise errors.bad_request("an apply patch must be an object")
    manager = query.get("fieldManager", "")
    if not manager:
        raise ApiError(
            422,
            "Invalid",
            'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
            "is required for apply patch",
        )
    if body.get("apiVersion") != rt.api_version or body.get("kind") != rt.kind:
        raise errors.bad_request(
            f"apply patch: apiVersion and kind must be {rt.api_version} and {rt.kind}, "
            f"not {body.get('apiVersion')} and {body.get('kind')}"
        )
    force = query.get("force", "") in ("true", "1")
    return body, manager, force


def apply_create(rt: ResourceType, body: Any, query: Mapping[str, str]) -> Obj:
    """An apply to an object that does not exist creates it, owned by the applier."""
    config, manager, _ = _config(rt, body, query)
    obj = clone(config)
    obj.setdefault("metadata", {}).pop("managedFields", None)
    _write(obj, [(manager, "Apply", None, fields(config))], {(manager, "Apply")})
    return obj


def apply_patch(rt: ResourceType, old: Obj, body: Any, query: Mapping[str, str]) -> Obj:
    config, manager, force = _config(rt, body, query)
    config = clone(config)
    config.setdefault("metadata", {}).pop("managedFields", None)
    applied = fields(config)
    entries = _entries(old)
    conflicts: list[tuple[str, Path]] = []
    for other, operation, sub, paths in entries:
        if (other == manager and operation == "Apply") or sub:
            continue
        for path in applied & paths:
            if _value(config, path) != _value(old, path):
                conflicts.append((other, path))
    if conflicts and not force and not (manager == "kubectl" and _upgrades_client_side_apply(old, conflicts)):
        raise _conflict(rt, old, conflicts)
    taken = {p for _, p in conflicts}
    previous = next((paths for m, op, s, paths in entries if m == manager and op == "Apply" and not s), set())
    entries = [
        (m, op, s, paths - taken)
        for m, op, s, paths in entries
        if not (m == manager and op == "Apply" and not s)
    ]
    entries.append((manager, "Apply", None, applied))
    merged = patch.strategic(clone(old), {k: v for k, v in config.items() if k != "status"}, "")
    others = set().union(*(paths for m, op, s, paths in entries if not (m == manager and op == "Apply")))
    for path in sorted(previous - applied - others, key=len, reverse=True):
        _remove(merged, path)
    _write(merged, entries, {(manager, "Apply")})
    return merged


def _upgrades_client_side_apply(old: Obj, conflicts: list[tuple[str, Path]]) -> bool:
    """A first server-side apply by kubectl after `kubectl apply` takes over without conflicts.

    As the API server does for the manager `kubectl`: the conflicts are allowed when every
    conflicting field is in the object's `kubectl.kubernetes.io/last-applied-configuration` and
    still has the value recorded there (no one else changed it since).
    """
    annotations = (old.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(LAST_APPLIED)
    if not text:
        return False
    try:
        last_applied = json.loads(text)
    except ValueError:
        return False
    owned = fields(last_applied)
    return all(path in owned and _value(last_applied, path) == _value(old, path) for _, path in conflicts)


def _dotted(path: Path) -> str:
    out = ""
    for step in path:
        if step.startswith("f:"):
            out += "." + step[2:]
        elif step.startswith(("k:", "v:")):
            out += "[" + step[2:] + "]"
    return out


def _conflict(rt: ResourceType, old: Obj, conflicts: list[tuple[str, Path]]) -> ApiError:
    version = rt.api_version
    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f'conflict with "{m}" using {version}',
            "field": _dotted(p),
        }
        for m, p in sorted(conflicts)
    ]
    count = len(causes)
    lines = "\n".join(f"- {c['message']}: {c['field']}" for c in causes)
    message = f"Apply failed with {count} conflict{'s' if count != 1 else ''}: {lines}"
    if count == 1:
        message = f"Apply failed with 1 conflict: {causes[0]['message']}: {causes[0]['field']}"
    name = old["metadata"]["name"]
    return ApiError(
        409, "Conflict", message, {"name": name, "group": rt.group, "kind": rt.plural, "causes": causes}
    )
