"""Priority classes: names users write in a manifest, and the values the placer orders by."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

DEFAULT_PRIORITY_CLASS = "normal"

# Values leave room between classes for ones an operator adds later.
DEFAULT_PRIORITY_CLASSES: Mapping[str, int] = MappingProxyType(
    {
        "low": 100,
        "normal": 1000,
        "high": 10_000,
        # Needs an admin's time-limited approval once the placer's priority rules land.
        "urgent": 100_000,
    }
)
