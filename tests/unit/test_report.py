"""Finance reports from ledger intervals: clipping, buckets, grouping, tenant filter, quota share,
budget, forecast, FOCUS rows, and the renderers."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.ledger import IntervalEnd, LedgerInterval
from federation.records import TenantRecord
from federation.report import (
    Bucket,
    Dim,
    ReportQuery,
    compute_report,
    focus_rows,
    render_csv,
    render_focus_csv,
    render_html,
    render_json,
    render_table,
)
from federation.report.focus import COLUMNS
from placement.model import CapacityKind, ClusterName, GpuQuota, GpuType, JobId, TenantId

H = 3600.0


def t(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def an_interval(
    start: str,
    end: str | None,
    *,
    tenant: str = "vision",
    gpus: int = 8,
    price: float = 2.0,
    gpu: str = "A100",
    user: str = "alice",
    cluster: str = "onprem",
    job: str = "j1",
    attempt: int = 1,
    kind: CapacityKind = CapacityKind.PRIVATE,
) -> LedgerInterval:
    return LedgerInterval(
        job_id=JobId(job),
        attempt=attempt,
        tenant=TenantId(tenant),
        user=user,
        cluster=ClusterName(cluster),
        provider="private" if kind is CapacityKind.PRIVATE else "aws",
        region="dc1",
        gpu_type=GpuType(gpu),
        gpu_count=gpus,
        kind=kind,
        start_s=t(start),
        end_s=None if end is None else t(end),
        usd_per_gpu_hour=price,
        ended=None if end is None else IntervalEnd.FINISHED,
    )


def a_query(start: str, end: str, now: str, **kw: object) -> ReportQuery:
    return ReportQuery(start_s=t(start), end_s=t(end), now_s=t(now), **kw)  # type: ignore[arg-type]


NOV = ("2026-11-01", "2026-12-01", "2026-11-30T00:00")


@pytest.mark.parametrize(
    ("interval", "query", "gpu_hours"),
    [
        pytest.param(an_interval("2026-11-10T00:00", "2026-11-10T02:00"), a_query(*NOV), 16.0, id="inside"),
        pytest.param(
            an_interval("2026-10-31T23:00", "2026-11-01T01:00"), a_query(*NOV), 8.0, id="clipped-at-start"
        ),
        pytest.param(
            an_interval("2026-11-30T23:00", "2026-12-01T02:00"),
            a_query("2026-11-01", "2026-12-01", "2026-12-05T00:00"),
            8.0,
            id="clipped-at-end",
        ),
        pytest.param(an_interval("2026-11-29T22:00", None), a_query(*NOV), 16.0, id="open-counts-to-now"),
        pytest.param(an_interval("2026-10-01T00:00", "2026-10-02T00:00"), a_query(*NOV), 0.0, id="outside"),
    ],
)
def test_intervals_are_clipped_to_the_period_and_open_ones_run_to_now(
    interval: LedgerInterval, query: ReportQuery, gpu_hours: float
) -> None:
    report = compute_report([interval], [], query)
    assert report.total_gpu_hours == pytest.approx(gpu_hours)
    assert report.total_cost_usd == pytest.approx(gpu_hours * 2.0)


@pytest.mark.parametrize(
    ("bucket", "labels_hours"),
    [
        pytest.param(Bucket.DAY, [("2026-11-01", 8.0), ("2026-11-02", 16.0)], id="day"),
        # 2026-11-01 is a Sunday: its hour is in ISO week 44, the rest in week 45.
        pytest.param(Bucket.WEEK, [("2026-W44", 8.0), ("2026-W45", 16.0)], id="week"),
        pytest.param(Bucket.MONTH, [("2026-10", 8.0), ("2026-11", 16.0)], id="month-oct-nov"),
    ],
)
def test_intervals_split_exactly_at_bucket_boundaries(
    bucket: Bucket, labels_hours: list[tuple[str, float]]
) -> None:
    start = "2026-10-31T23:00" if bucket is Bucket.MONTH else "2026-11-01T23:00"
    end = "2026-11-01T02:00" if bucket is Bucket.MONTH else "2026-11-02T02:00"
    query = a_query("2026-10-01", "2026-12-01", "2026-11-30T00:00", bucket=bucket)
    report = compute_report([an_interval(start, end, gpus=8)], [], query)
    rows = json.loads(render_json(report))["rows"]
    assert [(r[bucket.value], r["gpu_hours"]) for r in rows] == [
        (lbl, pytest.approx(h)) for lbl, h in labels_hours
    ]


def test_grouping_by_several_dimensions_and_the_members_filter() -> None:
    ledger = [
        an_interval("2026-11-10T00:00", "2026-11-10T01:00", tenant="vision", gpu="A100", gpus=8),
        an_interval("2026-11-10T00:00", "2026-11-10T01:00", tenant="vision", gpu="H100", gpus=4, price=6.0),
        an_interval("2026-11-10T00:00", "2026-11-10T01:00", tenant="nlp", gpu="A100", gpus=2, user="bob"),
    ]
    report = compute_report(ledger, [], a_query(*NOV, group_by=(Dim.TENANT, Dim.GPU_TYPE)))
    assert [(r.key, r.gpu_hours, r.cost_usd) for r in report.rows] == [
        (("nlp", "A100"), 2.0, 4.0),
        (("vision", "A100"), 8.0, 16.0),
        (("vision", "H100"), 4.0, 24.0),
    ]
    mine = compute_report(ledger, [], a_query(*NOV, tenants=frozenset({TenantId("vision")})))
    assert [r.key for r in mine.rows] == [("vision",)]
    assert [s.tenant for s in mine.tenants] == ["vision"]
    assert mine.total_gpu_hours == 12.0
    text = render_table(mine) + render_csv(mine) + render_json(mine) + render_html(mine)
    assert "nlp" not in text
    assert "bob" not in text


def test_quota_share_budget_and_forecast_roll_up_the_tenant_tree() -> None:
    tenants = [
        TenantRecord(TenantId("research"), monthly_budget_gpu_hours=1000.0),
        TenantRecord(
            TenantId("vision"),
            parent=TenantId("research"),
            quotas=(GpuQuota(GpuType("A100"), guaranteed_gpus=8),),
            monthly_budget_gpu_hours=240.0,
        ),
    ]
    # 8 GPUs for 10 days of a 30-day month, as of day 10: 1,920 GPU-hours so far.
    ledger = [an_interval("2026-11-01T00:00", None, tenant="vision", gpus=8, price=1.0)]
    report = compute_report(ledger, tenants, a_query("2026-11-01", "2026-12-01", "2026-11-11T00:00"))
    by = {s.tenant: s for s in report.tenants}
    assert by["vision"].month_gpu_hours == pytest.approx(1920.0)
    assert by["vision"].budget_left_gpu_hours == pytest.approx(240.0 - 1920.0)
    assert by["vision"].quota_share == pytest.approx(1.0), "8 guaranteed GPUs used all along"
    assert by["vision"].forecast_month_gpu_hours == pytest.approx(1920.0 * 3)
    assert by["research"].month_gpu_hours == pytest.approx(1920.0), "an organisation counts its teams"
    assert by["research"].quota_share is None


def test_focus_rows_are_one_per_interval_and_day_with_the_focus_columns() -> None:
    ledger = [an_interval("2026-11-01T22:00", "2026-11-02T01:00", gpus=2, price=3.0)]
    rows = focus_rows(ledger, a_query(*NOV))
    assert [(r["ChargePeriodStart"], r["ConsumedQuantity"], r["BilledCost"]) for r in rows] == [
        ("2026-11-01T00:00:00Z", 4.0, 12.0),
        ("2026-11-02T00:00:00Z", 2.0, 6.0),
    ]
    assert rows[0]["Tags"] == {
        "tenant": "vision",
        "user": "alice",
        "cluster": "onprem",
        "gpu_type": "A100",
        "job": "j1",
    }
    parsed = list(csv.DictReader(io.StringIO(render_focus_csv(rows))))
    assert list(parsed[0]) == list(COLUMNS)
    assert json.loads(parsed[0]["Tags"])["tenant"] == "vision"


def test_the_html_report_is_self_contained_with_both_charts() -> None:
    ledger = [
        an_interval("2026-11-10T00:00", "2026-11-11T00:00", tenant="vision"),
        an_interval("2026-11-11T00:00", "2026-11-12T00:00", tenant="nlp", gpu="H100"),
    ]
    html = render_html(compute_report(ledger, [], a_query(*NOV)))
    assert 'id="cost-by-tenant"' in html
    assert 'id="gpu-hours-by-type"' in html
    assert html.count('class="bar"') == 4  # two days x one tenant each, two GPU types
    for external in ("<script", "src=", "href=", "url(", "@import"):
        assert external not in html


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 40 * 86400),
            st.one_of(st.none(), st.integers(1, 5 * 86400)),
            st.integers(1, 16),
            st.sampled_from(["vision", "nlp", "audio"]),
            st.sampled_from(["A100", "H100", "L4"]),
        ),
        max_size=30,
    ),
    st.sampled_from([None, Bucket.DAY, Bucket.WEEK, Bucket.MONTH]),
    st.lists(st.sampled_from(list(Dim)), max_size=3, unique=True),
)
def test_any_grouping_adds_up_to_the_clipped_gpu_hours_of_every_interval(
    raw: list[tuple[int, int | None, int, str, str]], bucket: Bucket | None, dims: list[Dim]
) -> None:
    base = t("2026-10-20")
    ledger = [
        LedgerInterval(
            JobId(f"j{i}"),
            1,
            TenantId(tenant),
            "u",
            ClusterName("c"),
            "private",
            "r",
            GpuType(gpu),
            gpus,
            CapacityKind.PRIVATE,
            base + start,
            None if length is None else base + start + length,
            1.5,
        )
        for i, (start, length, gpus, tenant, gpu) in enumerate(raw)
    ]
    query = ReportQuery(
        t("2026-11-01"), t("2026-12-01"), t("2026-11-25"), tuple(dims) or (Dim.TENANT,), bucket
    )
    report = compute_report(ledger, [], query)
    expected = sum(iv.gpu_hours(since_s=query.start_s, until_s=query.now_s) for iv in ledger)
    assert report.total_gpu_hours == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert sum(h for _, h in report.gpu_hours_by_type) == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert sum(c for _, _, c in report.daily_cost_by_tenant) == pytest.approx(
        expected * 1.5, rel=1e-9, abs=1e-9
    )


def test_idle_cost_is_provisioned_gpu_time_no_job_used_on_that_cluster_and_type() -> None:
    from federation.report.idle import ProvisionedInterval, idle_cost

    pool = ProvisionedInterval(
        "onprem", "a100-burst", "A100", 16, 2.0, t("2026-11-10T00:00"), t("2026-11-10T10:00")
    )
    ledger = [
        an_interval("2026-11-10T02:00", "2026-11-10T04:00", gpus=8),  # 16 GPU-hours used
        an_interval("2026-11-10T09:00", "2026-11-10T12:00", gpus=8),  # 8 of them inside the pool's time
        an_interval("2026-11-10T02:00", "2026-11-10T04:00", gpus=8, gpu="H100"),  # another type
    ]
    (cost,) = idle_cost([pool], ledger, start_s=t("2026-11-01"), end_s=t("2026-12-01"))
    assert (cost.provisioned_gpu_hours, cost.used_gpu_hours, cost.idle_gpu_hours) == (160.0, 24.0, 136.0)
    assert cost.idle_cost_usd == pytest.approx(272.0)
    (clipped,) = idle_cost([pool], [], start_s=t("2026-11-10T05:00"), end_s=t("2026-12-01"))
    assert clipped.idle_gpu_hours == pytest.approx(80.0)
