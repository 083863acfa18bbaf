"""The private-wait knobs reach the placer from the federation config, and are kept in etcd by name."""

from __future__ import annotations

import pytest

from federation.errors import InvalidSpec
from federation.store.config_policy import parse_settings
from federation.store.records import settings_from_dict, settings_to_dict


def test_the_config_turns_the_room_rules_of_the_private_wait_on() -> None:
    settings = parse_settings(
        {
            "policy": {
                "privateWaitSecondsPerGpuHour": 600,
                "privateWaitMaxSeconds": 86400,
                "privateWaitNeedsStart": True,
                "privateWaitReserve": True,
            }
        }
    )
    policy = settings.policy
    assert (policy.private_wait_s_per_gpu_hour, policy.private_wait_max_s) == (600, 86400)
    assert (policy.private_wait_needs_start, policy.private_wait_reserve) == (True, True)
    assert settings_from_dict(settings_to_dict(settings)).policy == policy


def test_the_room_rules_are_off_unless_asked_for() -> None:
    policy = parse_settings({"policy": {"privateWaitSecondsPerGpuHour": 600}}).policy
    assert (policy.private_wait_needs_start, policy.private_wait_reserve) == (False, False)


def test_a_room_rule_must_be_a_boolean() -> None:
    with pytest.raises(InvalidSpec, match=r"policy\.privateWaitReserve"):
        parse_settings({"policy": {"privateWaitReserve": "yes"}})


def test_the_config_sets_how_many_waiting_jobs_are_reserved() -> None:
    settings = parse_settings({"policy": {"privateWaitReserve": True, "privateWaitReservations": 4}})
    assert settings.policy.private_wait_reservations == 4
    assert settings_from_dict(settings_to_dict(settings)).policy == settings.policy
    assert parse_settings({"policy": {}}).policy.private_wait_reservations == 1


@pytest.mark.parametrize("value", [0, "two", 1.5])
def test_the_number_of_reservations_is_a_positive_whole_number(value: object) -> None:
    with pytest.raises(InvalidSpec, match=r"policy\.privateWaitReservations"):
        parse_settings({"policy": {"privateWaitReservations": value}})


def test_the_config_turns_moves_back_to_private_gpus_on_and_they_survive_etcd() -> None:
    settings = parse_settings(
        {"policy": {"repatriate": True, "repatriateMinSavingUsd": 100, "moveOverheadSeconds": 600}}
    )
    policy = settings.policy
    assert (policy.repatriate, policy.repatriate_min_saving_usd, policy.move_overhead_s) == (True, 100, 600)
    assert settings_from_dict(settings_to_dict(settings)).policy == policy
    assert parse_settings({"policy": {}}).policy.repatriate is False


@pytest.mark.parametrize(
    ("key", "value"), [("repatriate", "yes"), ("repatriateMinSavingUsd", -1), ("moveOverheadSeconds", "15m")]
)
def test_a_bad_move_setting_is_refused_naming_it(key: str, value: object) -> None:
    with pytest.raises(InvalidSpec, match=rf"policy\.{key}"):
        parse_settings({"policy": {key: value}})
