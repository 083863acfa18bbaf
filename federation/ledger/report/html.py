"""A self-contained HTML report: tables and two charts drawn as inline SVG.

No scripts, fonts, stylesheets or images from anywhere else: the file opens the same on a laptop
with no network, in a mail attachment, or in headless Chromium in CI. Charts: cost per day stacked
by tenant, and GPU-hours by GPU type. Chart elements carry stable ids and classes
(`#cost-by-tenant .bar`, `#gpu-hours-by-type .bar`) so tests can find what was drawn.
"""

from __future__ import annotations

import math
from collections import defaultdict
from html import escape

from federation.ledger.report.compute import Report
from federation.ledger.report.idle import idle_by_cluster
from federation.ledger.report.query import Bucket, bucket_label, bucket_start_s, iso_utc
from federation.ledger.report.render import FORECAST_WORDS, report_dict

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
WIDTH, HEIGHT, PAD = 720, 260, 48


def chart_bucket(days: int) -> Bucket:
    """For a period of `days`: days while they fit as bars (two months), then ISO weeks, then months."""
    if days <= 62:
        return Bucket.DAY
    return Bucket.WEEK if days <= 62 * 7 else Bucket.MONTH


def cost_chart(report: Report, bucket: Bucket) -> str:
    """Stacked bars of cost per tenant and period (SVG): the HTML report's chart, and the console's."""
    daily = report.daily_cost_by_tenant
    cost: dict[tuple[float, str], float] = defaultdict(float)
    for day, tenant, usd in daily:
        cost[(bucket_start_s(day, bucket), tenant)] += usd
    periods = sorted({p for p, _ in cost})
    tenants = sorted({t for _, t in cost})
    totals = [sum(cost.get((p, t), 0.0) for t in tenants) for p in periods]
    top = max(totals, default=0.0) or 1.0
    inner_w, inner_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    slot = inner_w / max(1, len(periods))
    bar_w = max(1.0, slot * 0.7)
    per_row = 6
    legend_rows = (len(tenants) + per_row - 1) // per_row
    height = HEIGHT + 16 * max(0, legend_rows - 1)
    parts = [
        f'<svg id="cost-by-tenant" class="chart" data-bucket="{bucket.value}" '
        f'xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="Cost per {bucket.value} by tenant">',
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#333"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#333"/>',
        f'<text x="{PAD - 6}" y="{PAD + 4}" text-anchor="end" font-size="11">${_scale(top)}</text>',
        f'<text x="{PAD - 6}" y="{HEIGHT - PAD}" text-anchor="end" font-size="11">$0</text>',
    ]
    every = max(1, len(periods) // 10)
    for i, period in enumerate(periods):
        x = PAD + i * slot + (slot - bar_w) / 2
        y = float(HEIGHT - PAD)
        label = bucket_label(period, bucket)
        for j, tenant in enumerate(tenants):
            value = cost.get((period, tenant), 0.0)
            if value <= 0:
                continue
            h = inner_h * value / top
            y -= h
            parts.append(
                f'<rect class="bar" data-tenant="{escape(tenant)}" data-period="{label}" x="{x:.1f}" '
                f'y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" fill="{PALETTE[j % len(PALETTE)]}">'
                f"<title>{escape(tenant)} {label}: ${value:,.2f}</title></rect>"
            )
        if i % every == 0:
            short = label[5:] if bucket is Bucket.DAY else label
            parts.append(
                f'<text class="tick" x="{x + bar_w / 2:.1f}" y="{HEIGHT - PAD + 14}" text-anchor="middle" '
                f'font-size="10">{short}</text>'
            )
    for j, tenant in enumerate(tenants):
        lx = PAD + (j % per_row) * 110
        ly = HEIGHT - 18 + 16 * (j // per_row)
        parts.append(
            f'<rect class="legend" data-tenant="{escape(tenant)}" x="{lx}" y="{ly}" width="10" height="10" '
            f'fill="{PALETTE[j % len(PALETTE)]}"/><text x="{lx + 14}" y="{ly + 9}" font-size="11">'
            f"{escape(tenant)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def type_chart(report: Report) -> str:
    """Horizontal bars of GPU-hours per GPU type (SVG), for the HTML report and the console."""
    types = list(report.gpu_hours_by_type)
    top = max((h for _, h in types), default=0.0) or 1.0
    row_h = 26
    height = PAD + row_h * max(1, len(types))
    parts = [
        f'<svg id="gpu-hours-by-type" class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="GPU-hours by GPU type">'
    ]
    for i, (gpu_type, hours) in enumerate(types):
        y = 10 + i * row_h
        w = (WIDTH - 2 * PAD - 120) * hours / top
        parts.append(
            f'<text x="{PAD + 50}" y="{y + 15}" text-anchor="end" font-size="12">{escape(gpu_type)}</text>'
            f'<rect class="bar" data-gpu-type="{escape(gpu_type)}" x="{PAD + 56}" y="{y}" width="{w:.1f}" '
            f'height="{row_h - 8}" fill="{PALETTE[i % len(PALETTE)]}"><title>{escape(gpu_type)}: '
            f"{_scale(hours)} GPU-hours</title></rect>"
            f'<text x="{PAD + 62 + w:.1f}" y="{y + 15}" font-size="11">{_scale(hours)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _scale(value: float) -> str:
    """A chart label: whole numbers from 10 up, two decimals below, so that a month of small test
    jobs (a few cents, a few GPU-minutes) does not read "$0" at both ends of the axis."""
    return f"{value:,.0f}" if value >= 10 else f"{value:,.2f}"


def _table(heads: list[str], rows: list[list[str]], css: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in heads)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _money(usd: float) -> str:
    return f"${usd:,.2f}"


def _tenant_rows(report: Report) -> list[list[str]]:
    return [
        [
            t.tenant,
            f"{t.gpu_hours:,.2f}",
            _money(t.cost_usd),
            "-" if t.quota_share is None else f"{100 * t.quota_share:.1f}%",
            f"{t.month_gpu_hours:,.1f}",
            "-" if t.monthly_budget_gpu_hours is None else f"{t.monthly_budget_gpu_hours:,.1f}",
            "-" if t.budget_spent_share is None else f"{100 * t.budget_spent_share:.1f}%",
            "-" if t.budget_left_gpu_hours is None else f"{t.budget_left_gpu_hours:,.1f}",
            f"{t.forecast_month_gpu_hours:,.1f}",
            _money(t.forecast_month_cost_usd),
        ]
        for t in report.tenants
    ]


def _idle_section(report: Report) -> str:
    if not report.idle:
        return ""
    pools = [
        [
            p.cluster,
            p.pool,
            p.gpu_type,
            p.kind.value,
            f"{p.provisioned_gpu_hours:,.1f}",
            f"{p.used_gpu_hours:,.1f}",
            f"{p.idle_gpu_hours:,.1f}",
            _money(p.idle_cost_usd),
        ]
        for p in report.idle
    ]
    clusters = [
        [
            c.cluster,
            f"{c.provisioned_gpu_hours:,.1f}",
            f"{c.used_gpu_hours:,.1f}",
            f"{c.idle_gpu_hours:,.1f}",
            _money(c.idle_cost_usd),
        ]
        for c in idle_by_cluster(report.idle)
    ]
    hours = ["provisioned GPU-h", "used GPU-h", "idle GPU-h", "idle cost"]
    return (
        "<h2>Idle provisioned capacity</h2>"
        + _table(["cluster", "pool", "GPU type", "kind", *hours], pools, "idle-pools")
        + _table(["cluster", *hours], clusters, "idle-clusters")
    )


def render_html(report: Report, *, title: str = "GPU usage and cost") -> str:
    data = report_dict(report)
    q = report.query
    heads = list(data["rows"][0].keys()) if data["rows"] else [d.value for d in q.group_by]
    rows = [[f"{v:,.2f}" if isinstance(v, float) else str(v) for v in row.values()] for row in data["rows"]]
    bucket = chart_bucket(math.ceil((q.until_s - q.start_s) / 86400.0))
    style = (
        "body{font-family:sans-serif;margin:24px;color:#222}"
        "table{border-collapse:collapse;margin:8px 0 24px;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child"
        "{text-align:left}th{background:#f3f3f3}.chart{display:block;margin:8px 0 24px}"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{style}</style></head><body>"
        f"<h1>{escape(title)}</h1>"
        f"<p>{iso_utc(q.start_s)} to {iso_utc(q.until_s)} (UTC). "
        f'Total <strong id="total-gpu-hours">{report.total_gpu_hours:,.2f}</strong> GPU-hours, '
        f'<strong id="total-cost">{_money(report.total_cost_usd)}</strong>, at the price in force when '
        "each attempt started.</p>"
        f"<h2>Cost per {bucket.value} by tenant</h2>"
        + cost_chart(report, bucket)
        + "<h2>GPU-hours by GPU type</h2>"
        + type_chart(report)
        + "<h2>Tenants: quota, budget and forecast</h2>"
        + _table(
            [
                "tenant",
                "GPU-hours",
                "cost",
                "quota used",
                "month GPU-h",
                "monthly budget",
                "budget used",
                "left",
                "forecast GPU-h",
                "forecast cost",
            ],
            _tenant_rows(report),
            "tenants",
        )
        + f'<p id="forecast-basis">Budget and forecast: calendar month {data["month"]}; the forecast '
        f"runs to the month's end {FORECAST_WORDS[q.forecast]}.</p>"
        + _idle_section(report)
        + "<h2>Usage</h2>"
        + _table(heads, rows, "usage")
        + "</body></html>\n"
    )
