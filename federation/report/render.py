"""A report as text: an aligned table, CSV, or JSON with stable keys.

Numbers are rounded for people in the table and kept at full precision in CSV and JSON, which
programs read.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from federation.report.compute import Report
from federation.report.query import bucket_label, iso_utc


def _headers(report: Report) -> list[str]:
    heads = [d.value for d in report.query.group_by]
    if report.query.bucket is not None:
        heads.append(report.query.bucket.value)
    return [*heads, "gpu_hours", "cost_usd", "intervals"]


def _cells(report: Report) -> list[list[Any]]:
    bucket = report.query.bucket
    out = []
    for row in report.rows:
        cells: list[Any] = list(row.key)
        if bucket is not None and row.bucket_start_s is not None:
            cells.append(bucket_label(row.bucket_start_s, bucket))
        out.append([*cells, row.gpu_hours, row.cost_usd, row.intervals])
    return out


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render_table(report: Report) -> str:
    q = report.query
    lines = [f"GPU usage {iso_utc(q.start_s)} to {iso_utc(min(q.end_s, max(q.now_s, q.start_s)))} (UTC)", ""]
    rows = [[h.upper().replace("_", " ") for h in _headers(report)]]
    for cells in _cells(report):
        rows.append([*(str(c) for c in cells[:-3]), f"{cells[-3]:.3f}", f"{cells[-2]:.3f}", str(cells[-1])])
    rows.append(
        [
            "TOTAL",
            *[""] * (len(rows[0]) - 4),
            f"{report.total_gpu_hours:.3f}",
            f"{report.total_cost_usd:.3f}",
            "",
        ]
    )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    numeric = {len(widths) - 3, len(widths) - 2, len(widths) - 1}
    for r in rows:
        lines.append(
            "  ".join(
                c.rjust(w) if i in numeric else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ).rstrip()
        )
    lines.append("")
    summary = [
        [
            "TENANT",
            "GPU-H",
            "COST USD",
            "QUOTA USED",
            "MONTH GPU-H",
            "BUDGET GPU-H",
            "LEFT",
            "FORECAST GPU-H",
            "FORECAST USD",
        ]
    ]
    for t in report.tenants:
        summary.append(
            [
                t.tenant,
                f"{t.gpu_hours:.3f}",
                f"{t.cost_usd:.3f}",
                "-" if t.quota_share is None else f"{100 * t.quota_share:.1f}%",
                f"{t.month_gpu_hours:.3f}",
                _opt(t.monthly_budget_gpu_hours, ".1f"),
                _opt(t.budget_left_gpu_hours, ".1f"),
                f"{t.forecast_month_gpu_hours:.1f}",
                f"{t.forecast_month_cost_usd:.2f}",
            ]
        )
    widths = [max(len(r[i]) for r in summary) for i in range(len(summary[0]))]
    for r in summary:
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    return "\n".join(lines) + "\n"


def render_csv(report: Report) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_headers(report))
    writer.writerows(_cells(report))
    return out.getvalue()


def report_dict(report: Report) -> dict[str, Any]:
    q = report.query
    heads = _headers(report)
    return {
        "period": {"start": iso_utc(q.start_s), "end": iso_utc(q.end_s), "now": iso_utc(q.now_s)},
        "group_by": [d.value for d in q.group_by],
        "bucket": None if q.bucket is None else q.bucket.value,
        "rows": [dict(zip(heads, cells, strict=True)) for cells in _cells(report)],
        "total": {"gpu_hours": report.total_gpu_hours, "cost_usd": report.total_cost_usd},
        "tenants": [
            {
                "tenant": t.tenant,
                "gpu_hours": t.gpu_hours,
                "cost_usd": t.cost_usd,
                "quota_share": t.quota_share,
                "monthly_budget_gpu_hours": t.monthly_budget_gpu_hours,
                "month_gpu_hours": t.month_gpu_hours,
                "month_cost_usd": t.month_cost_usd,
                "budget_left_gpu_hours": t.budget_left_gpu_hours,
                "forecast_month_gpu_hours": t.forecast_month_gpu_hours,
                "forecast_month_cost_usd": t.forecast_month_cost_usd,
            }
            for t in report.tenants
        ],
        "gpu_hours_by_type": dict(report.gpu_hours_by_type),
    }


def render_json(report: Report) -> str:
    return json.dumps(report_dict(report), indent=2, sort_keys=True) + "\n"
