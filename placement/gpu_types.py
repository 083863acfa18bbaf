"""The GPU types gpufed knows: each variant with its memory and speed, grouped into families.

Jobs name a variant (`A100-80GB`), a family (`A100`: any A100) or only a minimum of GPU memory;
member clusters' node labels (`nvidia.com/gpu.product`, GKE's and Karpenter's accelerator labels)
are read into the same names, so that a job asking for 80 GB never lands on 40 GB nodes.

A family name is also a type of its own: the GPUs of a pool configured as `gpuType: A100` (the form
every config used before variants existed) are "an A100 of a variant nobody stated". Such a pool
serves jobs that ask for the family, or for memory the family's smallest variant has, but never a
job that asks for a variant: the placer cannot promise 80 GB where the config did not say so.

Pure data and lookups (no I/O): the federation, the Kubernetes backend and the placer's callers all
read one table, extended by the admin's `gpuTypes:` in the federation config.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from placement.model_ids import GpuType
from placement.model_values import keep_as_values

# Label values vendors write for form factors: the SXM module (HBM3 and "mega" parts are SXM) or a card.
_FORMS = {"SXM": "SXM", "HBM3": "SXM", "MEGA": "SXM", "PCIE": "PCIE", "NVL": "NVL"}
_TOKEN = re.compile(r"[-_ ]+")
_MEMORY_TOKEN = re.compile(r"(\d{1,4})GB?")
_VENDOR_TOKENS = frozenset({"NVIDIA", "TESLA", "GEFORCE", "AMD", "INSTINCT"})
# A label's memory within this fraction of a variant's counts as that variant's (81559 MiB is 80 GB).
_MEMORY_SLACK = 0.12


@dataclass(frozen=True, slots=True)
class GpuModel:
    """One GPU type as jobs and pools name it."""

    name: GpuType
    # The family's name; equal to `name` for a type with a single variant (`L4`).
    family: GpuType
    memory_gib: int
    # Relative speed, an A100 (40 GB) being 1.0; the config's `gpuSpeeds` wins where it names the type.
    speed: float
    # "SXM", "PCIE" or "NVL" where variants of a family differ by it; "" otherwise.
    form: str = ""
    # Exact label values (lower case) that name this variant, for labels whose words do not tell it
    # (GKE's `nvidia-tesla-a100` is the 40 GB part).
    aliases: tuple[str, ...] = ()


def _m(
    name: str, family: str, memory_gib: int, speed: float, form: str = "", aliases: tuple[str, ...] = ()
) -> GpuModel:
    return GpuModel(GpuType(name), GpuType(family), memory_gib, speed, form, aliases)


# Speeds are rough training throughput relative to an A100 40 GB (dense BF16/FP16 at the sizes
# people train), good enough to rank offers by price per unit of work; admins override them.
BUILTIN_TYPES: tuple[GpuModel, ...] = (
    _m("A100-40GB", "A100", 40, 1.0, aliases=("nvidia-tesla-a100",)),
    _m("A100-80GB", "A100", 80, 1.1),
    _m("H100-SXM", "H100", 80, 2.0, "SXM", aliases=("nvidia-h100-80gb", "nvidia-h100-mega-80gb")),
    _m("H100-PCIE", "H100", 80, 1.6, "PCIE"),
    _m("H100-NVL", "H100", 94, 1.8, "NVL"),
    _m("H200", "H200", 141, 2.3),
    _m("GH200", "GH200", 96, 2.3),
    _m("B200", "B200", 180, 4.0),
    _m("L40S", "L40S", 48, 0.9),
    _m("L40", "L40", 48, 0.7),
    _m("L4", "L4", 24, 0.35),
    _m("A40", "A40", 48, 0.6),
    _m("A30", "A30", 24, 0.5),
    _m("A10G", "A10G", 24, 0.4),
    _m("A10", "A10", 24, 0.4),
    _m("V100-16GB", "V100", 16, 0.5, aliases=("nvidia-tesla-v100",)),
    _m("V100-32GB", "V100", 32, 0.5),
    _m("T4", "T4", 16, 0.15),
    _m("P100", "P100", 16, 0.25),
    _m("MI300X", "MI300X", 192, 2.0),
)


class UnknownGpuType(ValueError):
    """A name that is neither a known type nor a family; `suggestions` holds the closest names."""

    def __init__(self, name: str, suggestions: Sequence[str]) -> None:
        hint = f"; did you mean {' or '.join(suggestions)}?" if suggestions else ""
        super().__init__(f"unknown GPU type {name!r}{hint}")
        self.name = name
        self.suggestions = tuple(suggestions)


class GpuRegistry:
    """The known types: built-in ones plus the admin's (which may replace a built-in of that name)."""

    def __init__(self, models: Iterable[GpuModel] = BUILTIN_TYPES) -> None:
        by_name: dict[GpuType, GpuModel] = {}
        for model in models:
            by_name[model.name] = model
        self.models = by_name
        families: dict[GpuType, list[GpuModel]] = {}
        for model in by_name.values():
            families.setdefault(model.family, []).append(model)
        self.families = {family: tuple(members) for family, members in families.items()}
        # Families with more than one variant: their bare name is a type of unknown variant.
        self._bare = {f: m for f, m in self.families.items() if f not in by_name}
        self._aliases = {alias: model for model in by_name.values() for alias in model.aliases}
        # Longest first, so that "A100" is not read as "A10" nor "L40S" as "L4".
        self._family_words = sorted(self.families, key=lambda f: (-len(f), f))

    def names(self) -> tuple[GpuType, ...]:
        """Every name a job or a pool may use: variants, then families of several variants."""
        return (*self.models, *self._bare)

    def is_known(self, name: str) -> bool:
        return name in self.models or name in self._bare

    def memory_gib(self, name: GpuType) -> int | None:
        """A type's memory; a bare family's is its smallest variant's (what it can promise)."""
        model = self.models.get(name)
        if model is not None:
            return model.memory_gib
        members = self._bare.get(name)
        return None if members is None else min(m.memory_gib for m in members)

    def family_of(self, name: GpuType) -> GpuType:
        model = self.models.get(name)
        return name if model is None else model.family

    def speed(self, name: GpuType) -> float | None:
        model = self.models.get(name)
        if model is not None:
            return model.speed
        members = self._bare.get(name)
        return None if members is None else min(m.speed for m in members)

    def check(self, name: str) -> GpuType:
        """`name` as a known type, or UnknownGpuType with the closest names."""
        if self.is_known(name):
            return GpuType(name)
        raise UnknownGpuType(name, self.suggest(name))

    def suggest(self, name: str, limit: int = 3) -> list[str]:
        """Known names closest to `name`: a different case first, then by spelling."""
        names = [str(n) for n in self.names()]
        upper = {n.upper(): n for n in names}
        exact = upper.get(name.upper())
        if exact is not None:
            return [exact]
        close = difflib.get_close_matches(name.upper(), list(upper), n=limit, cutoff=0.6)
        return [upper[c] for c in close]

    def expand(self, requested: Sequence[GpuType], min_memory_gib: int = 0) -> tuple[GpuType, ...]:
        """The types a job accepts, in the order it gave them: a family stands for its bare name
        and its variants, and every type has at least `min_memory_gib`. No names: every known type
        with that memory (a job that asks only for memory)."""
        names = requested or self.names()
        accepted: list[GpuType] = []
        for name in names:
            members = self._bare.get(name)
            group = (name, *(m.name for m in members)) if members is not None else (name,)
            for gpu_type in group:
                memory = self.memory_gib(gpu_type)
                # A type the registry does not know (a pool's own name) passes only without a bound.
                if (memory or 0) >= min_memory_gib and gpu_type not in accepted:
                    accepted.append(gpu_type)
        return tuple(accepted)

    def identify(self, product: str, memory_mib: int | None = None) -> GpuType | None:
        """The type a node label names (`NVIDIA-A100-SXM4-80GB`, `nvidia-tesla-a100`, `a100`), or None
        when no family is named. When the label does not tell the variants apart, the bare family."""
        alias = self._aliases.get(product.strip().lower())
        if alias is not None:
            return alias.name
        tokens = [t for t in (t.upper() for t in _TOKEN.split(product) if t) if t not in _VENDOR_TOKENS]
        family = next((f for f in self._family_words if f in tokens), None)
        if family is None:
            family = next((f for f in self._family_words if any(t.startswith(f) for t in tokens)), None)
        if family is None:
            return None
        members = self.families[family]
        if len(members) == 1:
            return members[0].name
        memory = next((int(m[1]) for t in tokens if (m := _MEMORY_TOKEN.fullmatch(t))), None)
        if memory is None and memory_mib:
            memory = round(memory_mib / 1024)
        if memory is not None:
            members = tuple(m for m in members if abs(m.memory_gib - memory) <= m.memory_gib * _MEMORY_SLACK)
        form = next((_FORMS[f] for t in tokens for f in _FORMS if t.startswith(f)), None)
        if form is not None and any(m.form for m in members):
            members = tuple(m for m in members if m.form == form)
        return members[0].name if len(members) == 1 else family


def node_type(identified: GpuType, registry: GpuRegistry, priced: Mapping[GpuType, object] | None) -> GpuType:
    """The type a node counts as on a cluster whose config prices `priced` types: its variant where
    the config names it, else its family (a pool configured as `gpuType: A100`). Without a price list,
    the family: the safe reading, since no variant is promised."""
    family = registry.family_of(identified)
    if priced is None:
        return family
    if identified in priced or family not in priced:
        return identified
    return family


keep_as_values(GpuModel)
