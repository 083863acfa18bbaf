"""Idle cost of provisioned node pools: provisioned GPU-time the ledger's intervals did not use."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.ledger.report import (
    ProvisionedInterval,
    compute_report,
    idle_by_cluster,
    idle_cost,
    render_html,
    render_json,
    render_table,
)
from federation.store.intervals import LedgerInterval
from placement.model import CapacityKind, TenantId
from tests.properties import examples
from tests.unit.test_report_query import NOVEMBER, a_query, an_interval, t


def a_pool(
    start: str,
    end: str | None,
    *,
    gpus: int = 16,
    pool: str = "a100-burst",
    cluster: str = "onprem",
    gpu: str = "A100",
    price: float = 2.0,
    kind: CapacityKind = CapacityKind.ON_DEMAND,
) -> ProvisionedInterval:
    return ProvisionedInterval(
        cluster, pool, gpu, gpus, price, t(start), None if end is None else t(end), kind
    )


def used(
    start: str, end: str | None, gpus: int, *, gpu: str = "A100", cluster: str = "onprem"
) -> LedgerInterval:
    return an_interval(start, end).gpus(gpus).gpu(gpu).cluster(cluster).build()


DAY10 = "2026-11-10T"


@pytest.mark.parametrize(
    ("pools", "ledger", "expected"),
    [
        pytest.param([a_pool(DAY10 + "00:00", DAY10 + "10:00")], [], [(160.0, 0.0, 160.0)], id="nothing-ran"),
        pytest.param(
            [a_pool(DAY10 + "00:00", DAY10 + "10:00")],
            [used(DAY10 + "00:00", DAY10 + "10:00", 16)],
            [(160.0, 160.0, 0.0)],
            id="fully-used",
        ),
        pytest.param(
            [a_pool(DAY10 + "00:00", DAY10 + "10:00")],
            [used(DAY10 + "02:00", DAY10 + "04:00", 8), used(DAY10 + "09:00", DAY10 + "12:00", 8)],
            [(160.0, 24.0, 136.0)],
            id="partly-used-clipped-to-the-pool",
        ),
        pytest.param(
            [a_pool(DAY10 + "00:00", DAY10 + "10:00")],
            [used(DAY10 + "00:00", DAY10 + "10:00", 32)],
            [(160.0, 160.0, 0.0)],
            id="more-used-than-provisioned-is-never-negative",
        ),
        pytest.param(
            [a_pool(DAY10 + "00:00", DAY10 + "02:00", gpus=4)],
            [used(DAY10 + "00:00", DAY10 + "01:00", 8)],
            [(8.0, 4.0, 4.0)],
            id="a-busy-hour-does-not-cancel-an-idle-one",
        ),
        pytest.param(
            [a_pool(DAY10 + "00:00", DAY10 + "10:00")],
            [
                used(DAY10 + "00:00", DAY10 + "10:00", 8, gpu="H100"),
                used(DAY10 + "00:00", DAY10 + "10:00", 8, cluster="aws-1"),
            ],
            [(160.0, 0.0, 160.0)],
            id="other-types-and-clusters-do-not-count",
        ),
        pytest.param(
            [
                a_pool(DAY10 + "00:00", DAY10 + "10:00", gpus=12, pool="a"),
                a_pool(DAY10 + "00:00", DAY10 + "10:00", gpus=4, pool="b"),
            ],
            [used(DAY10 + "00:00", DAY10 + "10:00", 8)],
            [(120.0, 60.0, 60.0), (40.0, 20.0, 20.0)],
            id="two-pools-share-the-use-by-size",
        ),
        pytest.param(
            [
                a_pool(DAY10 + "00:00", DAY10 + "02:00", gpus=8),
                a_pool(DAY10 + "04:00", DAY10 + "06:00", gpus=16),
            ],
            [used(DAY10 + "00:00", DAY10 + "06:00", 8)],
            [(48.0, 32.0, 16.0)],
            id="a-pool-scaled-down-and-up-sums",
        ),
        pytest.param(
            [a_pool("2026-11-29T20:00", None)],
            [],
            [(16.0 * 4, 0.0, 16.0 * 4)],
            id="still-provisioned-counts-to-the-end-asked",
        ),
        pytest.param([a_pool("2026-10-01T00:00", "2026-10-02T00:00")], [], [], id="outside-the-period"),
    ],
)
def test_idle_gpu_hours_per_pool(
    pools: list[ProvisionedInterval], ledger: list[LedgerInterval], expected: list[tuple[float, float, float]]
) -> None:
    got = idle_cost(pools, ledger, start_s=t("2026-11-01"), end_s=t("2026-11-30T00:00"))
    assert [(c.provisioned_gpu_hours, c.used_gpu_hours, c.idle_gpu_hours) for c in got] == [
        pytest.approx(e) for e in expected
    ]
    for c in got:
        assert c.idle_cost_usd == pytest.approx(2.0 * c.idle_gpu_hours)
        assert c.provisioned_cost_usd == pytest.approx(2.0 * c.provisioned_gpu_hours)


def test_idle_is_summed_per_pool_and_per_cluster_at_each_pools_price() -> None:
    pools = [
        a_pool(DAY10 + "00:00", DAY10 + "10:00", gpus=8, pool="a100", price=2.0),
        a_pool(
            DAY10 + "00:00",
            DAY10 + "10:00",
            gpus=8,
            pool="h100",
            gpu="H100",
            price=6.0,
            kind=CapacityKind.SPOT,
        ),
        a_pool(DAY10 + "00:00", DAY10 + "01:00", gpus=4, pool="l4", cluster="aws-1", gpu="L4", price=1.0),
    ]
    ledger = [used(DAY10 + "00:00", DAY10 + "05:00", 8, gpu="H100")]
    pool_costs = idle_cost(pools, ledger, start_s=t("2026-11-01"), end_s=t("2026-12-01"))
    assert [(c.cluster, c.pool, c.kind, c.idle_gpu_hours, c.idle_cost_usd) for c in pool_costs] == [
        ("aws-1", "l4", CapacityKind.ON_DEMAND, 4.0, 4.0),
        ("onprem", "a100", CapacityKind.ON_DEMAND, 80.0, 160.0),
        ("onprem", "h100", CapacityKind.SPOT, 40.0, 240.0),
    ]
    clusters = idle_by_cluster(pool_costs)
    assert [(c.cluster, c.provisioned_gpu_hours, c.idle_gpu_hours, c.idle_cost_usd) for c in clusters] == [
        ("aws-1", 4.0, 4.0, 4.0),
        ("onprem", 160.0, 120.0, 400.0),
    ]


def test_the_report_shows_idle_cost_to_finance_and_none_to_a_member() -> None:
    pools = [a_pool(DAY10 + "00:00", DAY10 + "10:00", pool="burst-pool-7")]
    ledger = [used(DAY10 + "00:00", DAY10 + "05:00", 8)]
    everyone = compute_report(ledger, [], a_query(*NOVEMBER), provisioned=pools)
    assert [(c.pool, c.idle_gpu_hours) for c in everyone.idle] == [("burst-pool-7", 120.0)]
    for text in (render_table(everyone), render_json(everyone), render_html(everyone)):
        assert "burst-pool-7" in text
    member = compute_report(
        ledger, [], a_query(*NOVEMBER, tenants=frozenset({TenantId("vision")})), provisioned=pools
    )
    assert member.idle == ()
    for text in (render_table(member), render_json(member), render_html(member)):
        assert "burst-pool-7" not in text


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 48), st.integers(1, 24), st.integers(1, 16), st.sampled_from("ab")),
        max_size=5,
    ),
    st.lists(st.tuples(st.integers(0, 48), st.integers(1, 24), st.integers(1, 16)), max_size=8),
)
def test_idle_plus_used_is_what_was_provisioned_and_idle_is_at_least_provisioned_minus_all_use(
    pools_raw: list[tuple[int, int, int, str]], used_raw: list[tuple[int, int, int]]
) -> None:
    base = t("2026-11-10")
    pools = [
        ProvisionedInterval("c", name, "A100", gpus, 1.0, base + a * 3600.0, base + (a + n) * 3600.0)
        for a, n, gpus, name in pools_raw
    ]
    ledger = [
        an_interval("2026-11-10", None).span_s(base + a * 3600.0, base + (a + n) * 3600.0).gpus(gpus).build()
        for a, n, gpus in used_raw
    ]
    got = idle_cost(pools, ledger, start_s=base, end_s=base + 72 * 3600.0)
    provisioned = sum(p.gpu_count * (p.end_s - p.start_s) / 3600.0 for p in pools if p.end_s is not None)
    used_total = sum(iv.gpu_hours(until_s=base + 72 * 3600.0) for iv in ledger)
    assert sum(c.provisioned_gpu_hours for c in got) == pytest.approx(provisioned)
    for c in got:
        assert c.idle_gpu_hours >= -1e-9
        assert c.idle_gpu_hours + c.used_gpu_hours == pytest.approx(c.provisioned_gpu_hours)
    assert sum(c.idle_gpu_hours for c in got) >= provisioned - used_total - 1e-6
