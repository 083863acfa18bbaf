"""The parts of a manifest that say which GPUs and where: `minGpuMemoryGiB` and `spec.placement`,
and the check of `gpuTypes` against the federation's GPU types at submission.

The names in `gpuTypes` are checked at submission, not when the manifest is parsed, because the
admin may add types in the federation config (`gpuTypes:` there, `placement.gpu_types`): the
server checks against its settings, and an unknown name (`a100`, `H10`) is refused with the
closest known ones instead of waiting forever for GPUs no cluster will ever report.

Pinning names are not checked against the clusters that exist: a tenant learns nothing from
submitting a job pinned to a name it guessed (the job waits, and says which of the clusters that
have its GPUs the rules rule out, as an unpinned job's reasons name them anyway).
"""

from __future__ import annotations

import re
from typing import Any

from federation.errors import InvalidSpec
from federation.spec.jobspec import TrainingJobSpec
from federation.spec.manifest_text import key_path, shorten
from placement.gpu_types import GpuRegistry, UnknownGpuType
from placement.model import NO_PINNING, Pinning, Provider

# Only what the most memory any GPU type has, with room (a GPU of 1 TiB is a typo).
MAX_GPU_MEMORY_GIB = 1024
MAX_PINNED = 32
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")
# Key in the manifest -> Pinning field, "only" lists before "not" lists.
PLACEMENT_KEYS = {
    "clusters": "clusters",
    "excludeClusters": "exclude_clusters",
    "regions": "regions",
    "excludeRegions": "exclude_regions",
    "clouds": "clouds",
    "excludeClouds": "exclude_clouds",
}
_CLOUDS = tuple(p.value for p in Provider)


def min_gpu_memory_gib(value: object, path: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GPU_MEMORY_GIB:
        raise InvalidSpec(
            path,
            f"must be a whole number of GiB from 1 to {MAX_GPU_MEMORY_GIB} (80 for an 80 GB GPU), "
            f"got {value!r}",
        )
    return value


def _names(value: object, path: str, cloud: bool) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise InvalidSpec(path, f"must be a list of names, got {shorten(repr(value))}")
    if len(value) > MAX_PINNED:
        raise InvalidSpec(path, f"must have at most {MAX_PINNED} names, got {len(value)}")
    names: list[str] = []
    for i, item in enumerate(value):
        at = f"{path}[{i}]"
        if cloud:
            if item not in _CLOUDS:
                raise InvalidSpec(at, f"must be one of {', '.join(_CLOUDS)}, got {shorten(repr(item))}")
        elif not isinstance(item, str) or not _NAME.fullmatch(item):
            raise InvalidSpec(
                at,
                "must be a cluster or region name (lowercase letters, digits, '-' and '.', at most 63 "
                f"characters), got {shorten(repr(item))}",
            )
        if item not in names:
            names.append(item)
    return tuple(sorted(names))


def pinning(value: object, path: str) -> Pinning:
    """`spec.placement`: {clusters, excludeClusters, regions, excludeRegions, clouds, excludeClouds}."""
    if value is None:
        return NO_PINNING  # shared: one object per job adds up in a deep queue
    if not isinstance(value, dict):
        raise InvalidSpec(path, f"must be a mapping with any of {', '.join(PLACEMENT_KEYS)}")
    for key in value:
        if key not in PLACEMENT_KEYS:
            raise InvalidSpec(
                key_path(path, str(key)),
                f"unknown field {shorten(str(key))}; expected one of: {', '.join(PLACEMENT_KEYS)}",
            )
    found: dict[str, Any] = {
        attr: _names(value[key], key_path(path, key), key.lower().endswith("clouds"))
        for key, attr in PLACEMENT_KEYS.items()
        if value.get(key) is not None
    }
    result = Pinning(**found)
    for only, never, what in (
        ("clusters", "exclude_clusters", "cluster"),
        ("regions", "exclude_regions", "region"),
        ("clouds", "exclude_clouds", "cloud"),
    ):
        both = set(getattr(result, only)) & set(getattr(result, never))
        if both:
            raise InvalidSpec(path, f"{what} {sorted(both)[0]!r} is both required and excluded")
    return result


def placement_document(rules: Pinning) -> dict[str, list[str]]:
    """`spec.placement` as the canonical manifest writes it (lists that are set, in key order)."""
    return {key: list(getattr(rules, attr)) for key, attr in PLACEMENT_KEYS.items() if getattr(rules, attr)}


def check_gpu_request(spec: TrainingJobSpec, registry: GpuRegistry) -> None:
    """InvalidSpec naming `spec.gpuTypes[i]` for a name the federation does not know, with the
    closest names; or naming `spec.minGpuMemoryGiB` when no type accepted has that much."""
    for i, name in enumerate(spec.gpu_types):
        try:
            registry.check(name)
        except UnknownGpuType as error:
            known = ", ".join(registry.names())
            raise InvalidSpec(f"spec.gpuTypes[{i}]", f"{error} (known types: {known})") from None
    if spec.min_gpu_memory_gib and not registry.expand(spec.gpu_types, spec.min_gpu_memory_gib):
        named = f"of {', '.join(spec.gpu_types)} " if spec.gpu_types else ""
        raise InvalidSpec(
            "spec.minGpuMemoryGiB",
            f"no GPU type {named}has {spec.min_gpu_memory_gib} GiB (the most: "
            f"{max((registry.memory_gib(t) or 0) for t in registry.expand(spec.gpu_types))} GiB)",
        )
