"""The console's colours meet WCAG 2 AA: 4.5:1 for text, 3:1 for focus outlines and field edges."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CSS = (Path(__file__).parents[2] / "federation" / "console" / "static" / "console.css").read_text()
VARIABLES = dict(re.findall(r"--([a-z-]+):\s*(#[0-9a-fA-F]{6})", CSS))


def _luminance(colour: str) -> float:
    def channel(value: int) -> float:
        c = value / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast(a: str, b: str) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def _colour(name: str) -> str:
    return VARIABLES[name] if not name.startswith("#") else name


@pytest.mark.parametrize(
    ("fg", "bg", "minimum"),
    [
        ("fg", "bg", 4.5),
        ("fg", "row-alt", 4.5),
        ("fg", "#e8ebef", 4.5),  # table headers
        ("muted", "bg", 4.5),
        ("muted", "row-alt", 4.5),
        ("link", "bg", 4.5),
        ("link", "row-alt", 4.5),
        ("header-fg", "header-bg", 4.5),
        ("header-bg", "#ffffff", 4.5),  # the current page in the navigation
        ("error", "bg", 4.5),
        ("ok", "bg", 4.5),
        ("#ffffff", "link", 4.5),  # button text
        ("#ffffff", "error", 4.5),  # the cancel button
        ("#e6edf3", "#10161f", 4.5),  # log output
        ("focus", "bg", 3.0),
        ("#ffb169", "header-bg", 3.0),  # focus in the header
        ("border", "bg", 3.0),
    ],
    ids=lambda v: str(v),
)
def test_colour_pairs_meet_wcag_aa(fg: str, bg: str, minimum: float) -> None:
    assert contrast(_colour(fg), _colour(bg)) >= minimum


def test_focus_is_never_hidden() -> None:
    assert "outline: none" not in CSS
    assert "outline: 0" not in CSS
    assert re.search(r"a:focus-visible[^{]*\{\s*outline: 3px solid var\(--focus\)", CSS)
    assert ".skip-link:focus" in CSS
