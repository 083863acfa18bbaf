"""Choice among clusters that fit: expected cost (speed, spot risk, egress, staging delay), waiting for
private capacity (Starburst rule), deadlines."""

from __future__ import annotations

import pytest

from placement.cost import CostModel
from placement.inventory import price_factor
from placement.model import CapacityKind, EgressRate, GpuType, Plan, PolicyConfig, WaitCode
from placement.plan import plan
from tests.unit.placement_builders import GangBuilder, SnapshotBuilder, a_cluster, a_gang, a_snapshot

ON_DEMAND, SPOT = CapacityKind.ON_DEMAND, CapacityKind.SPOT
HOUR = 3600.0
NOW = 10 * HOUR
TB = 10**12


def placed(result: Plan) -> dict[str, tuple[str, str]]:
    return {a.job_id: (a.cluster, a.gpu_type) for a in result.admissions}


CHOICE_CASES = [
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("H100", price=4.0).pool("A100", price=2.5))
        .speeds(H100=2.0, A100=1.0)
        .queue(a_gang("j").any_of("A100", "H100")),
        ("c1", "H100"),
        id="faster-type-priced-by-work-done",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("c1").pool("H100", price=4.0).pool("A100", price=2.5))
        .speeds(H100=2.0, A100=1.0)
        .queue(a_gang("j").any_of("A100", "H100").speeds(H100=1.5)),
        ("c1", "A100"),
        id="job-speeds-override-the-snapshots",
    ),
    pytest.param(
        a_snapshot()
        .clusters(
            a_cluster("od").provider_cloud().pool("A100", kind=ON_DEMAND, price=1.2),
            a_cluster("spot").provider_cloud().pool("A100", kind=SPOT, price=1.0, risk=0.5),
        )
        .queue(a_gang("j").allow_spot()),
        ("od", "A100"),
        id="risky-spot-costs-more-than-on-demand",
    ),
    pytest.param(
        a_snapshot()
        .clusters(
            a_cluster("od").provider_cloud().pool("A100", kind=ON_DEMAND, price=1.2),
            a_cluster("spot").provider_cloud().pool("A100", kind=SPOT, price=1.0, risk=0.1),
        )
        .queue(a_gang("j").allow_spot()),
        ("spot", "A100"),
        id="safe-spot-is-cheaper",
    ),
    pytest.param(
        a_snapshot()
        .clusters(
            a_cluster("near").pool("A100", price=1.1).store("s1"), a_cluster("far").pool("A100").store("s2")
        )
        .egress("s1", "s2", 0.09)
        .queue(a_gang("j").dataset(TB, "s1")),
        ("near", "A100"),
        id="egress-of-a-moved-dataset-counts",
    ),
    pytest.param(
        a_snapshot()
        .clusters(
            a_cluster("near").pool("A100", price=1.1).store("s1"), a_cluster("far").pool("A100").store("s2")
        )
        .egress("s1", "s2", 0.0)
        .queue(a_gang("j").dataset(TB, "s1")),
        ("far", "A100"),
        id="free-egress-leaves-price-to-decide",
    ),
    pytest.param(
        a_snapshot()
        .clusters(
            a_cluster("near").pool("A100", price=1.1).store("s1"), a_cluster("far").pool("A100").store("s2")
        )
        .egress("s1", "s2", 0.0)
        .policy(wait_value_usd_per_hour=100.0, transfer_bytes_per_s=1e9)
        .queue(a_gang("j").dataset(TB, "s1")),
        ("near", "A100"),
        id="time-spent-moving-the-dataset-has-a-value",
    ),
    pytest.param(
        a_snapshot()
        .clusters(a_cluster("cheap").pool("A100", price=1.0), a_cluster("fast").pool("H100", price=3.0))
        .speeds(H100=2.0)
        .queue(a_gang("j").any_of("A100", "H100").runtime(expected_s=2 * HOUR).deadline(NOW + 1.5 * HOUR)),
        ("fast", "H100"),
        id="deadline-takes-the-cheapest-option-that-meets-it",
    ),
]


@pytest.mark.parametrize(("snapshot", "expected"), CHOICE_CASES)
def test_cheapest_expected_cost(snapshot: SnapshotBuilder, expected: tuple[str, str]) -> None:
    assert placed(plan(snapshot.build(), now=NOW)) == {"j": expected}


def test_no_option_meets_the_deadline() -> None:
    snapshot = (
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100"))
        .queue(a_gang("j").runtime(expected_s=2 * HOUR).deadline(NOW + HOUR))
    )
    (waiting,) = plan(snapshot.build(), now=NOW).waiting
    assert [r.code for r in waiting.reasons] == [WaitCode.DEADLINE_UNMEETABLE]
    assert waiting.reasons[0].at_s == NOW + 2 * HOUR


def test_expected_cost_is_reported_with_the_admission() -> None:
    snapshot = (
        a_snapshot()
        .clusters(a_cluster("c1").pool("A100", nodes=2, price=2.0).store("s2"))
        .egress("s1", "s2", 0.05)
        .queue(a_gang("j").gang(2).runtime(expected_s=3 * HOUR).dataset(100 * 10**9, "s1"))
    )
    (admission,) = plan(snapshot.build(), now=NOW).admissions
    # 16 GPUs x 3 h x $2 + 100 GB x $0.05
    assert admission.expected_cost_usd == pytest.approx(96.0 + 5.0)


# -- waiting for private capacity (Starburst): private is full now, cloud fits now.
def hybrid(wait_s_per_gpu_hour: float, wait_value: float = 0.0) -> SnapshotBuilder:
    return (
        a_snapshot()
        .clusters(
            a_cluster("onprem").pool("A100", free=(0, 0, 0, 0), price=1.0),
            a_cluster("cloud").provider_cloud().pool("A100", kind=ON_DEMAND, nodes=4, price=3.0),
        )
        .policy(private_wait_s_per_gpu_hour=wait_s_per_gpu_hour, wait_value_usd_per_hour=wait_value)
    )


STARBURST_CASES = [
    pytest.param(0.0, a_gang("j").gang(4), 0.0, "admitted", id="waiting-off-goes-to-cloud-at-once"),
    # 32 GPU-hours x 60 s = 32 min of waiting allowed.
    pytest.param(60.0, a_gang("j").gang(4), 20 * 60.0, "waiting_for_private_capacity", id="big-job-waits"),
    pytest.param(60.0, a_gang("j").gang(4), 40 * 60.0, "admitted", id="big-job-waited-enough"),
    # 1 GPU-hour x 60 s = 1 min.
    pytest.param(
        60.0, a_gang("j").gang(1, gpus=1), 20 * 60.0, "admitted", id="small-job-goes-to-cloud-sooner"
    ),
    pytest.param(
        60.0, a_gang("j").gang(4).deadline(NOW + HOUR), 0.0, "admitted", id="deadline-leaves-no-time-to-wait"
    ),
]


@pytest.mark.parametrize(("wait", "gang", "waited_s", "expected"), STARBURST_CASES)
def test_waiting_for_private_capacity(wait: float, gang: GangBuilder, waited_s: float, expected: str) -> None:
    snapshot = hybrid(wait).queue(gang.queued_at(NOW - waited_s)).build()
    result = plan(snapshot, now=NOW)
    got = "admitted" if result.admissions else result.waiting[0].reasons[-1].code.value
    assert got == expected
    if result.admissions:
        assert result.admissions[0].cluster == "cloud"


def test_the_value_of_waiting_bounds_the_wait() -> None:
    """Cloud costs $64 more; at $1,000 an hour of waiting that is worth under 4 minutes."""
    snapshot = hybrid(60.0, wait_value=1000.0).queue(a_gang("j").gang(4).queued_at(NOW - 5 * 60)).build()
    assert [a.cluster for a in plan(snapshot, now=NOW).admissions] == ["cloud"]


def test_private_capacity_free_now_is_used_before_cloud() -> None:
    snapshot = (
        hybrid(0.0).clusters(a_cluster("onprem2").pool("A100", nodes=4, price=1.0)).queue(a_gang("j").gang(4))
    )
    assert [a.cluster for a in plan(snapshot.build(), now=NOW).admissions] == ["onprem2"]


@pytest.mark.parametrize(
    ("kind", "risk", "expected"),
    [
        pytest.param(CapacityKind.PRIVATE, 0.5, 2.0, id="risk-ignored-off-spot"),
        pytest.param(SPOT, 0.0, 2.0, id="riskless-spot"),
        pytest.param(SPOT, 0.2, 2.0 * 1.1, id="spot-pays-lost-work"),
    ],
)
def test_spot_restart_risk_penalty(kind: CapacityKind, risk: float, expected: float) -> None:
    assert price_factor(kind, 2.0, risk, PolicyConfig(spot_lost_work_h=0.5)) == pytest.approx(expected)


def test_cost_model_uses_the_dearer_of_duplicate_egress_rates() -> None:
    model = CostModel({}, (EgressRate("a", "b", 0.01), EgressRate("a", "b", 0.02)), PolicyConfig())
    gang = a_gang("j").dataset(10**9, "a").build()
    assert model.egress_usd(gang, "b") == pytest.approx(0.02)
    assert model.egress_usd(gang, "a") == 0.0
    assert model.speed(gang, GpuType("A100")) == 1.0


@pytest.mark.parametrize(
    ("deadline", "until"),
    [
        pytest.param(None, NOW + 17 * 60, id="compute-weighted-wait"),
        pytest.param(NOW + HOUR + 10 * 60, NOW + 10 * 60, id="cut-short-to-still-meet-the-deadline"),
    ],
)
def test_how_long_a_job_waits_for_private_capacity(deadline: float | None, until: float) -> None:
    gang = a_gang("j").gang(4).queued_at(NOW - 15 * 60)
    if deadline is not None:
        gang = gang.deadline(deadline)
    (waiting,) = plan(hybrid(60.0).queue(gang).build(), now=NOW).waiting
    reason = waiting.reasons[-1]
    assert (reason.code, reason.cluster, reason.at_s) == (
        WaitCode.WAITING_FOR_PRIVATE_CAPACITY,
        "onprem",
        until,
    )
