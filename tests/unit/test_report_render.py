"""Renderers and the FOCUS export: columns, stable CSV and JSON, the aligned table, the HTML page."""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any

import pytest

from federation.ledger.report import (
    FOCUS_COLUMNS,
    Bucket,
    Dim,
    ForecastBasis,
    compute_report,
    focus_rows,
    render_csv,
    render_focus_csv,
    render_focus_json,
    render_html,
    render_json,
    render_table,
)
from federation.store.intervals import LedgerInterval
from placement.model import CapacityKind, TenantId
from tests.unit.test_report_query import NOVEMBER, a_query, a_tenant, an_interval

# ---- FOCUS


def one_spot_interval() -> LedgerInterval:
    return (
        an_interval("2026-11-01T22:00", "2026-11-03T01:00")
        .gpus(2)
        .price(3.0)
        .gpu("H100")
        .kind(CapacityKind.SPOT)
        .cluster("aws-1", "aws", "us-east-1")
        .user("alice")
        .job("job-7", 2)
        .build()
    )


@pytest.mark.parametrize(
    ("column", "expected"),
    [
        ("ChargePeriodStart", "2026-11-01T00:00:00Z"),
        ("ChargePeriodEnd", "2026-11-02T00:00:00Z"),
        ("BilledCost", 12.0),
        ("EffectiveCost", 12.0),
        ("ListCost", 12.0),
        ("BillingCurrency", "USD"),
        ("ConsumedQuantity", 4.0),
        ("ConsumedUnit", "GPU-Hours"),
        ("PricingQuantity", 4.0),
        ("PricingUnit", "GPU-Hours"),
        ("ListUnitPrice", 3.0),
        ("ChargeCategory", "Usage"),
        ("ResourceType", "GPU"),
        ("ResourceId", "aws-1/job-7/a2"),
        ("ProviderName", "aws"),
        ("RegionName", "us-east-1"),
        ("SkuId", "H100-spot"),
        ("ServiceName", "gpufed"),
        ("SubAccountName", "vision"),
        (
            "Tags",
            {"tenant": "vision", "user": "alice", "cluster": "aws-1", "gpu_type": "H100", "job": "job-7"},
        ),
    ],
)
def test_focus_columns(column: str, expected: object) -> None:
    (first, *_) = focus_rows([one_spot_interval()], a_query(*NOVEMBER))
    assert first[column] == expected
    assert list(first) == list(FOCUS_COLUMNS)


def test_focus_has_one_row_per_interval_and_day_clipped_to_the_period() -> None:
    rows = focus_rows([one_spot_interval()], a_query("2026-11-02", "2026-12-01", "2026-11-30"))
    assert [(r["ChargePeriodStart"], r["ConsumedQuantity"], r["BilledCost"]) for r in rows] == [
        ("2026-11-02T00:00:00Z", 48.0, 144.0),
        ("2026-11-03T00:00:00Z", 2.0, 6.0),
    ]


def test_focus_rows_follow_the_tenant_filter_and_the_intervals_starts() -> None:
    ledger = [
        an_interval("2026-11-05T00:00", "2026-11-05T01:00").tenant("nlp").job("late").build(),
        an_interval("2026-11-04T00:00", "2026-11-04T01:00").tenant("vision").job("early").build(),
        an_interval("2026-11-03T00:00", None).tenant("vision").job("open").build(),
    ]
    rows = focus_rows(ledger, a_query("2026-11-01", "2026-12-01", "2026-11-04T12:00"))
    assert [(r["Tags"]["job"], r["ChargePeriodStart"][:10]) for r in rows] == [
        ("open", "2026-11-03"),
        ("open", "2026-11-04"),
        ("early", "2026-11-04"),
    ]
    mine = focus_rows(ledger, a_query(*NOVEMBER, tenants=frozenset({TenantId("nlp")})))
    assert {r["SubAccountName"] for r in mine} == {"nlp"}


def test_focus_csv_and_json_carry_the_same_rows() -> None:
    rows = focus_rows([one_spot_interval()], a_query(*NOVEMBER))
    text = render_focus_csv(rows)
    assert text.splitlines()[0] == ",".join(FOCUS_COLUMNS)
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert [float(r["ConsumedQuantity"]) for r in parsed] == [4.0, 48.0, 2.0]
    assert json.loads(parsed[0]["Tags"]) == rows[0]["Tags"]
    assert json.loads(render_focus_json(rows)) == rows
    assert json.loads(render_focus_json([])) == []


# ---- table, CSV, JSON


def a_report(order: int = 1, **kw: Any) -> str:
    ledger = [
        an_interval("2026-11-10T00:00", "2026-11-11T06:00").tenant("vision").build(),
        an_interval("2026-11-10T00:00", "2026-11-10T03:00")
        .tenant("nlp")
        .user("bob")
        .gpu("H100")
        .price(6.0)
        .build(),
    ][::order]
    return render_json(
        compute_report(
            ledger,
            [a_tenant("vision", guaranteed={"A100": 8}, budget_gpu_hours=500.0)],
            a_query(*NOVEMBER, **kw),
        )
    )


def test_json_is_stable_and_independent_of_the_ledgers_order() -> None:
    assert a_report(1) == a_report(-1)
    data = json.loads(a_report(1, group_by=(Dim.TENANT, Dim.GPU_TYPE), bucket=Bucket.DAY))
    assert list(data) == sorted(data)
    assert list(data) == [
        "bucket",
        "forecast_basis",
        "gpu_hours_by_type",
        "group_by",
        "idle",
        "idle_by_cluster",
        "month",
        "period",
        "rows",
        "tenants",
        "total",
    ]
    assert data["rows"][0] == {
        "tenant": "nlp",
        "gpu_type": "H100",
        "day": "2026-11-10",
        "gpu_hours": 24.0,
        "cost_usd": 144.0,
        "intervals": 1,
    }
    assert list(data["tenants"][1]) == sorted(data["tenants"][1])
    assert data["tenants"][1]["budget_left_gpu_hours"] == pytest.approx(500.0 - 240.0)
    assert data["forecast_basis"] == "month_to_date"


def test_csv_has_a_header_of_the_dimensions_then_the_figures() -> None:
    ledger = [an_interval("2026-11-10T00:00", "2026-11-10T01:00").build()]
    report = compute_report(ledger, [], a_query(*NOVEMBER, group_by=(Dim.USER, Dim.KIND), bucket=Bucket.WEEK))
    assert (
        render_csv(report)
        == "user,kind,week,gpu_hours,cost_usd,intervals\nalice,private,2026-W46,8.0,16.0,1\n"
    )


def test_the_table_is_aligned_and_says_how_the_forecast_was_made() -> None:
    ledger = [
        an_interval("2026-11-10T00:00", "2026-11-11T06:00").tenant("vision-research-long-name").build(),
        an_interval("2026-11-10T00:00", "2026-11-10T03:00").tenant("nlp").build(),
    ]
    query = a_query(*NOVEMBER, group_by=(Dim.TENANT, Dim.GPU_TYPE), forecast=ForecastBasis.LAST_7_DAYS)
    text = render_table(compute_report(ledger, [], query))
    usage = text.split("\n\n")[1].splitlines()
    assert usage[0].split() == ["TENANT", "GPU", "TYPE", "GPU", "HOURS", "COST", "USD", "INTERVALS"]
    # Numbers are right-aligned: every row's GPU-hours end in the same column.
    ends = {line.index(".000") for line in usage[1:]}
    assert len(ends) == 1
    assert usage[-1].startswith("TOTAL")
    assert "forecast to its end at the rate of the last 7 days" in text


# ---- HTML


def test_the_html_report_is_self_contained_with_both_charts_and_the_tables() -> None:
    ledger = [
        an_interval("2026-11-10T00:00", "2026-11-11T00:00").tenant("vision").build(),
        an_interval("2026-11-10T12:00", "2026-11-12T00:00").tenant("nlp").gpu("H100").build(),
    ]
    html = render_html(
        compute_report(ledger, [a_tenant("vision", budget_gpu_hours=100.0)], a_query(*NOVEMBER))
    )
    cost = re.search(r'<svg id="cost-by-tenant".*?</svg>', html, re.S)
    types = re.search(r'<svg id="gpu-hours-by-type".*?</svg>', html, re.S)
    assert cost is not None
    assert types is not None
    assert re.findall(r'class="bar" data-tenant="([^"]+)" data-period="([^"]+)"', cost.group(0)) == [
        ("nlp", "2026-11-10"),
        ("vision", "2026-11-10"),
        ("nlp", "2026-11-11"),
    ]
    assert re.findall(r'class="bar" data-gpu-type="([^"]+)"', types.group(0)) == ["A100", "H100"]
    assert 'class="tenants"' in html
    assert 'class="usage"' in html
    assert 'id="forecast-basis"' in html
    for external in ("<script", "src=", "href=", "url(", "@import", "http://", "https://"):
        assert external not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")


@pytest.mark.parametrize(
    ("days", "bucket", "bars"),
    [
        pytest.param(30, "day", 30, id="a-month-by-day"),
        pytest.param(90, "week", 14, id="a-quarter-by-week"),
        pytest.param(731, "month", 24, id="two-years-by-month"),
    ],
)
def test_long_periods_chart_cost_by_week_or_month(days: int, bucket: str, bars: int) -> None:
    ledger = [an_interval("2025-01-01T00:00", None).build()]
    end = {30: "2026-12-01", 90: "2027-01-30", 731: "2028-11-01"}[days]
    html = render_html(compute_report(ledger, [], a_query("2026-11-01", end, "2028-12-01")))
    chart = re.search(r'<svg id="cost-by-tenant" class="chart" data-bucket="(\w+)".*?</svg>', html, re.S)
    assert chart is not None
    assert chart.group(1) == bucket
    assert len(re.findall(r'class="bar"', chart.group(0))) == bars


def test_names_are_escaped_in_html() -> None:
    ledger = [an_interval("2026-11-10T00:00", "2026-11-11T00:00").tenant("<script>x</script>").build()]
    html = render_html(compute_report(ledger, [], a_query(*NOVEMBER)))
    assert "<script>" not in html
    assert "&lt;script&gt;" in html
