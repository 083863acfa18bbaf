"""Field checks shared by the federation config and admin requests; errors name the field."""

from __future__ import annotations

import re
from typing import Any

from federation.errors import InvalidSpec

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def shown(value: Any, limit: int = 80) -> str:
    """A value as an error message may quote it: its repr, cut short so a huge input is not echoed."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def name_field(value: Any, field: str) -> str:
    """A DNS label, as Kubernetes names namespaces: tenants, users, clusters, stores."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise InvalidSpec(field, f"must be a DNS label (lowercase letters, digits, '-'), got {shown(value)}")
    return value


def number_field(value: Any, field: str, *, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise InvalidSpec(field, f"must be a number >= {minimum}, got {shown(value)}")
    return float(value)


def int_field(value: Any, field: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidSpec(field, f"must be an integer >= {minimum}, got {shown(value)}")
    return value


def flag_field(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidSpec(field, f"must be true or false, got {shown(value)}")
    return value
