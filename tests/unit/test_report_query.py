"""Report periods and calendar buckets (UTC), and the small builders the other report tests share."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from datetime import UTC, date, datetime
from typing import Any

import pytest

from federation.ledger.report import Bucket, ReportQuery, utc_s
from federation.ledger.report.query import bucket_edges, bucket_label, bucket_start_s
from federation.store.intervals import IntervalEnd, LedgerInterval
from federation.store.records import TenantRecord
from placement.model import CapacityKind, ClusterName, GpuQuota, GpuType, JobId, TenantId

H = 3600.0
DAY = 86400.0


def t(text: str) -> float:
    """An ISO date or date-time read as UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


class IntervalBuilder:
    """`an_interval("2026-11-10T00:00", "2026-11-10T02:00").tenant("nlp").gpus(4).build()`."""

    def __init__(self, start: str, end: str | None) -> None:
        self._iv = LedgerInterval(
            job_id=JobId("j1"),
            attempt=1,
            tenant=TenantId("vision"),
            user="alice",
            cluster=ClusterName("onprem"),
            provider="private",
            region="dc1",
            gpu_type=GpuType("A100"),
            gpu_count=8,
            kind=CapacityKind.PRIVATE,
            start_s=t(start),
            end_s=None if end is None else t(end),
            usd_per_gpu_hour=2.0,
            ended=None if end is None else IntervalEnd.FINISHED,
            job_name="train",
        )

    def _with(self, **kw: Any) -> IntervalBuilder:
        self._iv = replace(self._iv, **kw)
        return self

    def tenant(self, name: str) -> IntervalBuilder:
        return self._with(tenant=TenantId(name))

    def user(self, name: str) -> IntervalBuilder:
        return self._with(user=name)

    def cluster(self, name: str, provider: str = "private", region: str = "dc1") -> IntervalBuilder:
        return self._with(cluster=ClusterName(name), provider=provider, region=region)

    def gpu(self, gpu_type: str) -> IntervalBuilder:
        return self._with(gpu_type=GpuType(gpu_type))

    def gpus(self, count: int) -> IntervalBuilder:
        return self._with(gpu_count=count)

    def kind(self, kind: CapacityKind) -> IntervalBuilder:
        return self._with(kind=kind)

    def price(self, usd_per_gpu_hour: float) -> IntervalBuilder:
        return self._with(usd_per_gpu_hour=usd_per_gpu_hour)

    def span_s(self, start_s: float, end_s: float | None) -> IntervalBuilder:
        return self._with(start_s=start_s, end_s=end_s, ended=None if end_s is None else IntervalEnd.FINISHED)

    def job(self, job_id: str, attempt: int = 1) -> IntervalBuilder:
        return self._with(job_id=JobId(job_id), attempt=attempt)

    def build(self) -> LedgerInterval:
        return self._iv


def an_interval(start: str, end: str | None) -> IntervalBuilder:
    return IntervalBuilder(start, end)


def a_tenant(
    name: str,
    *,
    parent: str | None = None,
    guaranteed: dict[str, int] | None = None,
    budget_gpu_hours: float | None = None,
) -> TenantRecord:
    return TenantRecord(
        TenantId(name),
        parent=None if parent is None else TenantId(parent),
        quotas=tuple(GpuQuota(GpuType(g), guaranteed_gpus=n) for g, n in (guaranteed or {}).items()),
        monthly_budget_gpu_hours=budget_gpu_hours,
    )


def a_query(start: str, end: str, now: str, **kw: Any) -> ReportQuery:
    return ReportQuery(start_s=t(start), end_s=t(end), now_s=t(now), **kw)


NOVEMBER = ("2026-11-01", "2026-12-01", "2026-11-30T00:00")


# ---- periods


@pytest.mark.parametrize(
    ("now", "this_month", "last_month"),
    [
        pytest.param(
            "2026-11-24T17:00", ("2026-11-01", "2026-12-01"), ("2026-10-01", "2026-11-01"), id="november"
        ),
        pytest.param(
            "2026-12-31T23:59", ("2026-12-01", "2027-01-01"), ("2026-11-01", "2026-12-01"), id="december"
        ),
        pytest.param(
            "2027-01-01T00:00", ("2027-01-01", "2027-02-01"), ("2026-12-01", "2027-01-01"), id="new-year"
        ),
        pytest.param(
            "2028-03-15T00:00", ("2028-03-01", "2028-04-01"), ("2028-02-01", "2028-03-01"), id="leap-february"
        ),
    ],
)
def test_this_month_and_last_month_are_calendar_months_in_utc(
    now: str, this_month: tuple[str, str], last_month: tuple[str, str]
) -> None:
    this = ReportQuery.this_month(t(now))
    last = ReportQuery.last_month(t(now))
    assert (this.start_s, this.end_s) == (t(this_month[0]), t(this_month[1]))
    assert (last.start_s, last.end_s) == (t(last_month[0]), t(last_month[1]))
    assert this.now_s == last.now_s == t(now)
    assert this.until_s == t(now), "this month counts up to now"
    assert last.until_s == last.end_s


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        pytest.param("2026-11-01", "2026-11-01T00:00", id="date"),
        pytest.param("2026-11-01T12:30", "2026-11-01T12:30", id="naive-is-utc"),
        pytest.param("2026-11-01T12:30Z", "2026-11-01T12:30", id="z-suffix"),
        pytest.param("2026-11-01T13:30+01:00", "2026-11-01T12:30", id="offset"),
        pytest.param(date(2026, 11, 1), "2026-11-01T00:00", id="date-object"),
        pytest.param(datetime(2026, 11, 1, 12, 30), "2026-11-01T12:30", id="naive-datetime"),
    ],
)
def test_explicit_dates_read_as_utc(when: str | date, expected: str) -> None:
    assert utc_s(when) == t(expected)
    query = ReportQuery.between(when, "2026-12-01", now_s=t("2026-12-05"))
    assert (query.start_s, query.end_s) == (t(expected), t("2026-12-01"))


def test_an_empty_or_reversed_period_is_refused() -> None:
    with pytest.raises(ValueError, match="end after it starts"):
        ReportQuery.between("2026-11-02", "2026-11-01", now_s=t("2026-12-01"))


def test_a_period_that_starts_after_now_counts_nothing_ahead() -> None:
    query = a_query("2026-12-01", "2027-01-01", "2026-11-15")
    assert query.until_s == query.start_s


# ---- buckets


@pytest.mark.parametrize(
    ("at", "bucket", "start", "label"),
    [
        pytest.param("2026-11-24T17:00", Bucket.DAY, "2026-11-24", "2026-11-24", id="day"),
        pytest.param("2026-11-24T17:00", Bucket.WEEK, "2026-11-23", "2026-W48", id="week-starts-monday"),
        pytest.param("2026-11-23T00:00", Bucket.WEEK, "2026-11-23", "2026-W48", id="monday-midnight"),
        pytest.param("2026-11-22T23:59", Bucket.WEEK, "2026-11-16", "2026-W47", id="sunday-night"),
        # 2027-01-01 is a Friday: it belongs to ISO week 53 of 2026.
        pytest.param(
            "2027-01-01T10:00", Bucket.WEEK, "2026-12-28", "2026-W53", id="iso-week-across-new-year"
        ),
        pytest.param("2026-11-24T17:00", Bucket.MONTH, "2026-11-01", "2026-11", id="month"),
        pytest.param("2028-02-29T23:00", Bucket.MONTH, "2028-02-01", "2028-02", id="leap-day"),
    ],
)
def test_buckets_start_on_calendar_boundaries(at: str, bucket: Bucket, start: str, label: str) -> None:
    assert bucket_start_s(t(at), bucket) == t(start)
    assert bucket_label(t(start), bucket) == label


@pytest.mark.parametrize(
    ("since", "until", "bucket", "edges"),
    [
        pytest.param(
            "2026-11-01", "2026-11-03", Bucket.DAY, ["2026-11-01", "2026-11-02", "2026-11-03"], id="days"
        ),
        pytest.param(
            "2026-11-01T12:00",
            "2026-11-02T01:00",
            Bucket.DAY,
            ["2026-11-01", "2026-11-02", "2026-11-03"],
            id="partial-days",
        ),
        pytest.param(
            "2026-11-01",
            "2026-11-10",
            Bucket.WEEK,
            ["2026-10-26", "2026-11-02", "2026-11-09", "2026-11-16"],
            id="weeks",
        ),
        pytest.param(
            "2026-12-15",
            "2027-02-01",
            Bucket.MONTH,
            ["2026-12-01", "2027-01-01", "2027-02-01"],
            id="months-over-new-year",
        ),
        pytest.param("2026-11-05", "2026-11-07", None, ["2026-11-05", "2026-11-07"], id="no-bucket"),
    ],
)
def test_bucket_edges_cover_the_period(
    since: str, until: str, bucket: Bucket | None, edges: list[str]
) -> None:
    assert bucket_edges(t(since), t(until), bucket) == [t(e) for e in edges]


# ---- the package's surface


def test_the_report_package_imports_without_grpc_or_etcd_and_keeps_its_public_names() -> None:
    code = (
        "import sys, federation.ledger.report as r; "
        "print(sorted(m for m in ('grpc', 'aetcd') if m in sys.modules)); print(sorted(r.__all__))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, names = done.stdout.splitlines()
    assert loaded == "[]"
    for name in (
        "Bucket",
        "Dim",
        "ForecastBasis",
        "ReportQuery",
        "Report",
        "compute_report",
        "render_table",
        "render_csv",
        "render_json",
        "render_html",
        "focus_rows",
        "render_focus_csv",
        "render_focus_json",
        "ProvisionedInterval",
        "idle_cost",
        "idle_by_cluster",
    ):
        assert repr(name) in names
