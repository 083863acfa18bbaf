"""Finance reports from the usage ledger: pure computation and rendering, no I/O.

`compute_report(intervals, tenants, query)` groups GPU-hours and cost; `render_table`, `render_csv`,
`render_json` and `render_html` present a report; `focus_rows` and `render_focus_csv|json` export
FOCUS-style rows. `federation.api.reports` serves them over gRPC.
"""

from federation.report.compute import Report, Row, TenantSummary, compute_report
from federation.report.focus import focus_rows, render_focus_csv, render_focus_json
from federation.report.html import render_html
from federation.report.query import Bucket, Dim, ReportQuery
from federation.report.render import render_csv, render_json, render_table, report_dict

__all__ = [
    "Bucket",
    "Dim",
    "Report",
    "ReportQuery",
    "Row",
    "TenantSummary",
    "compute_report",
    "focus_rows",
    "render_csv",
    "render_focus_csv",
    "render_focus_json",
    "render_html",
    "render_json",
    "render_table",
    "report_dict",
]
