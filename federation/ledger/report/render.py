"""A report as text: an aligned table, CSV, or JSON with stable keys.

Numbers are rounded for people in the table and kept at full precision in CSV and JSON, which
programs read.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from federation.ledger.report.compute import Report
from federation.ledger.report.idle import idle_by_cluster
from federation.ledger.report.query import SET_DIMS, ForecastBasis, bucket_label, iso_utc, month_start_s


def _headers(report: Report) -> list[str]:
    heads = [d.value for d in report.query.group_by]
    if report.query.bucket is not None:
        heads.append(report.query.bucket.value)
    return [*heads, "gpu_hours", "cost_usd", "intervals"]


# How a job submitted alone reads by set, and a job that is no sweep's trial by sweep (as in the
# savings report): set names are DNS labels, so "-" is never one.
NO_SET = "-"


def _cells(report: Report) -> list[list[Any]]:
    bucket = report.query.bucket
    sets = [d in SET_DIMS for d in report.query.group_by]
    out = []
    for row in report.rows:
        cells: list[Any] = list(row.key)
        if any(sets):
            cells = [k or NO_SET if s else k for k, s in zip(cells, sets, strict=True)]
        if bucket is not None and row.bucket_start_s is not None:
            cells.append(bucket_label(row.bucket_start_s, bucket))
        out.append([*cells, row.gpu_hours, row.cost_usd, row.intervals])
    return out


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _aligned(rows: list[list[str]], *, text_columns: int) -> list[str]:
    """Columns padded to their widest cell: the first `text_columns` left, numbers right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.ljust(w) if i < text_columns else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]


FORECAST_WORDS = {
    ForecastBasis.MONTH_TO_DATE: "at the month-to-date rate",
    ForecastBasis.LAST_7_DAYS: "at the rate of the last 7 days",
}


def render_table(report: Report) -> str:
    q = report.query
    lines = [f"GPU usage {iso_utc(q.start_s)} to {iso_utc(q.until_s)} (UTC)", ""]
    heads = _headers(report)
    rows = [[h.upper().replace("_", " ") for h in heads]]
    for cells in _cells(report):
        rows.append([*(str(c) for c in cells[:-3]), f"{cells[-3]:.3f}", f"{cells[-2]:.3f}", str(cells[-1])])
    blank = [""] * (len(heads) - 4)
    rows.append(["TOTAL", *blank, f"{report.total_gpu_hours:.3f}", f"{report.total_cost_usd:.3f}", ""])
    lines += _aligned(rows, text_columns=len(heads) - 3)
    lines.append("")
    summary = [
        [
            "TENANT",
            "GPU-H",
            "COST USD",
            "QUOTA USED",
            "MONTH GPU-H",
            "BUDGET GPU-H",
            "BUDGET USED",
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
                "-" if t.budget_spent_share is None else f"{100 * t.budget_spent_share:.1f}%",
                _opt(t.budget_left_gpu_hours, ".1f"),
                f"{t.forecast_month_gpu_hours:.1f}",
                f"{t.forecast_month_cost_usd:.2f}",
            ]
        )
    lines += _aligned(summary, text_columns=1)
    month = iso_utc(month_start_s(q.now_s))[:7]
    lines += [
        "",
        f"Budget and forecast: calendar month {month}, forecast to its end {FORECAST_WORDS[q.forecast]}.",
    ]
    if report.idle:
        lines += ["", "Idle provisioned capacity:"]
        idle = [
            [
                "CLUSTER",
                "POOL",
                "GPU TYPE",
                "KIND",
                "PROVISIONED GPU-H",
                "USED GPU-H",
                "IDLE GPU-H",
                "IDLE USD",
            ]
        ]
        for p in report.idle:
            idle.append(
                [
                    p.cluster,
                    p.pool,
                    p.gpu_type,
                    p.kind.value,
                    f"{p.provisioned_gpu_hours:.3f}",
                    f"{p.used_gpu_hours:.3f}",
                    f"{p.idle_gpu_hours:.3f}",
                    f"{p.idle_cost_usd:.2f}",
                ]
            )
        for c in idle_by_cluster(report.idle):
            idle.append(
                [
                    c.cluster,
                    "(all)",
                    "",
                    "",
                    f"{c.provisioned_gpu_hours:.3f}",
                    f"{c.used_gpu_hours:.3f}",
                    f"{c.idle_gpu_hours:.3f}",
                    f"{c.idle_cost_usd:.2f}",
                ]
            )
        lines += _aligned(idle, text_columns=4)
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
                "budget_spent_share": t.budget_spent_share,
                "forecast_basis": t.forecast_basis.value,
            }
            for t in report.tenants
        ],
        "month": iso_utc(month_start_s(q.now_s))[:7],
        "forecast_basis": q.forecast.value,
        "gpu_hours_by_type": dict(report.gpu_hours_by_type),
        "idle": [
            {
                "cluster": p.cluster,
                "pool": p.pool,
                "gpu_type": p.gpu_type,
                "kind": p.kind.value,
                "provisioned_gpu_hours": p.provisioned_gpu_hours,
                "provisioned_cost_usd": p.provisioned_cost_usd,
                "used_gpu_hours": p.used_gpu_hours,
                "idle_gpu_hours": p.idle_gpu_hours,
                "idle_cost_usd": p.idle_cost_usd,
            }
            for p in report.idle
        ],
        "idle_by_cluster": [
            {
                "cluster": c.cluster,
                "provisioned_gpu_hours": c.provisioned_gpu_hours,
                "provisioned_cost_usd": c.provisioned_cost_usd,
                "used_gpu_hours": c.used_gpu_hours,
                "idle_gpu_hours": c.idle_gpu_hours,
                "idle_cost_usd": c.idle_cost_usd,
            }
            for c in idle_by_cluster(report.idle)
        ],
    }


def render_json(report: Report) -> str:
    return json.dumps(report_dict(report), indent=2, sort_keys=True) + "\n"
