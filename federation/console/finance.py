"""`/finance?period=`: GPU-hours and cost per tenant and period, budget burn with its forecast, idle
cost, usage by job set and what waiting for private GPUs saved (issues 34, 35), and
`/finance.csv?period=&by=` (tenant by day, set, sweep) and `/finance-savings.csv?period=&by=` to
download the same figures.

One call as the signed-in user: ReportService.GetReport, grouped by tenant in daily buckets, as JSON
(`gpufed report --by tenant --bucket day -o json`). The server computes it with the offline report's
code (`federation.ledger.report`) and its rules: finance reads every tenant, a member only its own
(and no idle cost, which would tell what others used), nobody else, so admins and infra get the
console's not-found page here as `gpufed report` refuses them. The page draws the offline HTML
report's charts from the same series (`federation.ledger.report.html`): cost per day (or week, or
month) stacked by tenant, and GPU-hours by GPU type. Two more calls of the same rule give the
savings report (`gpufed report savings -o json`) by tenant and GPU type, and by job set; one more the
usage report by tenant and job set (`gpufed report --by set -o json`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from federation.api import convert
from federation.api.v1 import gpufed_pb2 as pb
from federation.console.calls import CALLS_KEY
from federation.console.charts import Marker, Segment, legend, stacked_bar, table
from federation.console.layout import SECURITY_HEADERS, e, error_page, html_response, render_page
from federation.console.view import VIEW_KEY, View
from federation.ledger.report import Report, ReportQuery, TenantSummary, utc_s
from federation.ledger.report.html import chart_bucket, cost_chart, type_chart
from federation.ledger.report.idle import IdleCost, idle_by_cluster
from federation.ledger.report.query import ForecastBasis, month_start_s, next_month_s
from placement.model import CapacityKind, TenantId

DAY_S = 86400.0
PERIODS: dict[str, str] = {
    "month": "This month",
    "last-month": "Last month",
    "week": "This week",
    "last-week": "Last week",
    "7d": "Last 7 days",
    "30d": "Last 30 days",
}
DEFAULT_PERIOD = "month"


class BadPeriod(ValueError):
    pass


def period_bounds(period: str, now_s: float) -> tuple[float, float, str]:
    """[start, end) and words for a period name (`month`, `last-week`, ..., or a month `2026-10`)."""
    day0 = now_s - now_s % DAY_S
    monday = day0 - datetime.fromtimestamp(day0, UTC).weekday() * DAY_S
    if period == "month":
        return month_start_s(now_s), next_month_s(now_s), PERIODS[period]
    if period == "last-month":
        this = month_start_s(now_s)
        return month_start_s(this - 1.0), this, PERIODS[period]
    if period == "week":
        return monday, monday + 7 * DAY_S, PERIODS[period]
    if period == "last-week":
        return monday - 7 * DAY_S, monday, PERIODS[period]
    if period in ("7d", "30d"):
        days = int(period[:-1])
        return now_s - days * DAY_S, now_s, PERIODS[period]
    try:
        first = datetime.strptime(period, "%Y-%m").replace(tzinfo=UTC)
    except ValueError:
        raise BadPeriod(
            f"period: {period[:40]!r} is not one of {', '.join(PERIODS)} or a month (YYYY-MM)"
        ) from None
    start = first.timestamp()
    if start > now_s:
        raise BadPeriod(f"period: {period} has not begun")
    return start, next_month_s(start), first.strftime("%B %Y")


def report_request(
    start_s: float, end_s: float, fmt: str, group_by: Sequence[str] = ("tenant",), bucket: str = "day"
) -> pb.GetReportRequest:
    return pb.GetReportRequest(
        start=convert.timestamp(start_s),
        end=convert.timestamp(end_s),
        group_by=list(group_by),
        bucket=bucket,
        format=fmt,
    )


# `/finance.csv?by=`: the usage report by tenant and day (the default), or over the period by job set
# or by sweep (issue 34; the server adds the tenant: a set's name is its tenant's own).
USAGE_GROUPINGS: dict[str, tuple[tuple[str, ...], str]] = {
    "tenant": (("tenant",), "day"),
    "set": (("set",), ""),
    "sweep": (("sweep",), ""),
}


SAVINGS_GROUPINGS = ("tenant,gpu_type", "set", "sweep", "tenant,set")


def savings_request(start_s: float, end_s: float, fmt: str, group_by: Sequence[str]) -> pb.GetReportRequest:
    return pb.GetReportRequest(
        start=convert.timestamp(start_s),
        end=convert.timestamp(end_s),
        group_by=list(group_by),
        format=fmt,
        report="savings",
    )


@dataclass(frozen=True, slots=True)
class SavingsView:
    """The savings report's JSON (`federation.ledger.report.savings_render.savings_dict`), by tenant
    and GPU type and by job set, as the page shows them."""

    by_type: dict[str, Any]
    by_set: dict[str, Any]


@dataclass(frozen=True, slots=True)
class FinanceView:
    report: Report
    period: str
    words: str
    month: str
    # Rows of the report: (tenant, day label, GPU-hours, cost).
    daily: tuple[tuple[str, str, float, float], ...]


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)


def report_from_json(
    text: str, *, start_s: float, end_s: float, now_s: float, period: str, words: str
) -> FinanceView:
    """The API's JSON report back as a `Report`, for the offline report's chart code."""
    data: dict[str, Any] = json.loads(text)
    basis = ForecastBasis(data.get("forecast_basis", ForecastBasis.MONTH_TO_DATE.value))
    daily = tuple(
        (str(r["tenant"]), str(r["day"]), float(r["gpu_hours"]), float(r["cost_usd"])) for r in data["rows"]
    )
    tenants = tuple(
        TenantSummary(
            tenant=TenantId(str(t["tenant"])),
            gpu_hours=float(t["gpu_hours"]),
            cost_usd=float(t["cost_usd"]),
            quota_share=_opt(t.get("quota_share")),
            monthly_budget_gpu_hours=_opt(t.get("monthly_budget_gpu_hours")),
            month_gpu_hours=float(t["month_gpu_hours"]),
            month_cost_usd=float(t["month_cost_usd"]),
            forecast_month_gpu_hours=float(t["forecast_month_gpu_hours"]),
            forecast_month_cost_usd=float(t["forecast_month_cost_usd"]),
            forecast_basis=ForecastBasis(t.get("forecast_basis", basis.value)),
        )
        for t in data["tenants"]
    )
    idle = tuple(
        IdleCost(
            cluster=str(p["cluster"]),
            pool=str(p["pool"]),
            gpu_type=str(p["gpu_type"]),
            provisioned_gpu_hours=float(p["provisioned_gpu_hours"]),
            used_gpu_hours=float(p["used_gpu_hours"]),
            idle_gpu_hours=float(p["idle_gpu_hours"]),
            idle_cost_usd=float(p["idle_cost_usd"]),
            kind=CapacityKind(p["kind"]),
            provisioned_cost_usd=float(p.get("provisioned_cost_usd", 0.0)),
        )
        for p in data.get("idle", [])
    )
    report = Report(
        query=ReportQuery(start_s=start_s, end_s=end_s, now_s=now_s, forecast=basis),
        rows=(),
        total_gpu_hours=float(data["total"]["gpu_hours"]),
        total_cost_usd=float(data["total"]["cost_usd"]),
        tenants=tenants,
        daily_cost_by_tenant=tuple((utc_s(day), tenant, cost) for tenant, day, _, cost in daily if cost > 0),
        gpu_hours_by_type=tuple(
            (str(k), float(v)) for k, v in sorted(data.get("gpu_hours_by_type", {}).items()) if v > 0
        ),
        idle=idle,
    )
    return FinanceView(
        report=report, period=period, words=words, month=str(data.get("month", "")), daily=daily
    )


# ---- rendering


def _money(usd: float) -> str:
    return f"${usd:,.2f}"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def _burn_bar(t: TenantSummary) -> str:
    budget = t.monthly_budget_gpu_hours
    used = t.month_gpu_hours
    forecast = t.forecast_month_gpu_hours
    over = budget is not None and forecast > budget
    scale = max(budget or 0.0, forecast, used, 1e-9)
    markers = [Marker("mark-cap", budget, f"budget {budget:,.1f} GPU-h")] if budget else []
    words = f"{t.tenant}: {used:,.1f} GPU-hours this month, forecast {forecast:,.1f}" + (
        f", budget {budget:,.1f}" if budget is not None else ", no budget"
    )
    return stacked_bar(
        [
            Segment("seg-spent", used, f"{used:,.1f} GPU-h spent this month"),
            Segment(
                "seg-forecast-over" if over else "seg-forecast",
                max(0.0, forecast - used),
                f"{forecast:,.1f} GPU-h forecast for the month",
            ),
        ],
        scale=scale,
        label=words,
        markers=markers,
        track=budget,
        width=260,
    )


def _tenant_rows(report: Report) -> str:
    rows = []
    for t in report.tenants:
        budget = t.monthly_budget_gpu_hours
        over = budget is not None and t.forecast_month_gpu_hours > budget
        css = ' class="over-budget"' if over else ""
        rows.append(
            f'<tr data-tenant="{e(t.tenant)}"{css}>'
            f'<th scope="row">{e(t.tenant)}</th>'
            f'<td class="num gpu-hours">{t.gpu_hours:,.2f}</td>'
            f'<td class="num cost">{_money(t.cost_usd)}</td>'
            f'<td class="num quota-used">{_pct(t.quota_share)}</td>'
            f'<td class="num month">{t.month_gpu_hours:,.1f}</td>'
            f'<td class="num budget">{"-" if budget is None else f"{budget:,.1f}"}</td>'
            f'<td class="num burn">{_pct(t.budget_spent_share)}</td>'
            f'<td class="num forecast">{t.forecast_month_gpu_hours:,.1f}</td>'
            f'<td class="num forecast-cost">{_money(t.forecast_month_cost_usd)}</td>'
            f'<td class="chart">{_burn_bar(t)}</td></tr>'
        )
    return "<tbody>" + "".join(rows) + "</tbody>"


def _idle(report: Report, view: View) -> str:
    if not report.idle:
        if view.role == "finance":
            return '<p class="empty" id="no-idle">No idle provisioned capacity in this period.</p>'
        return (
            '<p class="note" id="no-idle">Idle cost is in reports over every tenant (the finance role): '
            "what a pool left idle says what the other tenants used.</p>"
        )
    pools = "".join(
        f'<tr data-cluster="{e(p.cluster)}" data-pool="{e(p.pool)}">'
        f'<th scope="row">{e(p.cluster)}/{e(p.pool)}</th>'
        f"<td>{e(p.gpu_type)}</td><td>{e(p.kind.value)}</td>"
        f'<td class="num">{p.provisioned_gpu_hours:,.1f}</td><td class="num">{p.used_gpu_hours:,.1f}</td>'
        f'<td class="num">{p.idle_gpu_hours:,.1f}</td>'
        f'<td class="num idle-cost">{_money(p.idle_cost_usd)}</td></tr>'
        for p in report.idle
    )
    clusters = "".join(
        f'<tr data-cluster="{e(c.cluster)}"><th scope="row">{e(c.cluster)}</th>'
        f'<td class="num">{c.provisioned_gpu_hours:,.1f}</td><td class="num">{c.used_gpu_hours:,.1f}</td>'
        f'<td class="num">{c.idle_gpu_hours:,.1f}</td><td class="num">{_money(c.idle_cost_usd)}</td></tr>'
        for c in idle_by_cluster(report.idle)
    )
    total = math.fsum(p.idle_cost_usd for p in report.idle)
    hours = ["Provisioned GPU-h", "Used GPU-h", "Idle GPU-h", "Idle cost"]
    return (
        f'<p>Idle cost in all: <strong id="idle-total">{_money(total)}</strong>.</p>'
        + "<h3>By pool</h3>"
        + table(
            table_id="idle-pools",
            heads=["Pool", "GPU type", "Kind", *hours],
            numeric=range(3, 7),
            body=f"<tbody>{pools}</tbody>",
        )
        + "<h3>By cluster</h3>"
        + table(
            table_id="idle-clusters",
            heads=["Cluster", *hours],
            numeric=range(1, 5),
            body=f"<tbody>{clusters}</tbody>",
        )
    )


def _saved_cell(row: dict[str, Any]) -> str:
    saved = float(row["saved_usd"])
    css = "num saved negative" if saved < 0 else "num saved"
    sign = "-" if saved < 0 else ""
    return f'<td class="{css}">{sign}{_money(abs(saved))}</td>'


def _savings_rows(rows: Sequence[dict[str, Any]], dims: Sequence[str]) -> str:
    out = []
    for r in rows:
        keys = "".join(
            (f'<th scope="row">{e(r[d])}</th>' if i == 0 else f"<td>{e(r[d])}</td>")
            for i, d in enumerate(dims)
        )
        attrs = " ".join(f'data-{e(d.replace("_", "-"))}="{e(r[d])}"' for d in dims)
        out.append(
            f"<tr {attrs}>{keys}"
            f'<td class="num attempts">{int(r["attempts"])}</td>'
            f'<td class="num no-offer">{int(r["attempts_no_offer"])}</td>'
            f'<td class="num gpu-hours">{float(r["gpu_hours"]):,.2f}</td>'
            f'<td class="num paid">{_money(float(r["paid_usd"]))}</td>'
            f'<td class="num burst">{_money(float(r["burst_usd"]))}</td>'
            + _saved_cell(r)
            + f'<td class="num saved-share">{_pct(r.get("saved_share"))}</td>'
            f'<td class="num extra-wait">{float(r["extra_wait_hours"]):,.2f}</td>'
            f'<td class="num private">{_money(float(r["private_usd"]))}</td></tr>'
        )
    return "<tbody>" + "".join(out) + "</tbody>"


_SAVINGS_HEADS = (
    "Attempts",
    "No offer",
    "GPU-hours",
    "Cloud paid",
    "Burst at once",
    "Saved",
    "Saved share",
    "Extra wait (h)",
    "Private (internal)",
)


def _savings(sv: SavingsView, period: str) -> str:
    total = sv.by_type["total"]
    saved = float(total["saved_usd"])
    csv = "/finance-savings.csv?" + urlencode({"period": period, "by": "tenant,gpu_type"})
    sets_csv = "/finance-savings.csv?" + urlencode({"period": period, "by": "set"})
    return (
        "<h2>What waiting saved</h2>"
        f'<p id="savings-summary">Cloud cost paid <strong id="savings-paid">'
        f"{_money(float(total['paid_usd']))}</strong>; bursting every attempt at once would have cost "
        f'<strong id="savings-burst">{_money(float(total["burst_usd"]))}</strong>: saved '
        f'<strong id="savings-saved">{"-" if saved < 0 else ""}{_money(abs(saved))}</strong> for '
        f'<strong id="savings-extra-wait">{float(total["extra_wait_hours"]):,.2f}</strong> hours of '
        f"extra queueing over {int(total['attempts'])} attempts "
        f"({int(total['attempts_no_offer'])} with nothing to burst to). Each attempt's GPU-hours are "
        "priced at the cheapest public offer the placer saw when it first considered it. "
        f'<a id="savings-csv" href="{e(csv)}" download>Download CSV</a></p>'
        + table(
            table_id="savings",
            heads=["Tenant", "GPU type", *_SAVINGS_HEADS],
            numeric=range(2, 11),
            body=_savings_rows(sv.by_type["rows"], ("tenant", "gpu_type")),
        )
        + "<h2>By job set</h2>"
        + '<p class="note">Jobs submitted alone are under "-". '
        f'<a id="sets-csv" href="{e(sets_csv)}" download>Download CSV</a></p>'
        + table(
            table_id="finance-sets",
            heads=["Tenant", "Job set", *_SAVINGS_HEADS],
            numeric=range(2, 11),
            # By set is by tenant and set: set names are per tenant.
            body=_savings_rows(sv.by_set["rows"], ("tenant", "set")),
        )
    )


def _usage_by_set(rows: Sequence[dict[str, Any]], period: str) -> str:
    """The usage report by tenant and job set: every set's GPU-hours and cost, as `gpufed report
    --by set` gives them (the same rows the savings table's cloud figures are a part of)."""
    csv = "/finance.csv?" + urlencode({"period": period, "by": "set"})
    body = "".join(
        f'<tr data-tenant="{e(r["tenant"])}" data-set="{e(r["set"])}">'
        f'<th scope="row">{e(r["tenant"])}</th><td>{e(r["set"])}</td>'
        f'<td class="num gpu-hours">{float(r["gpu_hours"]):,.2f}</td>'
        f'<td class="num cost">{_money(float(r["cost_usd"]))}</td>'
        f'<td class="num intervals">{int(r["intervals"])}</td></tr>'
        for r in rows
    )
    return (
        "<h2>Usage by job set</h2>"
        '<p class="note">GPU-hours and cost of every job set (an array, a sweep or a set of jobs) per '
        'tenant, its jobs\' ledger intervals summed; jobs submitted alone are under "-". '
        f'<a id="usage-sets-csv" href="{e(csv)}" download>Download CSV</a></p>'
        + table(
            table_id="usage-sets",
            heads=["Tenant", "Job set", "GPU-hours", "Cost", "Intervals"],
            numeric=range(2, 5),
            body=f"<tbody>{body}</tbody>",
        )
    )


def _period_form(current: str) -> str:
    options = "".join(
        f'<option value="{e(k)}"{" selected" if k == current else ""}>{e(words)}</option>'
        for k, words in PERIODS.items()
    )
    if current not in PERIODS:
        options += f'<option value="{e(current)}" selected>{e(current)}</option>'
    csv = "/finance.csv?" + urlencode({"period": current})
    return (
        '<form id="period" class="inline" method="get" action="/finance">'
        '<label for="period-select">Period'
        f'<select id="period-select" name="period">{options}</select></label>'
        '<button type="submit">Show</button>'
        f'<a id="finance-csv" href="{e(csv)}" download>Download CSV</a></form>'
    )


def _daily_table(daily: Sequence[tuple[str, str, float, float]]) -> str:
    rows = "".join(
        f'<tr><th scope="row">{e(day)}</th><td>{e(tenant)}</td><td class="num">{hours:,.2f}</td>'
        f'<td class="num">{_money(cost)}</td></tr>'
        for tenant, day, hours, cost in daily
    )
    return (
        "<details><summary>The chart's figures, per day and tenant</summary>"
        + table(
            table_id="daily",
            heads=["Day", "Tenant", "GPU-hours", "Cost"],
            numeric=(2, 3),
            body=f"<tbody>{rows}</tbody>",
        )
        + "</details>"
    )


def render_finance(
    fv: FinanceView,
    view: View,
    savings: SavingsView | None = None,
    by_set: Sequence[dict[str, Any]] | None = None,
) -> str:
    r = fv.report
    q = r.query
    bucket = chart_bucket(math.ceil((q.until_s - q.start_s) / DAY_S))
    since, until = datetime.fromtimestamp(q.start_s, UTC), datetime.fromtimestamp(q.until_s, UTC)
    basis = "the month-to-date rate" if q.forecast is ForecastBasis.MONTH_TO_DATE else "the last 7 days' rate"
    return (
        _period_form(fv.period) + f'<p id="finance-period">{e(fv.words)}: {e(since.strftime("%Y-%m-%d"))} '
        f"to {e(until.strftime('%Y-%m-%d %H:%M'))} UTC. "
        f'<strong id="total-gpu-hours">{r.total_gpu_hours:,.2f}</strong> GPU-hours, '
        f'<strong id="total-cost">{_money(r.total_cost_usd)}</strong>, at the price in force when each '
        "attempt started.</p>"
        + f"<h2>Cost per {e(bucket.value)} by tenant</h2>"
        + cost_chart(r, bucket)
        + _daily_table(fv.daily)
        + "<h2>GPU-hours by GPU type</h2>"
        + type_chart(r)
        + "<h2>Tenants: cost, quota and budget burn</h2>"
        + legend(
            [
                ("seg-spent", "spent this month"),
                ("seg-forecast", "forecast to the month's end"),
                ("seg-forecast-over", "forecast beyond the budget"),
                ("mark-cap", "budget"),
            ]
        )
        + table(
            table_id="finance-tenants",
            heads=[
                "Tenant",
                "GPU-hours",
                "Cost",
                "Quota used",
                "Month GPU-h",
                "Budget GPU-h",
                "Budget used",
                "Forecast GPU-h",
                "Forecast cost",
                "Budget burn",
            ],
            numeric=range(1, 9),
            body=_tenant_rows(r),
        )
        + '<p id="forecast-basis">Budgets and forecasts are for the calendar month '
        f"{e(fv.month)}; the forecast runs to the month's end at {basis}.</p>"
        + ("" if by_set is None else _usage_by_set(by_set, fv.period))
        + ("" if savings is None else _savings(savings, fv.period))
        + "<h2>Idle provisioned capacity</h2>"
        + _idle(r, view)
    )


# ---- handlers


def _period_of(request: web.Request, now_s: float) -> tuple[str, float, float, str]:
    period = request.query.get("period", "") or DEFAULT_PERIOD
    start, end, words = period_bounds(period, now_s)
    return period, start, min(end, max(now_s, start + 1.0)), words


async def finance_page(request: web.Request) -> web.Response:
    view: View = request[VIEW_KEY]
    try:
        period, start, end, words = _period_of(request, view.now_s)
    except BadPeriod as bad:
        return error_page(view, str(bad), 400)
    reply = await request.app[CALLS_KEY].call(request, "GetReport", report_request(start, end, "json"))
    fv = report_from_json(
        reply.content, start_s=start, end_s=end, now_s=view.now_s, period=period, words=words
    )
    calls = request.app[CALLS_KEY]
    by_type = await calls.call(
        request, "GetReport", savings_request(start, end, "json", ["tenant", "gpu_type"])
    )
    by_set = await calls.call(request, "GetReport", savings_request(start, end, "json", ["set"]))
    savings = SavingsView(by_type=json.loads(by_type.content), by_set=json.loads(by_set.content))
    usage_sets = await calls.call(request, "GetReport", report_request(start, end, "json", ("set",), ""))
    body = render_finance(fv, view, savings, json.loads(usage_sets.content)["rows"])
    return html_response(render_page(view, page="finance", title="Finance", body=body))


async def finance_csv(request: web.Request) -> web.Response:
    view: View = request[VIEW_KEY]
    try:
        _, start, end, _ = _period_of(request, view.now_s)
    except BadPeriod as bad:
        return error_page(view, str(bad), 400)
    by = request.query.get("by", "") or "tenant"
    if by not in USAGE_GROUPINGS:
        return error_page(view, f"by: {by[:40]!r} is not one of {', '.join(USAGE_GROUPINGS)}", 400)
    group_by, bucket = USAGE_GROUPINGS[by]
    reply = await request.app[CALLS_KEY].call(
        request, "GetReport", report_request(start, end, "csv", group_by, bucket)
    )
    first = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d")
    last = (datetime.fromtimestamp(end, UTC) - timedelta(seconds=1)).strftime("%Y-%m-%d")
    grouped = "" if by == "tenant" else f"by-{by}-"
    name = f"gpufed-usage-{grouped}{first}-{last}.csv"
    return web.Response(
        text=reply.content,
        content_type="text/csv",
        headers={**SECURITY_HEADERS, "Content-Disposition": f'attachment; filename="{name}"'},
    )


async def finance_savings_csv(request: web.Request) -> web.Response:
    view: View = request[VIEW_KEY]
    try:
        _, start, end, _ = _period_of(request, view.now_s)
    except BadPeriod as bad:
        return error_page(view, str(bad), 400)
    by = request.query.get("by", "") or SAVINGS_GROUPINGS[0]
    if by not in SAVINGS_GROUPINGS:
        return error_page(view, f"by: {by[:40]!r} is not one of {', '.join(SAVINGS_GROUPINGS)}", 400)
    reply = await request.app[CALLS_KEY].call(
        request, "GetReport", savings_request(start, end, "csv", by.split(","))
    )
    first = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d")
    last = (datetime.fromtimestamp(end, UTC) - timedelta(seconds=1)).strftime("%Y-%m-%d")
    name = f"gpufed-savings-by-{by.replace(',', '-')}-{first}-{last}.csv"
    return web.Response(
        text=reply.content,
        content_type="text/csv",
        headers={**SECURITY_HEADERS, "Content-Disposition": f'attachment; filename="{name}"'},
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/finance", finance_page)
    app.router.add_get("/finance.csv", finance_csv)
    app.router.add_get("/finance-savings.csv", finance_savings_csv)
