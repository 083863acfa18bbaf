"""compute_report: clipping, bucket splits, open intervals, grouping, the tenant filter, quota share,
budget and forecast, checked against hand-worked figures and, for random ledgers, against a naive
calendar walk written independently of the columnar code."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.ledger.report import Bucket, Dim, ForecastBasis, ReportQuery, compute_report
from federation.ledger.report.compute import Report, TenantSummary
from federation.store.intervals import LedgerInterval
from federation.store.records import TenantRecord
from placement.model import CapacityKind, TenantId
from tests.properties import examples
from tests.unit.test_report_query import NOVEMBER, H, a_query, a_tenant, an_interval, t


def by_key(report: Report) -> dict[tuple[tuple[str, ...], str | None], float]:
    return {
        (
            r.key,
            None
            if r.bucket_start_s is None
            else datetime.fromtimestamp(r.bucket_start_s, UTC).strftime("%F"),
        ): (r.gpu_hours)
        for r in report.rows
    }


# ---- clipping and open intervals


@pytest.mark.parametrize(
    ("start", "end", "query", "gpu_hours"),
    [
        pytest.param("2026-11-10T00:00", "2026-11-10T02:00", NOVEMBER, 16.0, id="inside"),
        pytest.param("2026-10-31T23:00", "2026-11-01T01:00", NOVEMBER, 8.0, id="clipped-at-start"),
        pytest.param(
            "2026-11-30T23:00",
            "2026-12-01T02:00",
            ("2026-11-01", "2026-12-01", "2026-12-05"),
            8.0,
            id="clipped-at-end",
        ),
        pytest.param(
            "2026-10-01T00:00",
            "2026-12-31T00:00",
            ("2026-11-01", "2026-11-02", "2027-01-01"),
            192.0,
            id="covers-period",
        ),
        pytest.param("2026-10-01T00:00", "2026-10-02T00:00", NOVEMBER, 0.0, id="before"),
        pytest.param(
            "2026-12-01T00:00",
            "2026-12-02T00:00",
            ("2026-11-01", "2026-12-01", "2026-12-05"),
            0.0,
            id="after",
        ),
        pytest.param("2026-11-30T23:00", "2026-12-01T00:00", NOVEMBER, 0.0, id="touches-end-after-now"),
        pytest.param("2026-11-29T22:00", None, NOVEMBER, 16.0, id="open-runs-to-now"),
        pytest.param(
            "2026-11-29T22:00",
            None,
            ("2026-11-01", "2026-11-29T23:00", "2026-11-30"),
            8.0,
            id="open-runs-to-period-end",
        ),
        pytest.param("2026-11-30T01:00", None, NOVEMBER, 0.0, id="open-starting-after-now"),
        pytest.param("2026-11-29T23:00", "2026-11-30T05:00", NOVEMBER, 8.0, id="closed-clipped-at-now"),
        pytest.param("2026-11-10T00:00", "2026-11-10T00:00", NOVEMBER, 0.0, id="zero-length"),
    ],
)
def test_intervals_are_clipped_to_the_period_and_to_now(
    start: str, end: str | None, query: tuple[str, str, str], gpu_hours: float
) -> None:
    report = compute_report([an_interval(start, end).gpus(8).price(2.0).build()], [], a_query(*query))
    assert report.total_gpu_hours == pytest.approx(gpu_hours)
    assert report.total_cost_usd == pytest.approx(2.0 * gpu_hours)
    assert sum(s.gpu_hours for s in report.tenants) == pytest.approx(gpu_hours)


# ---- bucket splits


@pytest.mark.parametrize(
    ("start", "end", "bucket", "expected"),
    [
        pytest.param(
            "2026-11-01T22:00",
            "2026-11-03T02:00",
            Bucket.DAY,
            {"2026-11-01": 2.0, "2026-11-02": 24.0, "2026-11-03": 2.0},
            id="day-three-pieces",
        ),
        pytest.param(
            "2026-11-02T00:00", "2026-11-03T00:00", Bucket.DAY, {"2026-11-02": 24.0}, id="day-exact"
        ),
        # 2026-11-08 is a Sunday, 2026-11-09 a Monday.
        pytest.param(
            "2026-11-08T20:00",
            "2026-11-09T04:00",
            Bucket.WEEK,
            {"2026-11-02": 4.0, "2026-11-09": 4.0},
            id="week-sunday-to-monday",
        ),
        pytest.param(
            "2026-11-01T00:00",
            "2026-11-20T00:00",
            Bucket.WEEK,
            {"2026-10-26": 24.0, "2026-11-02": 168.0, "2026-11-09": 168.0, "2026-11-16": 96.0},
            id="week-four-pieces",
        ),
        pytest.param(
            "2026-10-31T20:00",
            "2026-11-01T04:00",
            Bucket.MONTH,
            {"2026-10-01": 4.0, "2026-11-01": 4.0},
            id="month-oct-nov",
        ),
        pytest.param(
            "2026-12-31T22:00",
            "2027-01-01T01:00",
            Bucket.MONTH,
            {"2026-12-01": 2.0, "2027-01-01": 1.0},
            id="month-new-year",
        ),
        pytest.param(
            "2028-02-28T12:00",
            "2028-03-01T12:00",
            Bucket.MONTH,
            {"2028-02-01": 36.0, "2028-03-01": 12.0},
            id="month-leap-february",
        ),
        pytest.param(
            "2026-12-31T22:00",
            "2027-01-01T01:00",
            Bucket.WEEK,
            {"2026-12-28": 3.0},
            id="week-spans-new-year",
        ),
    ],
)
def test_intervals_split_exactly_at_bucket_boundaries(
    start: str, end: str, bucket: Bucket, expected: dict[str, float]
) -> None:
    query = a_query("2026-10-01", "2028-12-01", "2028-12-01", bucket=bucket)
    report = compute_report([an_interval(start, end).gpus(1).build()], [], query)
    assert by_key(report) == {(("vision",), day): pytest.approx(h) for day, h in expected.items()}
    assert [r.intervals for r in report.rows] == [1] * len(expected), "each piece counts its interval once"


def test_a_bucket_cut_by_the_period_is_labelled_by_its_calendar_start_but_counts_only_the_period() -> None:
    # The period starts on a Wednesday: the week row starts on the Monday before, with two days in it.
    query = a_query("2026-11-04", "2026-11-09", "2026-12-01", bucket=Bucket.WEEK)
    report = compute_report([an_interval("2026-11-02T00:00", "2026-11-10T00:00").gpus(1).build()], [], query)
    assert by_key(report) == {(("vision",), "2026-11-02"): pytest.approx(5 * 24.0)}


# ---- grouping


def ledger() -> list[LedgerInterval]:
    span = ("2026-11-10T00:00", "2026-11-10T01:00")
    return [
        an_interval(*span).tenant("vision").user("alice").gpu("A100").gpus(8).build(),
        an_interval(*span)
        .tenant("vision")
        .user("ann")
        .gpu("H100")
        .gpus(4)
        .price(6.0)
        .cluster("aws-1", "aws", "us-east-1")
        .kind(CapacityKind.SPOT)
        .build(),
        an_interval(*span)
        .tenant("nlp")
        .user("bob")
        .gpu("A100")
        .gpus(2)
        .cluster("gcp-1", "gcp", "europe-west4")
        .kind(CapacityKind.ON_DEMAND)
        .build(),
    ]


@pytest.mark.parametrize(
    ("dims", "rows"),
    [
        pytest.param((Dim.TENANT,), {("nlp",): 2.0, ("vision",): 12.0}, id="tenant"),
        pytest.param((Dim.USER,), {("alice",): 8.0, ("ann",): 4.0, ("bob",): 2.0}, id="user"),
        pytest.param((Dim.CLUSTER,), {("aws-1",): 4.0, ("gcp-1",): 2.0, ("onprem",): 8.0}, id="cluster"),
        pytest.param((Dim.PROVIDER,), {("aws",): 4.0, ("gcp",): 2.0, ("private",): 8.0}, id="provider"),
        pytest.param((Dim.GPU_TYPE,), {("A100",): 10.0, ("H100",): 4.0}, id="gpu-type"),
        pytest.param((Dim.KIND,), {("on_demand",): 2.0, ("private",): 8.0, ("spot",): 4.0}, id="kind"),
        pytest.param(
            (Dim.TENANT, Dim.GPU_TYPE),
            {("nlp", "A100"): 2.0, ("vision", "A100"): 8.0, ("vision", "H100"): 4.0},
            id="tenant-gpu-type",
        ),
        pytest.param(
            (Dim.GPU_TYPE, Dim.TENANT),
            {("A100", "nlp"): 2.0, ("A100", "vision"): 8.0, ("H100", "vision"): 4.0},
            id="order-of-dims-is-kept",
        ),
        pytest.param(
            (Dim.PROVIDER, Dim.KIND, Dim.USER),
            {
                ("aws", "spot", "ann"): 4.0,
                ("gcp", "on_demand", "bob"): 2.0,
                ("private", "private", "alice"): 8.0,
            },
            id="three-dims",
        ),
    ],
)
def test_rows_group_by_any_combination_of_dimensions(
    dims: tuple[Dim, ...], rows: dict[tuple[str, ...], float]
) -> None:
    report = compute_report(ledger(), [], a_query(*NOVEMBER, group_by=dims))
    assert {r.key: r.gpu_hours for r in report.rows} == rows
    assert [r.key for r in report.rows] == sorted(rows), "rows come sorted by their key"
    assert report.total_gpu_hours == 14.0
    assert report.total_cost_usd == pytest.approx(8 * 2 + 4 * 6 + 2 * 2)


def test_rows_with_buckets_come_in_time_order_then_key() -> None:
    ivs = [
        an_interval("2026-11-11T00:00", "2026-11-11T01:00").tenant("a").build(),
        an_interval("2026-11-10T00:00", "2026-11-10T01:00").tenant("b").build(),
        an_interval("2026-11-10T00:00", "2026-11-10T01:00").tenant("a").build(),
    ]
    report = compute_report(ivs, [], a_query(*NOVEMBER, bucket=Bucket.DAY))
    assert [(r.bucket_start_s, r.key) for r in report.rows] == [
        (t("2026-11-10"), ("a",)),
        (t("2026-11-10"), ("b",)),
        (t("2026-11-11"), ("a",)),
    ]


def test_an_empty_ledger_gives_an_empty_report_with_every_known_tenant() -> None:
    report = compute_report(
        [], [a_tenant("vision", budget_gpu_hours=10.0)], a_query(*NOVEMBER, bucket=Bucket.DAY)
    )
    assert report.rows == ()
    assert (report.total_gpu_hours, report.total_cost_usd) == (0.0, 0.0)
    assert [(s.tenant, s.budget_left_gpu_hours) for s in report.tenants] == [("vision", 10.0)]


# ---- the tenant filter


def test_a_members_view_holds_nothing_of_another_tenant() -> None:
    tenants = [
        a_tenant("research"),
        a_tenant("vision", parent="research"),
        a_tenant("nlp", parent="research"),
    ]
    query = a_query(
        *NOVEMBER,
        group_by=(Dim.TENANT, Dim.USER, Dim.GPU_TYPE),
        bucket=Bucket.DAY,
        tenants=frozenset({TenantId("nlp")}),
    )
    report = compute_report(ledger(), tenants, query)
    assert {r.key[0] for r in report.rows} == {"nlp"}
    assert report.total_gpu_hours == 2.0
    assert report.total_cost_usd == 4.0
    assert [s.tenant for s in report.tenants] == ["nlp"], "neither siblings nor the parent organisation"
    assert {tenant for _, tenant, _ in report.daily_cost_by_tenant} == {"nlp"}
    assert report.gpu_hours_by_type == (("A100", 2.0),), "vision's H100 hours do not show"


@pytest.mark.parametrize(
    ("allowed", "total"),
    [
        pytest.param(frozenset(), 0.0, id="nobody"),
        pytest.param(frozenset({TenantId("vision")}), 12.0, id="one"),
        pytest.param(frozenset({TenantId("vision"), TenantId("nlp")}), 14.0, id="two"),
        pytest.param(frozenset({TenantId("ghost")}), 0.0, id="unknown"),
        pytest.param(None, 14.0, id="everyone"),
    ],
)
def test_the_filter_is_honoured_strictly(allowed: frozenset[TenantId] | None, total: float) -> None:
    report = compute_report(
        ledger(), [a_tenant("vision"), a_tenant("nlp")], a_query(*NOVEMBER, tenants=allowed)
    )
    assert report.total_gpu_hours == total
    if allowed is not None:
        assert {s.tenant for s in report.tenants} == set(allowed)


def test_an_organisation_in_the_filter_does_not_pull_in_its_teams() -> None:
    tenants = [a_tenant("research"), a_tenant("vision", parent="research")]
    ivs = [an_interval("2026-11-10T00:00", "2026-11-10T01:00").tenant("vision").build()]
    report = compute_report(ivs, tenants, a_query(*NOVEMBER, tenants=frozenset({TenantId("research")})))
    assert report.total_gpu_hours == 0.0
    assert [(s.tenant, s.gpu_hours, s.month_gpu_hours) for s in report.tenants] == [("research", 0.0, 0.0)]


# ---- quota share, budget, forecast


def test_quota_share_is_gpu_hours_over_guaranteed_gpu_hours_of_the_period() -> None:
    tenants = [
        a_tenant("vision", guaranteed={"A100": 8, "H100": 2}),  # 10 GPUs x 24 h = 240 GPU-hours
        a_tenant("nlp"),
    ]
    ivs = [
        an_interval("2026-11-10T00:00", "2026-11-10T12:00").tenant("vision").gpus(8).build(),  # 96
        an_interval("2026-11-10T00:00", "2026-11-10T06:00").tenant("vision").gpu("L4").gpus(4).build(),  # 24
        an_interval("2026-11-10T00:00", "2026-11-10T06:00").tenant("nlp").gpus(4).build(),
    ]
    report = compute_report(ivs, tenants, a_query("2026-11-10", "2026-11-11", "2026-11-20"))
    share = {s.tenant: s.quota_share for s in report.tenants}
    assert share == {"vision": pytest.approx(120.0 / 240.0), "nlp": None}


def test_quota_share_uses_the_period_up_to_now() -> None:
    tenants = [a_tenant("vision", guaranteed={"A100": 8})]
    ivs = [an_interval("2026-11-10T00:00", None).tenant("vision").gpus(8).build()]
    report = compute_report(ivs, tenants, a_query("2026-11-10", "2026-11-11", "2026-11-10T06:00"))
    assert report.tenants[0].quota_share == pytest.approx(1.0), (
        "8 of 8 guaranteed GPUs for the 6 hours so far"
    )


def org() -> list[TenantRecord]:
    return [
        a_tenant("research", guaranteed={"A100": 16}, budget_gpu_hours=5000.0),
        a_tenant("vision", parent="research", guaranteed={"A100": 8}, budget_gpu_hours=2000.0),
        a_tenant("speech", parent="vision", budget_gpu_hours=100.0),
        a_tenant("nlp", parent="research"),
    ]


def org_ledger() -> list[LedgerInterval]:
    return [
        # 8 GPUs since the 1st, still running on the 11th: 1,920 GPU-hours so far.
        an_interval("2026-11-01T00:00", None).tenant("vision").gpus(8).price(1.0).build(),
        # 1 GPU for 10 hours, last month: not this month's budget.
        an_interval("2026-10-20T00:00", "2026-10-20T10:00").tenant("vision").gpus(1).build(),
        an_interval("2026-11-10T00:00", "2026-11-10T10:00").tenant("speech").gpus(2).price(3.0).build(),
        an_interval("2026-11-10T00:00", "2026-11-10T05:00").tenant("nlp").gpus(4).build(),
    ]


def test_budgets_count_this_month_and_roll_up_the_tenant_tree() -> None:
    report = compute_report(org_ledger(), org(), a_query("2026-11-01", "2026-12-01", "2026-11-11"))
    by: dict[str, TenantSummary] = {s.tenant: s for s in report.tenants}
    assert by["speech"].month_gpu_hours == pytest.approx(20.0)
    assert by["vision"].month_gpu_hours == pytest.approx(1940.0), "vision counts its team speech"
    assert by["research"].month_gpu_hours == pytest.approx(1960.0), "the organisation counts every team"
    assert by["nlp"].month_gpu_hours == pytest.approx(20.0)
    assert by["vision"].budget_left_gpu_hours == pytest.approx(60.0)
    assert by["vision"].budget_spent_share == pytest.approx(0.97)
    assert by["speech"].budget_left_gpu_hours == pytest.approx(80.0)
    assert by["nlp"].budget_left_gpu_hours is None
    assert by["nlp"].budget_spent_share is None
    assert by["speech"].month_cost_usd == pytest.approx(60.0)


def test_budget_and_forecast_are_this_months_whatever_the_period() -> None:
    report = compute_report(org_ledger(), org(), a_query("2026-10-01", "2026-11-01", "2026-11-11"))
    vision = next(s for s in report.tenants if s.tenant == "vision")
    assert vision.gpu_hours == pytest.approx(10.0), "October's usage in October's report"
    assert vision.month_gpu_hours == pytest.approx(1940.0), "November's for the budget"


@pytest.mark.parametrize(
    ("basis", "forecast_vision", "forecast_nlp"),
    [
        # 10 of 30 days gone: month-to-date x 3.
        pytest.param(ForecastBasis.MONTH_TO_DATE, 1940.0 * 3, 20.0 * 3, id="month-to-date"),
        # Last 7 days: vision 8 GPUs x 168 h + speech 20 -> (1344 + 20) / 7 days x 20 days left.
        pytest.param(
            ForecastBasis.LAST_7_DAYS,
            1940.0 + (1344.0 + 20.0) / 7 * 20,
            20.0 + 20.0 / 7 * 20,
            id="last-7-days",
        ),
    ],
)
def test_the_forecast_extrapolates_to_the_end_of_the_month_at_the_chosen_rate(
    basis: ForecastBasis, forecast_vision: float, forecast_nlp: float
) -> None:
    report = compute_report(
        org_ledger(), org(), a_query("2026-11-01", "2026-12-01", "2026-11-11", forecast=basis)
    )
    by: dict[str, TenantSummary] = {s.tenant: s for s in report.tenants}
    assert by["vision"].forecast_month_gpu_hours == pytest.approx(forecast_vision)
    assert by["nlp"].forecast_month_gpu_hours == pytest.approx(forecast_nlp)
    assert by["nlp"].forecast_month_cost_usd == pytest.approx(2.0 * forecast_nlp)
    assert {s.forecast_basis for s in report.tenants} == {basis}


def test_the_forecast_at_the_start_of_a_month_is_zero_at_the_month_to_date_rate() -> None:
    ivs = [an_interval("2026-10-30T00:00", None).build()]
    report = compute_report(ivs, [], a_query("2026-10-01", "2026-11-01", "2026-11-01"))
    assert report.tenants[0].forecast_month_gpu_hours == 0.0


# ---- invariants over random ledgers


def naive_rows(
    ledger: list[LedgerInterval], query: ReportQuery
) -> dict[tuple[tuple[str, ...], float | None], float]:
    """Every interval walked over calendar buckets made with datetime, one at a time."""

    def bucket_of(at: datetime) -> tuple[datetime, datetime]:
        if query.bucket is Bucket.DAY:
            start = datetime(at.year, at.month, at.day, tzinfo=UTC)
            return start, start + timedelta(days=1)
        if query.bucket is Bucket.WEEK:
            start = datetime(at.year, at.month, at.day, tzinfo=UTC) - timedelta(days=at.weekday())
            return start, start + timedelta(days=7)
        start = datetime(at.year, at.month, 1, tzinfo=UTC)
        nxt = datetime(at.year + at.month // 12, at.month % 12 + 1, 1, tzinfo=UTC)
        return start, nxt

    out: dict[tuple[tuple[str, ...], float | None], float] = defaultdict(float)
    until = min(query.end_s, query.now_s)
    for iv in ledger:
        # By set: the interval's `job_set`; by sweep: its set where that is a sweep (issue 34).
        key = tuple(
            str(iv.job_set if iv.set_kind == "sweep" else "")
            if d is Dim.SWEEP
            else str(getattr(iv, "job_set" if d is Dim.SET else d.value))
            for d in query.group_by
        )
        a = max(iv.start_s, query.start_s)
        b = min(until, query.now_s if iv.end_s is None else iv.end_s)
        while a < b:
            if query.bucket is None:
                out[(key, None)] += iv.gpu_count * (b - a) / H
                break
            lo, hi = bucket_of(datetime.fromtimestamp(a, UTC))
            piece_end = min(b, hi.timestamp())
            out[(key, lo.timestamp())] += iv.gpu_count * (piece_end - a) / H
            a = piece_end
    return out


random_ledgers = st.lists(
    st.tuples(
        st.integers(0, 80 * 86400),
        st.one_of(st.none(), st.integers(0, 20 * 86400)),
        st.integers(1, 64),
        st.sampled_from(["vision", "nlp", "audio"]),
        st.sampled_from(["A100", "H100", "L4"]),
        st.sampled_from(list(CapacityKind)),
        st.sampled_from(["alice", "bob"]),
    ),
    max_size=40,
)


@settings(max_examples=examples(120), deadline=None)
@given(
    random_ledgers,
    st.sampled_from([None, Bucket.DAY, Bucket.WEEK, Bucket.MONTH]),
    st.lists(st.sampled_from(list(Dim)), min_size=1, max_size=3, unique=True),
    st.one_of(st.none(), st.frozensets(st.sampled_from(["vision", "nlp", "audio"]))),
    st.integers(0, 90 * 86400),
)
def test_any_grouping_adds_up_to_the_clipped_gpu_hours_of_every_visible_interval(
    raw: list[tuple[int, int | None, int, str, str, CapacityKind, str]],
    bucket: Bucket | None,
    dims: list[Dim],
    allowed: frozenset[str] | None,
    now_offset_s: int,
) -> None:
    base = t("2026-10-15")
    ivs = [
        an_interval("2026-10-15", None)
        .span_s(base + start, None if length is None else base + start + length)
        .job(f"j{i}")
        .gpus(gpus)
        .tenant(tenant)
        .gpu(gpu)
        .kind(kind)
        .user(user)
        .price(1.25 + i % 3)
        .build()
        for i, (start, length, gpus, tenant, gpu, kind, user) in enumerate(raw)
    ]
    query = ReportQuery(
        t("2026-11-01"),
        t("2026-12-22"),
        base + now_offset_s,
        tuple(dims),
        bucket,
        None if allowed is None else frozenset(TenantId(a) for a in allowed),
    )
    report = compute_report(ivs, [], query)
    visible = [iv for iv in ivs if allowed is None or iv.tenant in allowed]
    expected = sum(iv.gpu_hours(since_s=query.start_s, until_s=query.until_s) for iv in visible)
    cost = sum(iv.cost_usd(since_s=query.start_s, until_s=query.until_s) for iv in visible)
    assert report.total_gpu_hours == pytest.approx(expected, rel=1e-9, abs=1e-9)
    # Costs are whole micro-dollars per interval-day (federation.store.money): within half a
    # micro-dollar a piece of the float figure, at most 53 days of pieces per interval here.
    rounding_usd = 0.5e-6 * 53 * max(1, len(visible))
    assert report.total_cost_usd == pytest.approx(cost, rel=1e-9, abs=rounding_usd)
    assert sum(s.gpu_hours for s in report.tenants) == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert sum(h for _, h in report.gpu_hours_by_type) == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert sum(c for _, _, c in report.daily_cost_by_tenant) == pytest.approx(
        cost, rel=1e-9, abs=rounding_usd
    )
    naive = {k: v for k, v in naive_rows(visible, query).items() if v > 0}
    got = {(r.key, r.bucket_start_s): r.gpu_hours for r in report.rows}
    assert set(got) == set(naive)
    for k, v in naive.items():
        assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-9)
