"""What a real API server normalises on every write: quantities in canonical string form.

The server decodes each quantity field into a `resource.Quantity` and encodes it back, so a client
that sent `nvidia.com/gpu: 4` (a JSON number) or `cpu: 1000m` reads back `"4"` and `"1"`. The
python client's models depend on it: they refuse a number where a quantity string belongs, and one
such object would break every list and watch of its kind. Only the fields that are quantities in
the served kinds are touched; a value that does not parse is refused with `400`, as the server's
decoder refuses it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from clusters.sim import errors, quantity
from clusters.sim.resources import (
    BATCH_JOBS,
    NODES,
    POD_GROUPS,
    PODS,
    QUEUES,
    VOLCANO_JOBS,
    ResourceType,
)

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
    elif rt is VOLCANO_JOBS:
        for task in spec.get("tasks") or []:
            if isinstance(task, dict):
                yield from _pod_spec_maps(_template_spec(task.get("template")))
        if (m := _dict(spec.get("minResources"))) is not None:
            yield m
    elif rt is POD_GROUPS:
        if (m := _dict(spec.get("minResources"))) is not None:
            yield m
    elif rt is QUEUES:
        yield from (m for k in ("capability", "deserved") if (m := _dict(spec.get(k))) is not None)
        guarantee = _dict(spec.get("guarantee")) or {}
        if (m := _dict(guarantee.get("resource"))) is not None:
            yield m


def quantities(rt: ResourceType, obj: Obj) -> None:
    """Rewrite every quantity of `obj` in canonical form, in place, touching only values that change.

    Committed objects are already canonical, so the maps they share with a new version are left
    alone; only freshly written values are replaced.
    """
    for values in _maps(rt, obj):
        for name, value in list(values.items()):
            if isinstance(value, str) and value in _CANONICAL_CACHE:
                continue
            try:
                text = quantity.canonical(value)
            except quantity.QuantityError as exc:
                raise errors.bad_request(f"unable to decode {name!r}: {exc}") from exc
            if text != value:
                values[name] = text
            elif len(_CANONICAL_CACHE) < 4096:
                _CANONICAL_CACHE.add(text)


# Values already seen in canonical form ("8", "1Gi"): most writes repeat a handful of them.
_CANONICAL_CACHE: set[str] = set()
