"""A wait for private GPUs priced against the cloud's whole bill (`PolicyConfig.private_rate_sunk`,
issue 35), and who such waits give way to.

The internal rate of private GPUs is paid whether they run or not. Priced against it, spot (here
$0.30 a GPU-hour against the private $1.00) is cheaper than waiting, so a gang that may use spot
never waited, and a week whose cloud bill was mostly spot gained nothing from the wait. With the
rate sunk, the wait saves the spot bill too, and such a gang waits as any other. But private GPUs
then go first to gangs that would otherwise pay on-demand prices: a gang whose wait only the sunk
rate justifies does not wait for a GPU type a dearer gang wants (one runs on demand in a cloud now,
or waited for it earlier in the cycle).

Every case: a private cluster `onprem` (one A100 node, fully used by `r` for 10 more minutes) and a
cloud with spot at $0.30 and on demand at $3.00. Job `s` (8 GPUs for an hour, allows spot) may wait
80 minutes at 600 s per GPU-hour.
"""

from __future__ import annotations

import pytest

from federation.errors import InvalidSpec
from federation.store.config_policy import parse_settings
from federation.store.records import settings_from_dict, settings_to_dict
from placement.model import CapacityKind, Plan, WaitCode
from placement.plan import plan
from tests.unit.placement_builders import GangBuilder, SnapshotBuilder, a_cluster, a_gang, a_snapshot

HOUR = 3600.0
MINUTE = 60.0
NOW = 10 * HOUR
SPOT, ON_DEMAND = CapacityKind.SPOT, CapacityKind.ON_DEMAND


def world(*, sunk: bool, frees_at: float = NOW + 10 * MINUTE, **policy: object) -> SnapshotBuilder:
    return (
        a_snapshot()
        .clusters(
            a_cluster("onprem").pool("A100", free=(0,), price=1.0, name="p"),
            a_cluster("cloud")
            .provider_cloud()
            .pool("A100", kind=SPOT, nodes=4, price=0.3)
            .pool("A100", kind=ON_DEMAND, nodes=4, price=3.0),
        )
        .policy(
            private_wait_s_per_gpu_hour=600.0,
            private_wait_needs_start=True,
            private_wait_reserve=True,
            prefer_private=True,
            private_rate_sunk=sunk,
            **policy,
        )
        .running("r", cluster="onprem", nodes=[("p", 0, 8)], ends_at=frees_at)
    )


def spot_job(job_id: str = "s", queued_at: float = NOW) -> GangBuilder:
    return a_gang(job_id).gang(1, gpus=8).runtime(limit_s=3600).queued_at(queued_at).allow_spot()


def outcomes(result: Plan) -> dict[str, str]:
    decided = {str(a.job_id): f"{a.cluster}:{a.kind.value}" for a in result.admissions}
    decided.update({str(w.job_id): w.reasons[-1].code.value for w in result.waiting})
    return decided


def test_priced_against_the_internal_rate_a_spot_gang_never_waits() -> None:
    result = plan(world(sunk=False).queue(spot_job()).build(), now=NOW)
    assert outcomes(result) == {"s": "cloud:spot"}


def test_with_the_rate_sunk_a_spot_gang_waits_for_private_room_and_says_what_it_saves() -> None:
    result = plan(world(sunk=True).queue(spot_job()).build(), now=NOW)
    assert outcomes(result) == {"s": WaitCode.WAITING_FOR_PRIVATE_CAPACITY.value}
    (waiting,) = result.waiting
    reason = waiting.reasons[-1]
    assert reason.at_s == NOW + 80 * MINUTE
    # The whole spot bill, 8 GPU-hours at $0.30 (spot's reclaim risk is 0 here): nothing is taken
    # off for the private run, whose rate is paid anyway.
    assert "saves an estimated $2.40 against bursting now to cloud (A100, spot)" in reason.message
    # Its room is not reserved: a dearer gang may still take it (the next test).
    assert result.reservations == ()


def test_the_room_test_still_applies_to_a_sunk_wait() -> None:
    # The running gang's limit frees the node only after the wait would end: no wait, spot at once.
    snapshot = world(sunk=True, frees_at=NOW + 2 * HOUR).queue(spot_job())
    assert outcomes(plan(snapshot.build(), now=NOW)) == {"s": "cloud:spot"}


def test_a_spot_gang_does_not_wait_for_a_type_gangs_run_on_demand_for() -> None:
    snapshot = world(sunk=True).running("od", cluster="cloud", gpus=8, kind=ON_DEMAND)
    assert outcomes(plan(snapshot.queue(spot_job()).build(), now=NOW)) == {"s": "cloud:spot"}
    # A spot gang running in the cloud is no such sign.
    snapshot = world(sunk=True).running("sp", cluster="cloud", gpus=8, kind=SPOT)
    assert outcomes(plan(snapshot.queue(spot_job()).build(), now=NOW)) == {
        "s": WaitCode.WAITING_FOR_PRIVATE_CAPACITY.value
    }


def test_a_spot_gang_gives_way_to_a_dearer_gang_waiting_earlier_in_the_cycle() -> None:
    # `d` may not use spot: its alternative is on demand at $3.00, and it waits (and reserves) first.
    dear = a_gang("d").gang(1, gpus=8).runtime(limit_s=3600).queued_at(NOW - MINUTE)
    result = plan(world(sunk=True).queue(dear, spot_job()).build(), now=NOW)
    assert outcomes(result) == {"d": WaitCode.WAITING_FOR_PRIVATE_CAPACITY.value, "s": "cloud:spot"}
    assert [r.job_id for r in result.reservations] == ["d"]


@pytest.mark.parametrize("sunk", [False, True])
def test_a_gang_with_an_on_demand_alternative_waits_either_way(sunk: bool) -> None:
    dear = a_gang("d").gang(1, gpus=8).runtime(limit_s=3600).queued_at(NOW)
    result = plan(world(sunk=sunk).queue(dear).build(), now=NOW)
    assert outcomes(result) == {"d": WaitCode.WAITING_FOR_PRIVATE_CAPACITY.value}
    # The saving it states: the on-demand bill ($24), less the private run at the internal rate ($8)
    # unless that rate is sunk.
    saving = "$24.00" if sunk else "$16.00"
    assert f"saves an estimated {saving} against bursting now" in result.waiting[0].reasons[-1].message


def test_the_rate_sunk_and_the_deadline_margin_are_config_keys_that_survive_etcd() -> None:
    settings = parse_settings({"policy": {"privateRateSunk": True, "privateWaitDeadlineMarginSeconds": 600}})
    assert settings.policy.private_rate_sunk is True
    assert settings.policy.private_wait_deadline_margin_s == 600.0
    assert settings_from_dict(settings_to_dict(settings)).policy == settings.policy
    defaults = parse_settings({}).policy
    assert (defaults.private_rate_sunk, defaults.private_wait_deadline_margin_s) == (False, 0.0)
    with pytest.raises(InvalidSpec, match="privateWaitDeadlineMarginSeconds"):
        parse_settings({"policy": {"privateWaitDeadlineMarginSeconds": -1}})
    with pytest.raises(InvalidSpec, match="privateRateSunk"):
        parse_settings({"policy": {"privateRateSunk": "sometimes"}})
