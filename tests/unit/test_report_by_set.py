"""Usage reports by job set and by sweep (issue 34): the arithmetic, two tenants' sets of one name,
etcd's intervals mixed with archived ones (SQLite and PostgreSQL), and money to the micro-dollar.

A set's name is its tenant's own, so a report by set or sweep is by tenant too (the query adds the
tenant when the grouping lacks it): two tenants' sets called `lr` are two rows, never one. A job
submitted alone has no set (`-` when rendered); a job that is no sweep's trial has no sweep.

The ledger is `test_report_sql_equality`'s, priced at what clouds charge ($2.49 and the like, none a
binary fraction: `test_finance_exact_money`'s prices) and with jobs put into sets of every kind,
`lr` in two tenants. The same ledger is reported in memory (all of it, as etcd holds it before the
archiver runs) and through the API's path with most of it archived: the reports must be equal with
==, and their CSV and JSON byte for byte.
"""

from __future__ import annotations

import csv
import functools
import io
import itertools
import random
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace

import pytest

from federation.history.sql_store import SqlHistoryStore
from federation.ledger.job_cost import interval_micro_usd
from federation.ledger.report import Bucket, Dim, ReportQuery, compute_report, render_csv, render_json
from federation.ledger.report.query import with_set_tenant
from federation.ledger.report.savings import SavingsDim, SavingsQuery, compute_savings
from federation.store.intervals import LedgerInterval, SetKind
from federation.store.money import MICRO_PER_USD
from placement.model import TenantId
from tests.history_builders import BACKENDS, fresh_dsn
from tests.unit.test_finance_exact_money import PRICES
from tests.unit.test_report_sql_equality import DAY, NOW, PERIODS, TENANTS, _both_ways, _ledger, _stored

Ledger = tuple[SqlHistoryStore, list[LedgerInterval], list[LedgerInterval]]

# Job number modulo 10 -> (set, kind): `lr` is a set name in several tenants (a sweep in one, an
# array in another, whatever tenant the job drew); 4 of 10 jobs are submitted alone.
SETS = {
    0: ("lr", SetKind.SWEEP),
    1: ("lr", SetKind.SWEEP),
    2: ("eval-shards", SetKind.ARRAY),
    3: ("eval-shards", SetKind.ARRAY),
    4: ("pipeline", SetKind.SET),
    5: ("lr", SetKind.ARRAY),
}


def _in_set(iv: LedgerInterval, rng: random.Random) -> LedgerInterval:
    priced = replace(iv, usd_per_gpu_hour=rng.choice(PRICES))
    found = SETS.get(int(iv.job_id[1:]) % 10)
    if found is None:
        return priced
    name, kind = found
    return replace(priced, job_set=name, set_kind=kind.value)


@functools.cache
def _set_ledger() -> tuple[list[LedgerInterval], list[LedgerInterval]]:
    closed, opened = _ledger(seed=34)
    rng = random.Random(34)
    return [_in_set(iv, rng) for iv in closed], [_in_set(iv, rng) for iv in opened]


@pytest.fixture(scope="module", params=BACKENDS)
def archived(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    closed, opened = _set_ledger()
    dsn = fresh_dsn(str(request.param), tmp_path_factory.mktemp("by-set"), request)
    yield from _stored(closed, opened, dsn)


def test_a_grouping_by_set_or_sweep_gains_the_tenant_before_it() -> None:
    assert with_set_tenant((Dim.SET,)) == (Dim.TENANT, Dim.SET)
    assert with_set_tenant((Dim.GPU_TYPE, Dim.SWEEP)) == (Dim.GPU_TYPE, Dim.TENANT, Dim.SWEEP)
    assert with_set_tenant((Dim.SET, Dim.TENANT)) == (Dim.SET, Dim.TENANT)
    assert with_set_tenant((Dim.USER,)) == (Dim.USER,)
    query = ReportQuery(start_s=0.0, end_s=1.0, now_s=1.0, group_by=(Dim.SWEEP,))
    assert query.group_by == (Dim.TENANT, Dim.SWEEP)


def test_each_sets_row_is_the_sum_of_its_jobs_intervals_and_the_total_is_the_ungrouped_one() -> None:
    closed, opened = _set_ledger()
    everything = closed + opened
    start, end = NOW - 70 * DAY, NOW
    by_set = compute_report(
        everything, TENANTS, ReportQuery(start_s=start, end_s=end, now_s=NOW, group_by=(Dim.SET,))
    )
    plain = compute_report(everything, TENANTS, ReportQuery(start_s=start, end_s=end, now_s=NOW))
    # Per (tenant, set): GPU-seconds and whole micro-dollars of its intervals, one by one.
    seconds: dict[tuple[str, ...], float] = defaultdict(float)
    micro: dict[tuple[str, ...], int] = defaultdict(int)
    count: dict[tuple[str, ...], int] = defaultdict(int)
    for iv in everything:
        if iv.start_s >= NOW:
            continue  # a retry begun after now (the ledger's last minute) has nothing yet
        key: tuple[str, ...] = (iv.tenant, iv.job_set)
        seconds[key] += iv.gpu_hours(until_s=NOW) * 3600.0
        micro[key] += interval_micro_usd(iv, now_s=NOW)
        count[key] += 1
    got = {r.key: r for r in by_set.rows}
    assert set(got) == set(seconds)
    for key, row in got.items():
        assert row.gpu_hours * 3600.0 == pytest.approx(seconds[key], rel=1e-12), key
        # Money is whole micro-dollars: exact, not approximately.
        assert round(row.cost_usd * MICRO_PER_USD) == micro[key], key
        assert row.intervals == count[key], key
    assert by_set.total_cost_usd == plain.total_cost_usd
    assert by_set.total_gpu_hours == pytest.approx(plain.total_gpu_hours, rel=1e-12)
    assert sum(r.intervals for r in by_set.rows) == sum(r.intervals for r in plain.rows)


def test_two_tenants_sets_of_one_name_are_two_rows_and_a_member_sees_only_its_own() -> None:
    closed, opened = _set_ledger()
    everything = closed + opened
    tenants_with_lr = {iv.tenant for iv in everything if iv.job_set == "lr"}
    assert len(tenants_with_lr) >= 2, "the ledger must hold `lr` in two tenants"
    start, end = NOW - 70 * DAY, NOW
    report = compute_report(
        everything, TENANTS, ReportQuery(start_s=start, end_s=end, now_s=NOW, group_by=(Dim.SET,))
    )
    assert {r.key for r in report.rows if r.key[1] == "lr"} == {(t, "lr") for t in tenants_with_lr}
    for member in tenants_with_lr:
        mine = compute_report(
            everything,
            TENANTS,
            ReportQuery(
                start_s=start, end_s=end, now_s=NOW, group_by=(Dim.SET,), tenants=frozenset({member})
            ),
        )
        assert {r.key[0] for r in mine.rows} == {member}
        # Its `lr` row is its own jobs' only: the same figures as in finance's report.
        (own,) = [r for r in mine.rows if r.key == (member, "lr")]
        assert own == next(r for r in report.rows if r.key == (member, "lr"))
        rendered = render_csv(mine)
        for other in tenants_with_lr - {member}:
            assert other not in rendered


def test_by_sweep_only_a_sweeps_trials_have_one() -> None:
    closed, opened = _set_ledger()
    everything = closed + opened
    start, end = NOW - 70 * DAY, NOW
    query = ReportQuery(start_s=start, end_s=end, now_s=NOW, group_by=(Dim.SWEEP,))
    report = compute_report(everything, TENANTS, query)
    sweeps = {iv.tenant for iv in everything if iv.set_kind == SetKind.SWEEP.value}
    assert {r.key for r in report.rows if r.key[1]} == {(t, "lr") for t in sweeps}
    # An array called `lr` is no sweep: its hours are under "no sweep" with the jobs submitted alone.
    arrays = [iv for iv in everything if iv.job_set == "lr" and iv.set_kind == SetKind.ARRAY.value]
    assert arrays
    for tenant in {iv.tenant for iv in arrays}:
        no_sweep = next(r for r in report.rows if r.key == (tenant, ""))
        assert no_sweep.intervals == sum(
            1 for iv in everything if iv.tenant == tenant and iv.set_kind != "sweep"
        )
    rows = list(csv.DictReader(io.StringIO(render_csv(report))))
    assert list(rows[0]) == ["tenant", "sweep", "gpu_hours", "cost_usd", "intervals"]
    assert {r["sweep"] for r in rows} == {"lr", "-"}


SET_GROUPINGS: list[tuple[Dim, ...]] = [
    (Dim.SET,),
    (Dim.SWEEP,),
    (Dim.TENANT, Dim.SET, Dim.GPU_TYPE),
    (Dim.SET, Dim.SWEEP, Dim.USER),
]


@pytest.mark.parametrize("group_by", SET_GROUPINGS, ids=lambda g: "+".join(d.value for d in g))
def test_archived_and_live_intervals_by_set_read_as_all_live_ones(
    archived: Ledger, group_by: tuple[Dim, ...]
) -> None:
    store, everything, live = archived
    assert len(live) < len(everything) / 3, "most of the ledger must be summed in SQL"
    compared = 0
    for bucket, (_, start, end), tenants in itertools.product(
        [None, Bucket.DAY, Bucket.WEEK, Bucket.MONTH],
        PERIODS,
        [None, frozenset({TenantId("nlp")})],
    ):
        query = ReportQuery(
            start_s=start, end_s=end, now_s=NOW, group_by=group_by, bucket=bucket, tenants=tenants
        )
        expected, got = _both_ways(store, everything, live, query)
        assert got == expected, (group_by, bucket, start, tenants)
        assert expected.rows, "every query here has usage to compare"
        compared += 1
    assert compared == 4 * 3 * 2


def test_by_set_renders_the_same_before_and_after_archiving_with_the_ungrouped_total(
    archived: Ledger,
) -> None:
    store, everything, live = archived
    _, start, end = PERIODS[2]
    query = ReportQuery(start_s=start, end_s=end, now_s=NOW, group_by=(Dim.SET,), bucket=Bucket.WEEK)
    expected, got = _both_ways(store, everything, live, query)
    assert render_csv(got) == render_csv(expected)
    assert render_json(got) == render_json(expected)
    _, plain = _both_ways(store, everything, live, ReportQuery(start_s=start, end_s=end, now_s=NOW))
    assert got.total_cost_usd == plain.total_cost_usd
    rows = list(csv.DictReader(io.StringIO(render_csv(got))))
    assert list(rows[0]) == ["tenant", "set", "week", "gpu_hours", "cost_usd", "intervals"]
    assert {r["set"] for r in rows} == {"lr", "eval-shards", "pipeline", "-"}


def test_the_savings_report_by_set_keeps_two_tenants_sets_of_one_name_apart_too() -> None:
    closed, opened = _set_ledger()
    everything = closed + opened
    query = SavingsQuery(start_s=NOW - 70 * DAY, end_s=NOW, now_s=NOW, group_by=(SavingsDim.SET,))
    assert query.group_by == (SavingsDim.TENANT, SavingsDim.SET)
    report = compute_savings(everything, query)
    lr = {r.keys for r in report.rows if r.keys[1] == "lr"}
    assert lr == {(t, "lr") for t in {iv.tenant for iv in everything if iv.job_set == "lr"}}
    assert len(lr) >= 2
