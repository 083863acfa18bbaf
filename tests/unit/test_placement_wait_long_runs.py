"""The room test by the job's length (`PolicyConfig.private_wait_needs_start_max_run_h`, issue 35).

The world of tests/unit/test_placement_private_wait.py: a private node fully used by `r`, whose
run-time limit frees it only after `j`'s wait would end (80 minutes for its 8 GPU-hours). With the
room test, `j` bursts at once; a gang of more work than the length the test stops at waits anyway,
as the fixed wait does for the long jobs a spot bound keeps on demand.
"""

from __future__ import annotations

import pytest

from federation.errors import InvalidSpec
from federation.store.config_policy import parse_settings
from federation.store.records import settings_from_dict, settings_to_dict
from placement.plan import plan
from tests.unit.test_placement_private_wait import HOUR, MINUTE, NOW, big_job, outcome


@pytest.mark.parametrize(
    ("max_run_h", "expected"),
    [
        pytest.param(None, "admitted:cloud", id="no-length-every-gang-is-tested"),
        pytest.param(1.0, "admitted:cloud", id="as-long-as-the-length-is-tested"),
        pytest.param(0.5, "waiting_for_private_capacity", id="longer-waits-without-promise"),
    ],
)
def test_the_room_test_applies_only_up_to_its_length(max_run_h: float | None, expected: str) -> None:
    # `j` has an hour of work; the limits free its node only after 2 h, its wait ends after 80 min.
    snapshot = big_job().policy(private_wait_needs_start=True, private_wait_needs_start_max_run_h=max_run_h)
    snapshot = snapshot.running("r", cluster="onprem", nodes=[("p", 0, 8)], ends_at=NOW + 2 * HOUR)
    assert outcome(plan(snapshot.build(), now=NOW)) == expected


def test_a_long_gang_still_waits_no_longer_than_its_wait() -> None:
    snapshot = big_job().policy(private_wait_needs_start=True, private_wait_needs_start_max_run_h=0.5)
    snapshot = snapshot.running("r", cluster="onprem", nodes=[("p", 0, 8)], ends_at=NOW + 2 * HOUR)
    (waiting,) = plan(snapshot.build(), now=NOW).waiting
    assert waiting.reasons[-1].at_s == NOW + 80 * MINUTE
    # When its wait is over, it bursts.
    assert outcome(plan(snapshot.build(), now=NOW + 80 * MINUTE)) == "admitted:cloud"


def test_the_length_does_nothing_without_the_room_test() -> None:
    snapshot = big_job().policy(private_wait_needs_start=False, private_wait_needs_start_max_run_h=0.5)
    snapshot = snapshot.running("r", cluster="onprem", nodes=[("p", 0, 8)], ends_at=NOW + 2 * HOUR)
    assert outcome(plan(snapshot.build(), now=NOW)) == "waiting_for_private_capacity"


def test_the_length_is_a_config_key_and_survives_etcd() -> None:
    settings = parse_settings({"policy": {"privateWaitNeedsStartMaxRunHours": 24}})
    assert settings.policy.private_wait_needs_start_max_run_h == 24.0
    assert settings_from_dict(settings_to_dict(settings)).policy == settings.policy
    assert parse_settings({}).policy.private_wait_needs_start_max_run_h is None
    with pytest.raises(InvalidSpec, match="privateWaitNeedsStartMaxRunHours"):
        parse_settings({"policy": {"privateWaitNeedsStartMaxRunHours": -1}})
