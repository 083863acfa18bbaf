"""Priority classes: names users write in a manifest, and the values the placer orders by."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from placement.model import PriorityClass

DEFAULT_PRIORITY_CLASS = "normal"

# The classes a federation has unless its config names its own. Values leave room between classes
# for ones an operator adds later.
DEFAULT_PRIORITY_CLASS_TABLE: tuple[PriorityClass, ...] = (
    PriorityClass("low", 100),
    PriorityClass("normal", 1000),
    PriorityClass("high", 10_000),
    # Deadlines and paper submissions: admitted only with an admin's time-limited approval, and
    # never evicted once running.
    PriorityClass("urgent", 100_000, preemptible=False, needs_approval=True),
)

DEFAULT_PRIORITY_CLASSES: Mapping[str, int] = MappingProxyType(
    {c.name: c.value for c in DEFAULT_PRIORITY_CLASS_TABLE}
)
