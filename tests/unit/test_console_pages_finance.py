"""The finance page from the API's JSON report, computed here by the report code itself (no server)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from federation.console.finance import BadPeriod, period_bounds, render_finance, report_from_json
from federation.console.view import View
from federation.ledger.report import (
    Bucket,
    Dim,
    ProvisionedInterval,
    ReportQuery,
    compute_report,
    render_json,
)
from federation.store.intervals import LedgerInterval
from federation.store.records import TenantRecord
from placement.model import CapacityKind, ClusterName, GpuType, JobId, TenantId

NOW = datetime(2026, 11, 20, 12, tzinfo=UTC).timestamp()
DAY = 86400.0
EVIL = '<b onclick="x">'


def interval(
    job: str, tenant: str, start: float, end: float | None, gpus: int = 8, usd: float = 2.0
) -> LedgerInterval:
    return LedgerInterval(
        job_id=JobId(job),
        attempt=1,
        tenant=TenantId(tenant),
        user="u",
        cluster=ClusterName("aws"),
        provider="aws",
        region="us-east-1",
        gpu_type=GpuType("H100"),
        gpu_count=gpus,
        kind=CapacityKind.ON_DEMAND,
        start_s=start,
        end_s=end,
        usd_per_gpu_hour=usd,
    )


INTERVALS = [
    interval("a", "vision", NOW - 3 * DAY, NOW - 3 * DAY + 3600),
    interval("b", "nlp", NOW - 2 * DAY, NOW - 2 * DAY + 7200, gpus=16, usd=1.0),
    interval("c", "vision", NOW - 3600, None),
]
TENANTS = [
    TenantRecord(name=TenantId("vision"), monthly_budget_gpu_hours=100.0),
    TenantRecord(name=TenantId("nlp")),
]
VIEW = View(user="fin", tenant="platform", role="finance", is_admin=False, csrf="c", now_s=NOW)


def api_json(
    tenants: frozenset[TenantId] | None = None, provisioned: tuple[ProvisionedInterval, ...] = ()
) -> str:
    """What GetReport answers for the page: by tenant, daily buckets, JSON."""
    start, end, _ = period_bounds("month", NOW)
    query = ReportQuery(
        start_s=start, end_s=end, now_s=NOW, group_by=(Dim.TENANT,), bucket=Bucket.DAY, tenants=tenants
    )
    return render_json(compute_report(INTERVALS, TENANTS, query, provisioned=provisioned))


def test_periods() -> None:
    start, end, words = period_bounds("month", NOW)
    assert (start, end, words) == (
        datetime(2026, 11, 1, tzinfo=UTC).timestamp(),
        datetime(2026, 12, 1, tzinfo=UTC).timestamp(),
        "This month",
    )
    assert period_bounds("last-month", NOW)[:2] == (
        datetime(2026, 10, 1, tzinfo=UTC).timestamp(),
        datetime(2026, 11, 1, tzinfo=UTC).timestamp(),
    )
    # 2026-11-20 is a Friday: the ISO week began on Monday the 16th.
    assert period_bounds("week", NOW)[0] == datetime(2026, 11, 16, tzinfo=UTC).timestamp()
    assert period_bounds("last-week", NOW)[:2] == (
        datetime(2026, 11, 9, tzinfo=UTC).timestamp(),
        datetime(2026, 11, 16, tzinfo=UTC).timestamp(),
    )
    assert period_bounds("7d", NOW)[:2] == (NOW - 7 * DAY, NOW)
    assert period_bounds("2026-09", NOW)[2] == "September 2026"
    for bad in ("2027-01", "fortnight", "<script>"):
        with pytest.raises(BadPeriod):
            period_bounds(bad, NOW)


def test_the_api_report_comes_back_with_its_figures_and_charts() -> None:
    start, end, words = period_bounds("month", NOW)
    fv = report_from_json(api_json(), start_s=start, end_s=end, now_s=NOW, period="month", words=words)
    report = fv.report
    # vision: 8 GPU-h then 8 more open until now; nlp: 32 GPU-h at $1.
    assert report.total_gpu_hours == pytest.approx(48.0)
    assert report.total_cost_usd == pytest.approx(64.0)
    tenants = {str(t.tenant): t for t in report.tenants}
    assert tenants["vision"].budget_spent_share == pytest.approx(0.16)
    assert tenants["nlp"].monthly_budget_gpu_hours is None
    assert len(report.daily_cost_by_tenant) == 3
    html = render_finance(fv, VIEW)
    assert '<svg id="cost-by-tenant"' in html
    assert '<svg id="gpu-hours-by-type"' in html
    assert re.search(r'<tr data-tenant="vision".*?<td class="num burn">16.0%</td>', html)
    assert 'id="finance-csv" href="/finance.csv?period=month"' in html
    assert "style=" not in html
    assert "<script" not in html


def test_forecast_over_the_budget_is_marked() -> None:
    start, end, words = period_bounds("month", NOW)
    tight = [TenantRecord(name=TenantId("vision"), monthly_budget_gpu_hours=20.0), TENANTS[1]]
    query = ReportQuery(start_s=start, end_s=end, now_s=NOW, group_by=(Dim.TENANT,), bucket=Bucket.DAY)
    text = render_json(compute_report(INTERVALS, tight, query))
    html = render_finance(
        report_from_json(text, start_s=start, end_s=end, now_s=NOW, period="month", words=words), VIEW
    )
    assert '<tr data-tenant="vision" class="over-budget">' in html
    assert "seg-forecast-over" in html


def test_idle_cost_for_finance_and_the_note_for_members() -> None:
    start, end, words = period_bounds("month", NOW)
    pools = (ProvisionedInterval("aws", "h100-od", "H100", 16, 6.88, NOW - 4 * DAY, NOW - 4 * DAY + 3600),)
    fv = report_from_json(
        api_json(provisioned=pools), start_s=start, end_s=end, now_s=NOW, period="month", words=words
    )
    html = render_finance(fv, VIEW)
    assert re.search(r'<tr data-cluster="aws" data-pool="h100-od">.*?\$110.08', html)
    member = View(user="alice", tenant="vision", role="member", is_admin=False, csrf="c", now_s=NOW)
    fv = report_from_json(
        api_json(frozenset({TenantId("vision")})),
        start_s=start,
        end_s=end,
        now_s=NOW,
        period="month",
        words=words,
    )
    html = render_finance(fv, member)
    assert 'id="no-idle"' in html
    assert "nlp" not in html


def test_the_period_shown_back_is_escaped() -> None:
    start, end, _ = period_bounds("month", NOW)
    fv = report_from_json(api_json(), start_s=start, end_s=end, now_s=NOW, period=EVIL, words=EVIL)
    html = render_finance(fv, VIEW)
    assert EVIL not in html
    assert "&lt;b onclick=&quot;x&quot;&gt;" in html
