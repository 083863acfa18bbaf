"""The savings report's arithmetic (issue 35) and finance by set and sweep (issue 34): what an attempt
paid against bursting at once, with negative and no-offer attempts, a preempted attempt run again,
a job across a period's edge, a tenant's view, and the renderings finance reads."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace

import pytest

from federation.ledger.report import ReportQuery, compute_report
from federation.ledger.report.query import Bucket, utc_s
from federation.ledger.report.savings import (
    SavingsDim,
    SavingsQuery,
    attempt_saving,
    attempt_savings_text,
    compute_savings,
)
from federation.ledger.report.savings_render import (
    render_savings_csv,
    render_savings_html,
    render_savings_json,
    render_savings_table,
)
from federation.store.intervals import IntervalEnd, LedgerInterval, SetKind
from federation.store.jobs import BurstOffer
from placement.model import CapacityKind, ClusterName, GpuType, JobId, TenantId

H = 3600.0
NOV = utc_s("2026-11-01")
DEC = utc_s("2026-12-01")
NOW = DEC + 10 * 86400.0


def offer(price: float, seen_at_s: float, attempt: int = 1) -> BurstOffer:
    return BurstOffer(
        cluster=ClusterName("aws-us-east-1"),
        gpu_type=GpuType("A100"),
        kind=CapacityKind.ON_DEMAND,
        usd_per_gpu_hour=price,
        seen_at_s=seen_at_s,
        attempt=attempt,
    )


def attempt(
    job: str,
    *,
    start_s: float,
    hours: float | None,
    kind: CapacityKind = CapacityKind.PRIVATE,
    price: float = 1.0,
    gpus: int = 2,
    tenant: str = "vision",
    gpu_type: str = "A100",
    burst: BurstOffer | None = None,
    n: int = 1,
    job_set: str = "",
    set_kind: str = "",
) -> LedgerInterval:
    return LedgerInterval(
        job_id=JobId(job),
        attempt=n,
        tenant=TenantId(tenant),
        user="ann",
        cluster=ClusterName("onprem" if kind is CapacityKind.PRIVATE else "aws-us-east-1"),
        provider="onprem" if kind is CapacityKind.PRIVATE else "aws",
        region="eu",
        gpu_type=GpuType(gpu_type),
        gpu_count=gpus,
        kind=kind,
        start_s=start_s,
        end_s=None if hours is None else start_s + hours * H,
        usd_per_gpu_hour=price,
        ended=None if hours is None else IntervalEnd.FINISHED,
        job_name=job,
        job_set=job_set,
        set_kind=set_kind,
        burst_offer=burst,
    )


T0 = NOV + 5 * 86400.0 + 8 * H  # 2026-11-06 08:00 UTC


def test_a_private_attempt_saves_the_offer_price_times_its_gpu_hours_for_its_wait() -> None:
    iv = attempt("j", start_s=T0, hours=3, burst=offer(4.0, T0 - 1800.0))
    s = attempt_saving(iv, until_s=NOW)
    assert (s.paid_micro, s.burst_micro, s.saved_micro) == (0, 24_000_000, 24_000_000)
    # Private GPUs at their internal rate are shown apart: not cloud spend.
    assert s.private_micro == 6_000_000
    assert s.extra_wait_s == 1800.0
    assert s.gpu_seconds == 2 * 3 * H


def test_an_attempt_that_ran_on_dearer_public_capacity_anyway_saves_a_negative_amount() -> None:
    iv = attempt("j", start_s=T0, hours=3, kind=CapacityKind.ON_DEMAND, price=5.0, burst=offer(4.0, T0 - 600))
    s = attempt_saving(iv, until_s=NOW)
    assert (s.paid_micro, s.burst_micro, s.saved_micro) == (30_000_000, 24_000_000, -6_000_000)
    assert s.extra_wait_s == 600.0


def test_an_attempt_with_nothing_to_burst_to_saves_nothing_and_is_counted_as_such() -> None:
    iv = attempt("j", start_s=T0, hours=2, kind=CapacityKind.SPOT, price=1.5)
    report = compute_savings([iv], SavingsQuery(start_s=NOV, end_s=DEC, now_s=NOW))
    (row,) = report.rows
    assert (row.paid_micro, row.burst_micro, row.saved_micro) == (6_000_000, 6_000_000, 0)
    assert (row.attempts, row.attempts_no_offer, row.extra_wait_s) == (1, 1, 0.0)
    assert row.saved_share == 0.0


def test_a_start_before_the_offer_was_seen_never_counts_as_negative_waiting() -> None:
    iv = attempt("j", start_s=T0, hours=1, burst=offer(4.0, T0 + 5.0))
    assert attempt_saving(iv, until_s=NOW).extra_wait_s == 0.0


def test_a_preempted_attempt_and_its_rerun_each_count_with_their_own_offer_and_wait() -> None:
    first = replace(
        attempt("j", start_s=T0, hours=1, burst=offer(4.0, T0 - H, attempt=1)), ended=IntervalEnd.PREEMPTED
    )
    # Requeued: the placer first saw attempt 2 at T0 + 1h and the public offer was dearer then.
    second = attempt("j", start_s=T0 + 3 * H, hours=2, burst=offer(6.0, T0 + H, attempt=2), n=2)
    report = compute_savings([first, second], SavingsQuery(start_s=NOV, end_s=DEC, now_s=NOW))
    (row,) = report.rows
    assert row.attempts == 2
    assert row.burst_micro == 2 * 1 * 4_000_000 + 2 * 2 * 6_000_000
    assert row.saved_micro == row.burst_micro
    assert row.extra_wait_s == H + 2 * H
    assert row.gpu_hours == 2 * 3


def test_a_job_across_a_period_edge_splits_its_hours_and_counts_its_wait_where_it_started() -> None:
    start = DEC - 2 * H  # 2026-11-30 22:00, waited an hour before it
    iv = attempt("j", start_s=start, hours=4, burst=offer(4.0, start - H))
    nov = compute_savings([iv], SavingsQuery(start_s=NOV, end_s=DEC, now_s=NOW)).total
    dec = compute_savings([iv], SavingsQuery(start_s=DEC, end_s=DEC + 31 * 86400.0, now_s=NOW)).total
    assert (nov.gpu_hours, nov.burst_micro, nov.extra_wait_s) == (4.0, 16_000_000, H)
    assert (dec.gpu_hours, dec.burst_micro, dec.extra_wait_s) == (4.0, 16_000_000, 0.0)
    whole = attempt_saving(iv, until_s=NOW)
    assert nov.burst_micro + dec.burst_micro == whole.burst_micro
    assert nov.extra_wait_s + dec.extra_wait_s == whole.extra_wait_s
    # Both months count the attempt: it held GPUs in each.
    assert (nov.attempts, dec.attempts) == (1, 1)


def test_buckets_split_at_midnight_and_the_wait_goes_to_the_starting_day() -> None:
    start = NOV + 23 * H
    iv = attempt("j", start_s=start, hours=2, burst=offer(3.0, start - 1200))
    q = SavingsQuery(start_s=NOV, end_s=DEC, now_s=NOW, group_by=(SavingsDim.TENANT,), bucket=Bucket.DAY)
    day1, day2 = compute_savings([iv], q).rows
    assert (day1.bucket_start_s, day1.gpu_hours, day1.extra_wait_s) == (NOV, 2.0, 1200.0)
    assert (day2.bucket_start_s, day2.gpu_hours, day2.extra_wait_s) == (NOV + 86400.0, 2.0, 0.0)


def test_a_running_attempt_counts_up_to_now() -> None:
    now = T0 + 2 * H
    iv = attempt("j", start_s=T0, hours=None, burst=offer(4.0, T0))
    total = compute_savings([iv], SavingsQuery(start_s=NOV, end_s=DEC, now_s=now)).total
    assert (total.gpu_hours, total.burst_micro) == (4.0, 16_000_000)


def test_paid_equals_the_usage_reports_cost_to_the_micro_dollar_with_cloud_prices() -> None:
    ivs = [
        attempt(f"j{i}", start_s=T0 + i * 977.3, hours=1.37 + i, kind=kind, price=price, gpus=1 + i % 3)
        for i, (kind, price) in enumerate(
            [(CapacityKind.ON_DEMAND, 2.49), (CapacityKind.SPOT, 1.10), (CapacityKind.ON_DEMAND, 3.33)] * 4
        )
    ]
    savings = compute_savings(ivs, SavingsQuery(start_s=NOV, end_s=DEC, now_s=NOW)).total
    usage = compute_report(ivs, [], ReportQuery(start_s=NOV, end_s=DEC, now_s=NOW))
    assert savings.paid_micro == round(usage.total_cost_usd * 1_000_000)
    assert savings.gpu_hours == pytest.approx(usage.total_gpu_hours, rel=1e-12)


def test_a_tenant_filter_leaves_no_figure_of_another_tenant() -> None:
    mine = attempt("a", start_s=T0, hours=1, burst=offer(4.0, T0 - H))
    theirs = attempt("b", start_s=T0, hours=5, burst=offer(9.0, T0 - 9 * H), tenant="nlp")
    q = SavingsQuery(start_s=NOV, end_s=DEC, now_s=NOW, tenants=frozenset({TenantId("vision")}))
    report = compute_savings([mine, theirs], q)
    assert [r.keys[0] for r in report.rows] == ["vision"]
    assert report.total.burst_micro == 8_000_000
    assert report.total.extra_wait_s == H
    assert "nlp" not in render_savings_json(report) + render_savings_csv(report) + render_savings_html(report)


def test_grouped_by_set_and_by_sweep() -> None:
    ivs = [
        attempt(
            "t1", start_s=T0, hours=1, burst=offer(4.0, T0 - H), job_set="lr", set_kind=SetKind.SWEEP.value
        ),
        attempt("t2", start_s=T0, hours=2, burst=offer(4.0, T0), job_set="lr", set_kind=SetKind.SWEEP.value),
        attempt("s1", start_s=T0, hours=1, job_set="shards", set_kind=SetKind.ARRAY.value),
        attempt("alone", start_s=T0, hours=1),
    ]
    by_set = compute_savings(ivs, SavingsQuery(start_s=NOV, end_s=DEC, now_s=NOW, group_by=(SavingsDim.SET,)))
    # By set is by tenant and set (set names are per tenant, issue 34).
    assert {r.keys: (r.attempts, r.gpu_hours) for r in by_set.rows} == {
        ("vision", ""): (1, 2.0),
        ("vision", "lr"): (2, 6.0),
        ("vision", "shards"): (1, 2.0),
    }
    by_sweep = compute_savings(
        ivs, SavingsQuery(start_s=NOV, end_s=DEC, now_s=NOW, group_by=(SavingsDim.SWEEP,))
    )
    assert {r.keys: r.attempts for r in by_sweep.rows} == {("vision", ""): 2, ("vision", "lr"): 2}
    rows = list(csv.DictReader(io.StringIO(render_savings_csv(by_sweep))))
    assert [(r["sweep"], r["burst_usd"]) for r in rows] == [("-", "0.000000"), ("lr", "24.000000")]


def test_csv_json_table_and_html_carry_every_column() -> None:
    ivs = [
        attempt("j", start_s=T0, hours=3, burst=offer(4.0, T0 - 1800.0)),
        attempt(
            "k",
            start_s=T0,
            hours=3,
            kind=CapacityKind.ON_DEMAND,
            price=5.0,
            burst=offer(4.0, T0),
            gpu_type="H100",
        ),
    ]
    report = compute_savings(ivs, SavingsQuery(start_s=NOV, end_s=DEC, now_s=NOW))
    rows = list(csv.DictReader(io.StringIO(render_savings_csv(report))))
    assert rows[0] == {
        "tenant": "vision",
        "gpu_type": "A100",
        "attempts": "1",
        "attempts_no_offer": "0",
        "gpu_hours": "6.000000",
        "paid_usd": "0.000000",
        "burst_usd": "24.000000",
        "saved_usd": "24.000000",
        "saved_share": "1.000000",
        "extra_wait_hours": "0.500000",
        "private_usd": "6.000000",
    }
    assert rows[1]["saved_usd"] == "-6.000000"
    assert rows[1]["gpu_type"] == "H100"
    data = json.loads(render_savings_json(report))
    assert data["total"]["saved_usd"] == 18.0
    assert data["total"]["extra_wait_hours"] == 0.5
    assert data["rows"][1]["saved_share"] == -0.25
    table = render_savings_table(report)
    assert "-6.00" in table
    assert "24.00" in table
    assert table.splitlines()[-1].startswith("total")
    html = render_savings_html(report)
    assert '<table class="savings">' in html
    assert 'id="saved">$18.00<' in html
    assert "<script" not in html
    assert "http" not in html.replace('xmlns="http', "")


def test_describe_says_what_an_ended_attempt_paid_against_bursting_at_once() -> None:
    private = attempt("j", start_s=T0, hours=3, burst=offer(4.1, T0 - 1800.0))
    assert attempt_savings_text(private) == (
        "paid $0.00 in cloud (private GPUs, $6.00 at the internal rate); bursting at once to "
        "aws-us-east-1 at $4.10/GPU-hour would have cost $24.60 (saved $24.60, waited +30m)"
    )
    dearer = attempt("k", start_s=T0, hours=3, kind=CapacityKind.ON_DEMAND, price=5.0, burst=offer(4.0, T0))
    assert attempt_savings_text(dearer).endswith("would have cost $24.00 (saved -$6.00, waited +0m)")
    assert attempt_savings_text(attempt("n", start_s=T0, hours=1, kind=CapacityKind.SPOT, price=2.0)) == (
        "paid $4.00; no public offer was recorded for it (nothing to burst to): no saving counted"
    )
    assert attempt_savings_text(attempt("r", start_s=T0, hours=None, burst=offer(4.0, T0))) == ""


def test_the_store_and_the_sweeps_name_the_sweep_variable_alike() -> None:
    from federation.jobsets.sweeps import SWEEP_ENV as JOBSETS_SWEEP_ENV
    from federation.store.intervals import SWEEP_ENV

    assert SWEEP_ENV == JOBSETS_SWEEP_ENV


def test_the_reports_sums_equal_each_attempts_own_figures_for_any_bucket() -> None:
    import random

    rng = random.Random(5)
    ivs = []
    for i in range(300):
        start = NOV - 86400.0 + rng.uniform(0, 33 * 86400.0)
        kind = rng.choice(list(CapacityKind))
        burst = (
            None if rng.random() < 0.3 else offer(round(rng.uniform(1, 9), 2), start - rng.uniform(-60, 7200))
        )
        hours = None if rng.random() < 0.05 else rng.uniform(0.01, 60)
        ivs.append(
            attempt(
                f"j{i}",
                start_s=start,
                hours=hours,
                kind=kind,
                price=round(rng.uniform(0.5, 7), 2),
                burst=burst,
            )
        )
    for bucket in (None, Bucket.DAY, Bucket.WEEK, Bucket.MONTH):
        q = SavingsQuery(start_s=NOV, end_s=DEC, now_s=DEC - 3600.0, bucket=bucket)
        total = compute_savings(ivs, q).total
        parts = [attempt_saving(iv, since_s=NOV, until_s=q.until_s) for iv in ivs]
        counted = [p for p in parts if p.gpu_seconds > 0]
        assert total.paid_micro == sum(p.paid_micro for p in parts)
        assert total.burst_micro == sum(p.burst_micro for p in parts)
        assert total.private_micro == sum(p.private_micro for p in parts)
        assert total.extra_wait_s == pytest.approx(sum(p.extra_wait_s for p in parts), rel=1e-12)
        assert total.attempts == len(counted)
        assert total.attempts_no_offer == sum(p.offer is None for p in counted)


def test_the_savings_report_refuses_a_grouping_it_does_not_know() -> None:
    from click.testing import CliRunner

    from federation.cli.main import cli

    # (The usage report groups by set and sweep itself since issue 34: tests/unit/test_report_by_set_cli.py.)
    bad = CliRunner().invoke(cli, ["--server", "127.0.0.1:1", "report", "savings", "--by", "provider"])
    assert bad.exit_code == 2
    assert "unknown grouping provider" in bad.output
