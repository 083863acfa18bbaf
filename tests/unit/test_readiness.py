"""`/readyz`'s verdict (federation.runtime.readiness.judge): every way a server is not yet serving."""

from __future__ import annotations

from dataclasses import replace

import pytest

from federation.runtime.readiness import ReadinessInputs, judge

SERVING_LEADER = ReadinessInputs(
    grpc_serving=True,
    jobs_listed=True,
    ledger_listed=True,
    leading=True,
    first_pass_done=True,
    leader_elsewhere=None,
)


def test_a_leader_past_its_first_pass_is_ready() -> None:
    verdict = judge(SERVING_LEADER)
    assert verdict.ready
    assert verdict.why == "leader, first pass done"


def test_a_leader_before_its_first_pass_is_not_ready() -> None:
    # The caches are listed and gRPC answers, but nothing has been scheduled or reconciled yet.
    verdict = judge(replace(SERVING_LEADER, first_pass_done=False))
    assert not verdict.ready
    assert verdict.why == "leader, first pass not done"


@pytest.mark.parametrize(
    ("inputs", "why"),
    [
        (replace(SERVING_LEADER, grpc_serving=False), "gRPC port not serving yet"),
        (replace(SERVING_LEADER, jobs_listed=False), "job cache not listed"),
        (replace(SERVING_LEADER, ledger_listed=False), "ledger cache not listed"),
    ],
)
def test_unlisted_caches_or_a_closed_port_are_not_ready_even_for_a_leader(
    inputs: ReadinessInputs, why: str
) -> None:
    verdict = judge(inputs)
    assert not verdict.ready
    assert verdict.why == why


def test_a_standby_is_ready_while_another_server_leads() -> None:
    verdict = judge(replace(SERVING_LEADER, leading=False, first_pass_done=False, leader_elsewhere="srv-b"))
    assert verdict.ready
    assert verdict.why == "standby, leader srv-b"


def test_a_server_that_sees_no_leader_is_not_ready() -> None:
    verdict = judge(replace(SERVING_LEADER, leading=False, first_pass_done=False, leader_elsewhere=None))
    assert not verdict.ready
    assert verdict.why == "no leader yet"


def test_a_standby_with_unlisted_caches_is_not_ready() -> None:
    inputs = replace(SERVING_LEADER, leading=False, jobs_listed=False, leader_elsewhere="srv-b")
    assert not judge(inputs).ready
