"""What a real API server normalises on every write: quantities in canonical string form.

The server decodes each quantity field into a `resource.Quantity` and encodes it back, so a client
that sent `nvidia.com/gpu: 4` (a JSON number) or `cpu: 1000m` reads back `"4"` and `"1"`. The
python client's models depend on it: they refuse a number where a quantity string belongs, and one
such object would break every list and watch of its kind. Only the fields that are quantities in
the built-in kinds are touched; a value that does not parse is refused with `400`, as the server's
decoder refuses it. Custom resources (Volcano's) are stored as sent, as a real server stores them:
it does not know which of their fields are quantities. The pods Volcano makes from them are
canonicalised like any pod.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from clusters.sim import errors, quantity
from clusters.sim.changes import clone
from clusters.sim.resources import BATCH_JOBS, NODES, PODS, ResourceType

Obj = dict[str, Any]


def _dict(value: Any) -> Obj | None:
    return value if isinstance(value, dict) else None


def _pod_spec_maps(spec: Obj | None) -> Iterator[Obj]:
    if spec is None:
        return
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for container in spec.get(key) or []:
            resources = _dict(container.get("resources")) if isinstance(container, dict) else None
            if resources is not None:
                yield from (m for k in ("requests", "limits") if (m := _dict(resources.get(k))) is not None)
    resources = _dict(spec.get("resources"))
    if resources is not None:
        yield from (m for k in ("requests", "limits") if (m := _dict(resources.get(k))) is not None)
    overhead = _dict(spec.get("overhead"))
    if overhead is not None:
        yield overhead


def _template_spec(template: Any) -> Obj | None:
    return _dict(template.get("spec")) if isinstance(template, dict) else None


def _maps(rt: ResourceType, obj: Obj) -> Iterator[Obj]:
    spec = _dict(obj.get("spec")) or {}
    if rt is PODS:
        yield from _pod_spec_maps(spec)
    elif rt is NODES:
        status = _dict(obj.get("status")) or {}
        yield from (m for k in ("capacity", "allocatable") if (m := _dict(status.get(k))) is not None)
    elif rt is BATCH_JOBS:
        yield from _pod_spec_maps(_template_spec(spec.get("template")))


def _canonical(name: str, value: Any) -> str:
    if isinstance(value, str) and value in _CANONICAL_CACHE:
        return value
    try:
        text = quantity.canonical(value)
    except quantity.QuantityError as exc:
        raise errors.bad_request(f"unable to decode {name!r}: {exc}") from exc
    if text == value and len(_CANONICAL_CACHE) < 4096:
        _CANONICAL_CACHE.add(text)
    return text


def quantities(rt: ResourceType, obj: Obj) -> None:
    """Rewrite every quantity of `obj` in canonical form.

    `obj` is a new top-level dict, but its parts may be shared with committed objects (a pod made
    from a Job's template, an `edit` of a status): those are never changed in place. When a value
    must change, the part that holds it (`spec` or `status`) is copied first.
    """
    stale = any(_canonical(n, v) != v for values in _maps(rt, obj) for n, v in values.items())
    if not stale:
        return
    for part in ("spec", "status"):
        if isinstance(obj.get(part), dict):
            obj[part] = clone(obj[part])
    for values in _maps(rt, obj):
        for name, value in list(values.items()):
            values[name] = _canonical(name, value)


# Values already seen in canonical form ("8", "1Gi"): most writes repeat a handful of them.
_CANONICAL_CACHE: set[str] = set()
