"""Small inline-SVG charts for the console's pages (queues, clusters, capacity, finance).

Sizes and positions are SVG attributes (`width="..."`), colours are classes styled by
`static/charts.css`: the Content-Security-Policy forbids inline `style`, not presentation attributes.
Every chart has `role="img"` and an `aria-label` that says in words what it draws, and the page's
table beside it holds the same numbers, so nothing is only in the picture.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from federation.console.layout import e


@dataclass(frozen=True, slots=True)
class Segment:
    """One part of a stacked bar: its CSS class (`seg-...`), its value, and its tooltip."""

    css: str
    value: float
    title: str


@dataclass(frozen=True, slots=True)
class Marker:
    """A vertical line across a bar at `value` (a guarantee, a budget, a forecast)."""

    css: str
    value: float
    title: str


def stacked_bar(
    segments: Sequence[Segment],
    *,
    scale: float,
    label: str,
    markers: Sequence[Marker] = (),
    track: float | None = None,
    width: int = 240,
    height: int = 14,
    css: str = "",
) -> str:
    """A horizontal bar of `segments` left to right, `scale` units wide; `track` (a cap) is drawn
    behind as the room there is. Values beyond `scale` are cut at the end of the bar."""
    unit = width / scale if scale > 0 else 0.0
    parts = [
        f'<svg class="hbar{" " + e(css) if css else ""}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{e(label)}">'
    ]
    if track is not None and track > 0:
        parts.append(
            f'<rect class="track" x="0" y="0" width="{min(width, track * unit):.1f}" height="{height}"/>'
        )
    x = 0.0
    for seg in segments:
        if seg.value <= 0 or x >= width:
            continue
        w = min(width - x, seg.value * unit)
        parts.append(
            f'<rect class="{e(seg.css)}" x="{x:.1f}" y="1" width="{w:.1f}" height="{height - 2}">'
            f"<title>{e(seg.title)}</title></rect>"
        )
        x += w
    for mark in markers:
        if mark.value < 0:
            continue
        mx = min(width - 1.0, mark.value * unit)
        parts.append(
            f'<rect class="{e(mark.css)}" x="{max(0.0, mx - 1):.1f}" y="0" width="2" height="{height}">'
            f"<title>{e(mark.title)}</title></rect>"
        )
    parts.append("</svg>")
    return "".join(parts)


def legend(items: Sequence[tuple[str, str]]) -> str:
    """A legend: (css class, words) per entry, each with a swatch drawn the bar's way."""
    entries = "".join(
        f'<li><svg class="swatch" xmlns="http://www.w3.org/2000/svg" width="12" height="12" '
        f'viewBox="0 0 12 12" aria-hidden="true"><rect class="{e(css)}" x="0" y="0" width="12" '
        f'height="12"/></svg> {e(words)}</li>'
        for css, words in items
    )
    return f'<ul class="legend">{entries}</ul>'


def utc_text(at_s: float, fmt: str = "%Y-%m-%d %H:%M") -> str:
    """A time for people, in UTC (the console's one zone, like the CLI's)."""
    if at_s <= 0:
        return "-"
    return datetime.fromtimestamp(at_s, UTC).strftime(fmt) + " UTC"


def table(
    *,
    table_id: str,
    heads: Sequence[str],
    body: str,
    caption: str = "",
    css: str = "data",
    numeric: Collection[int] = (),
) -> str:
    """A table whose body rows are already HTML (escaped by the page); the `numeric` columns' heads
    are right-aligned like their figures."""
    right = ' class="num"'
    th = "".join(f'<th scope="col"{right if i in numeric else ""}>{e(h)}</th>' for i, h in enumerate(heads))
    cap = f"<caption>{e(caption)}</caption>" if caption else ""
    return f'<table id="{e(table_id)}" class="{e(css)}">{cap}<thead><tr>{th}</tr></thead>{body}</table>'
