"""Finance reports from the usage ledger: pure computation and rendering, no I/O.

`compute_report(intervals, tenants, query)` groups GPU-hours and cost; `render_table`, `render_csv`,
`render_json` and `render_html` present a report; `focus_rows` and `render_focus_csv|json` export
FOCUS-style rows; `idle_cost` sets provisioned node-pool time against the ledger.
`federation.api.reports` serves them over gRPC. Importing this package needs neither grpc nor etcd.
"""

from federation.ledger.report.compute import Report, Row, TenantSummary, compute_report
from federation.ledger.report.focus import COLUMNS as FOCUS_COLUMNS
from federation.ledger.report.focus import focus_rows, render_focus_csv, render_focus_json
from federation.ledger.report.html import render_html
from federation.ledger.report.idle import (
    ClusterIdleCost,
    IdleCost,
    ProvisionedInterval,
    idle_by_cluster,
    idle_cost,
)
from federation.ledger.report.query import Bucket, Dim, ForecastBasis, ReportQuery, utc_s
from federation.ledger.report.render import render_csv, render_json, render_table, report_dict

__all__ = [
    "FOCUS_COLUMNS",
    "Bucket",
    "ClusterIdleCost",
    "Dim",
    "ForecastBasis",
    "IdleCost",
    "ProvisionedInterval",
    "Report",
    "ReportQuery",
    "Row",
    "TenantSummary",
    "compute_report",
    "focus_rows",
    "idle_by_cluster",
    "idle_cost",
    "render_csv",
    "render_focus_csv",
    "render_focus_json",
    "render_html",
    "render_json",
    "render_table",
    "report_dict",
    "utc_s",
]
