"""The HTML finance report opens in headless Chromium and its charts render.

Chromium loads the report from a file with the network shut off; the test reads the DOM Chromium
built (its bars, with their drawn sizes) and a screenshot that must not be blank. `make test`
installs Debian's chromium where it is missing; in CI a missing browser fails the test rather than
skipping it.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from federation.report import ReportQuery, compute_report, render_html
from tests.unit.test_report import an_interval, t

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--proxy-server=127.0.0.1:9",  # nothing may leave the machine; the report needs nothing
]

pytestmark = pytest.mark.skipif(
    CHROMIUM is None and os.environ.get("CI") != "true",
    reason="chromium is not installed (make test installs it)",
)


def _report(path: Path) -> Path:
    ledger = [
        an_interval("2026-11-03T00:00", "2026-11-04T00:00", tenant="vision", gpu="A100"),
        an_interval("2026-11-03T12:00", "2026-11-05T00:00", tenant="nlp", gpu="H100", price=6.0),
        an_interval("2026-11-05T00:00", "2026-11-05T06:00", tenant="audio", gpu="L4", price=0.8),
    ]
    query = ReportQuery(t("2026-11-01"), t("2026-12-01"), t("2026-11-06"))
    path.write_text(render_html(compute_report(ledger, [], query)))
    return path


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None, "chromium is missing: `make test` installs Debian's chromium"
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def _png_is_not_blank(png: bytes) -> bool:
    """True when the PNG's pixel rows differ (a chart drew something on the white page)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    data, pos = b"", 8
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos : pos + 8])
        if kind == b"IDAT":
            data += png[pos + 8 : pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(data)
    return len({raw[i : i + 64] for i in range(0, len(raw), 4096)}) > 3


def test_the_charts_render_in_headless_chromium(tmp_path: Path) -> None:
    page = _report(tmp_path / "report.html")
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri()).stdout
    cost_chart = re.search(r'<svg id="cost-by-tenant".*?</svg>', dom, re.S)
    type_chart = re.search(r'<svg id="gpu-hours-by-type".*?</svg>', dom, re.S)
    assert cost_chart is not None
    assert type_chart is not None
    # Three days of cost, one bar per tenant that ran that day (vision and nlp on the 3rd).
    tenants_drawn = re.findall(r'class="bar" data-tenant="([^"]+)"', cost_chart.group(0))
    assert sorted(tenants_drawn) == ["audio", "nlp", "nlp", "vision"]
    heights = [float(h) for h in re.findall(r'class="bar"[^>]*height="([0-9.]+)"', cost_chart.group(0))]
    assert all(h > 0 for h in heights)
    assert re.findall(r'data-gpu-type="([^"]+)"', type_chart.group(0)) == ["A100", "H100", "L4"]

    shot = tmp_path / "report.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=900,1200", page.as_uri())
    assert _png_is_not_blank(shot.read_bytes())
