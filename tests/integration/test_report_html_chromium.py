"""The HTML finance report opens in headless Chromium and its charts render.

Chromium loads the report from a file with the network shut off. Two looks: the DOM Chromium built,
with the box it laid out for every chart and bar (a copy of the page carries a test-only inline
script that measures them; the report itself has no script), and a screenshot whose pixels must
show the charts' colours. `make test` installs Debian's chromium where it is missing; in CI a
missing browser fails the test rather than skipping it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from federation.ledger.report import ReportQuery, compute_report, render_html
from federation.ledger.report.html import PALETTE
from tests.unit.test_report_query import a_tenant, an_interval, t

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
    "--hide-scrollbars",
    "--proxy-server=127.0.0.1:9",  # nothing may leave the machine; the report needs nothing
]

pytestmark = pytest.mark.skipif(
    CHROMIUM is None and os.environ.get("CI") != "true",
    reason="chromium is not installed (make test installs it)",
)

MEASURE = """<script>
const out = {};
for (const svg of document.querySelectorAll("svg.chart")) {
  const box = svg.getBoundingClientRect();
  out[svg.id] = {width: box.width, height: box.height, bars: [...svg.querySelectorAll(".bar")].map(
    (bar) => { const b = bar.getBoundingClientRect();
               return {key: bar.dataset.tenant || bar.dataset.gpuType, width: b.width, height: b.height}; })};
}
const pre = document.createElement("pre");
pre.id = "measured";
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def _report_html() -> str:
    ledger = [
        # 8 A100 x 24 h x $2 = $384 on the 3rd.
        an_interval("2026-11-03T00:00", "2026-11-04T00:00").tenant("vision").build(),
        # 8 H100 x 36 h x $6: $576 on the 3rd, $1,152 on the 4th.
        an_interval("2026-11-03T12:00", "2026-11-05T00:00").tenant("nlp").gpu("H100").price(6.0).build(),
        # 8 L4 x 6 h x $0.8 on the 5th.
        an_interval("2026-11-05T00:00", "2026-11-05T06:00").tenant("audio").gpu("L4").price(0.8).build(),
    ]
    query = ReportQuery(t("2026-11-01"), t("2026-12-01"), t("2026-11-06"))
    tenants = [a_tenant("vision", guaranteed={"A100": 8}, budget_gpu_hours=1000.0)]
    return render_html(compute_report(ledger, tenants, query))


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None, "chromium is missing: `make test` installs Debian's chromium"
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def _measured(tmp_path: Path) -> dict[str, Any]:
    page = tmp_path / "measured.html"
    page.write_text(_report_html().replace("</body>", MEASURE + "</body>"))
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri()).stdout
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert found is not None, f"the measuring script did not run: {dom[:500]}"
    data: dict[str, Any] = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return data


def test_chromium_lays_out_both_charts_with_bars_sized_by_their_figures(tmp_path: Path) -> None:
    charts = _measured(tmp_path)
    assert set(charts) == {"cost-by-tenant", "gpu-hours-by-type"}
    for chart in charts.values():
        assert chart["width"] > 600
        assert chart["height"] > 100

    cost_bars = charts["cost-by-tenant"]["bars"]
    # One bar per tenant per day it ran: vision and nlp on the 3rd, nlp on the 4th, audio on the 5th.
    assert sorted(b["key"] for b in cost_bars) == ["audio", "nlp", "nlp", "vision"]
    assert all(b["width"] > 0 and b["height"] > 0 for b in cost_bars)
    heights = {(b["key"], round(b["height"])) for b in cost_bars}
    tallest = max(h for _, h in heights)
    # Heights drawn in proportion to cost: nlp's $1,152 day is the full scale, vision's $384 a third.
    assert ("nlp", tallest) in heights
    vision = next(b["height"] for b in cost_bars if b["key"] == "vision")
    assert vision / tallest == pytest.approx(384 / 1152, rel=0.02)

    type_bars = {b["key"]: b["width"] for b in charts["gpu-hours-by-type"]["bars"]}
    assert list(type_bars) == ["A100", "H100", "L4"]
    # GPU-hours: A100 192, H100 288, L4 48.
    assert type_bars["A100"] / type_bars["H100"] == pytest.approx(192 / 288, rel=0.02)
    assert type_bars["L4"] / type_bars["H100"] == pytest.approx(48 / 288, rel=0.02)


def test_a_screenshot_of_the_report_shows_the_charts_colours(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(_report_html())
    shot = tmp_path / "report.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=800,1100", page.as_uri())
    with Image.open(shot) as image:
        pixels = image.convert("RGB")
        colours = pixels.getcolors(maxcolors=1 << 20)
    assert colours is not None
    counts = {rgb: n for n, rgb in colours}
    white = counts.get((255, 255, 255), 0)
    assert white < pixels.width * pixels.height * 0.98, "the page is not blank"
    for hex_colour in PALETTE[:3]:
        rgb = tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
        # A bar is at least a few hundred pixels of its exact fill colour.
        assert counts.get(rgb, 0) > 300, f"no bar drawn in {hex_colour}"
    if os.environ.get("GPUFED_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["GPUFED_KEEP_SCREENSHOT"])
