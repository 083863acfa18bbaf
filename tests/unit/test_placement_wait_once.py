"""The room test judges a wait when it begins, not every cycle after (issue 35, seventh round:
`PolicyConfig.private_wait_needs_start_after_s`).

The world of tests/unit/test_placement_private_wait.py: `j` (8 GPU-hours, queued at NOW) may wait 80
minutes; the private node is fully used by `r`, whose run-time limit frees it only after 2 h, past
the wait's end. Judged by the room test, `j` bursts. Once `j` has spent the configured time of its
wait (its queue time counts, as the wait's own length does), the test no longer judges it: later
starts that push the limits' room past the wait's end no longer send it to the cloud after the hours
it has waited. A gang whose wait rests on the sunk internal rate alone is still judged every cycle.
"""

from __future__ import annotations

import pytest

from federation.errors import InvalidSpec
from federation.store.config_policy import parse_settings
from federation.store.records import settings_from_dict, settings_to_dict
from placement.model import CapacityKind, Snapshot
from placement.plan import plan
from tests.unit.placement_builders import a_cluster, a_gang, a_snapshot
from tests.unit.test_placement_private_wait import HOUR, MINUTE, NOW, big_job, outcome

WAITING = "waiting_for_private_capacity"


@pytest.mark.parametrize(
    ("after_s", "now", "expected"),
    [
        pytest.param(None, NOW + 45 * MINUTE, "admitted:cloud", id="rule-off-judged-every-cycle"),
        pytest.param(30 * MINUTE, NOW, "admitted:cloud", id="judged-when-its-wait-begins"),
        pytest.param(
            30 * MINUTE, NOW + 20 * MINUTE, "admitted:cloud", id="judged-before-it-has-waited-that-long"
        ),
        pytest.param(30 * MINUTE, NOW + 45 * MINUTE, WAITING, id="not-judged-after-it-has-waited-that-long"),
        pytest.param(30 * MINUTE, NOW + 80 * MINUTE, "admitted:cloud", id="bursts-when-its-wait-ends"),
    ],
)
def test_the_room_test_stops_judging_a_gang_that_has_waited(
    after_s: float | None, now: float, expected: str
) -> None:
    snapshot = big_job().policy(private_wait_needs_start=True, private_wait_needs_start_after_s=after_s)
    snapshot = snapshot.running("r", cluster="onprem", nodes=[("p", 0, 8)], ends_at=NOW + 2 * HOUR)
    assert outcome(plan(snapshot.build(), now=now)) == expected


def test_the_wait_still_ends_when_its_wait_says() -> None:
    snapshot = big_job().policy(private_wait_needs_start=True, private_wait_needs_start_after_s=30 * MINUTE)
    snapshot = snapshot.running("r", cluster="onprem", nodes=[("p", 0, 8)], ends_at=NOW + 2 * HOUR)
    (waiting,) = plan(snapshot.build(), now=NOW + 45 * MINUTE).waiting
    assert waiting.reasons[-1].at_s == NOW + 80 * MINUTE


def sunk_only_job(after_s: float | None, ends_at: float) -> Snapshot:
    """`j` where the cloud (0.5 USD a GPU-hour) is priced under the private internal rate (1.0): only
    the sunk rate makes its wait worth anything."""
    return (
        a_snapshot()
        .clusters(
            a_cluster("onprem").pool("A100", free=(0,), price=1.0, name="p"),
            a_cluster("cloud").provider_cloud().pool("A100", kind=CapacityKind.ON_DEMAND, nodes=4, price=0.5),
        )
        .policy(
            private_wait_s_per_gpu_hour=600.0,
            private_rate_sunk=True,
            private_wait_needs_start=True,
            private_wait_needs_start_after_s=after_s,
        )
        .queue(a_gang("j").gang(1, gpus=8).queued_at(NOW))
        .running("r", cluster="onprem", nodes=[("p", 0, 8)], ends_at=ends_at)
        .build()
    )


@pytest.mark.parametrize(
    ("ends_at", "expected"),
    [
        pytest.param(NOW + 60 * MINUTE, WAITING, id="room-within-its-wait-waits"),
        pytest.param(NOW + 2 * HOUR, "admitted:cloud", id="room-past-its-wait-bursts-though-it-has-waited"),
    ],
)
def test_a_wait_on_the_sunk_rate_alone_is_judged_every_cycle(ends_at: float, expected: str) -> None:
    assert outcome(plan(sunk_only_job(30 * MINUTE, ends_at), now=NOW + 45 * MINUTE)) == expected


def test_the_time_is_a_config_key_and_survives_etcd() -> None:
    settings = parse_settings({"policy": {"privateWaitNeedsStartAfterSeconds": 3600}})
    assert settings.policy.private_wait_needs_start_after_s == 3600.0
    assert settings_from_dict(settings_to_dict(settings)).policy == settings.policy
    assert parse_settings({}).policy.private_wait_needs_start_after_s is None
    with pytest.raises(InvalidSpec, match="privateWaitNeedsStartAfterSeconds"):
        parse_settings({"policy": {"privateWaitNeedsStartAfterSeconds": -1}})
