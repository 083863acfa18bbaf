"""The savings report (`savings.py`) as an aligned table, CSV, JSON and a self-contained HTML page.

Columns, in this order after the grouping's (and `period`, with buckets): `attempts`,
`attempts_no_offer`, `gpu_hours`, `paid_usd`, `burst_usd`, `saved_usd`, `saved_share`,
`extra_wait_hours`, `private_usd` (docs/finance.md, "Savings"). CSV money is an exact decimal
string with six places; JSON's is a number (micro-dollars / 1,000,000, as the usage report's).
"""

from __future__ import annotations

import csv
import io
import json
from html import escape
from typing import Any

from federation.ledger.report.query import bucket_label, iso_utc
from federation.ledger.report.savings import SavingsReport, SavingsRow, dollars
from federation.store.money import format_usd, usd

FIGURES = (
    "attempts",
    "attempts_no_offer",
    "gpu_hours",
    "paid_usd",
    "burst_usd",
    "saved_usd",
    "saved_share",
    "extra_wait_hours",
    "private_usd",
)
# How a group with no value reads: a job submitted alone has no set, a job not in a sweep no sweep.
NONE_LABEL = "-"


def headers(report: SavingsReport) -> list[str]:
    q = report.query
    return [d.value for d in q.group_by] + (["period"] if q.bucket is not None else []) + list(FIGURES)


def _label(report: SavingsReport, row: SavingsRow) -> list[str]:
    keys = [k or NONE_LABEL for k in row.keys]
    q = report.query
    if q.bucket is not None:
        keys.append("" if row.bucket_start_s is None else bucket_label(row.bucket_start_s, q.bucket))
    return keys


def _figures(row: SavingsRow) -> dict[str, Any]:
    return {
        "attempts": row.attempts,
        "attempts_no_offer": row.attempts_no_offer,
        "gpu_hours": row.gpu_hours,
        "paid_usd": usd(row.paid_micro),
        "burst_usd": usd(row.burst_micro),
        "saved_usd": usd(row.saved_micro),
        "saved_share": row.saved_share,
        "extra_wait_hours": row.extra_wait_hours,
        "private_usd": usd(row.private_micro),
    }


def _text_figures(row: SavingsRow, *, places: int) -> list[str]:
    share = row.saved_share
    return [
        str(row.attempts),
        str(row.attempts_no_offer),
        f"{row.gpu_hours:.6f}" if places == 6 else f"{row.gpu_hours:,.2f}",
        format_usd(row.paid_micro, places=places),
        format_usd(row.burst_micro, places=places),
        format_usd(row.saved_micro, places=places),
        "" if share is None else (f"{share:.6f}" if places == 6 else f"{100 * share:.1f}%"),
        f"{row.extra_wait_hours:.6f}" if places == 6 else f"{row.extra_wait_hours:,.2f}",
        format_usd(row.private_micro, places=places),
    ]


def render_savings_csv(report: SavingsReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(headers(report))
    for row in report.rows:
        writer.writerow(_label(report, row) + _text_figures(row, places=6))
    return out.getvalue()


def savings_dict(report: SavingsReport) -> dict[str, Any]:
    q = report.query
    heads = headers(report)
    return {
        "report": "savings",
        "start": iso_utc(q.start_s),
        "until": iso_utc(q.until_s),
        "group_by": [d.value for d in q.group_by],
        "bucket": None if q.bucket is None else q.bucket.value,
        "rows": [
            dict(zip(heads, [*_label(report, r), *_figures(r).values()], strict=True)) for r in report.rows
        ],
        "total": _figures(report.total),
    }


def render_savings_json(report: SavingsReport) -> str:
    return json.dumps(savings_dict(report), sort_keys=True, indent=2) + "\n"


def render_savings_table(report: SavingsReport) -> str:
    q = report.query
    heads = headers(report)
    dims = len(heads) - len(FIGURES)
    cells = [heads] + [_label(report, r) + _text_figures(r, places=2) for r in report.rows]
    cells.append(["total"] + [""] * (dims - 1) + _text_figures(report.total, places=2))
    widths = [max(len(r[i]) for r in cells) for i in range(len(heads))]
    lines = [
        f"Savings against bursting at once, {iso_utc(q.start_s)} to {iso_utc(q.until_s)} (UTC)",
        "",
    ]
    for r in cells:
        lines.append(
            "  ".join(
                c.ljust(w) if i < dims else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ).rstrip()
        )
    return "\n".join(lines) + "\n"


def savings_table_html(report: SavingsReport) -> str:
    """The rows as an HTML table (`table.savings`, each row's cells carrying `data-column`): the
    HTML report's body, and the console's finance page's section."""
    heads = headers(report)
    head = "".join(f"<th>{escape(h)}</th>" for h in heads)
    body = []
    for r in [*report.rows, report.total]:
        label = (
            _label(report, r) if r is not report.total else ["total"] + [""] * (len(heads) - len(FIGURES) - 1)
        )
        cells = label + _text_figures(r, places=2)
        css = ' class="total"' if r is report.total else ""
        body.append(
            f"<tr{css}>"
            + "".join(
                f'<td data-column="{escape(h)}">{escape(c)}</td>' for h, c in zip(heads, cells, strict=True)
            )
            + "</tr>"
        )
    return f'<table class="savings"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def render_savings_html(report: SavingsReport, *, title: str = "What waiting saved") -> str:
    q = report.query
    t = report.total
    style = (
        "body{font-family:sans-serif;margin:24px;color:#222}"
        "table{border-collapse:collapse;margin:8px 0 24px;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child"
        "{text-align:left}th{background:#f3f3f3}tr.total td{font-weight:bold}"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{style}</style></head><body>"
        f"<h1>{escape(title)}</h1>"
        f"<p>{iso_utc(q.start_s)} to {iso_utc(q.until_s)} (UTC). Cloud cost paid "
        f'<strong id="paid">{dollars(t.paid_micro)}</strong>; bursting every attempt at '
        f'once would have cost <strong id="burst">{dollars(t.burst_micro)}</strong>: '
        f'saved <strong id="saved">{dollars(t.saved_micro)}</strong> for '
        f'<strong id="extra-wait">{t.extra_wait_hours:,.2f}</strong> hours of extra queueing over '
        f"{t.attempts} attempts ({t.attempts_no_offer} with nothing to burst to).</p>"
        "<p>Each attempt's run (its GPU-hours in the ledger) priced at the cheapest public offer the "
        "placer saw when it first considered the attempt; private GPUs at their internal rate are "
        "shown apart and are not cloud spend.</p>" + savings_table_html(report) + "</body></html>\n"
    )
