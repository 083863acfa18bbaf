"""Server roles (federation.runtime.role) and what `/readyz` says of an `api` server
(federation.runtime.readiness.judge): it is ready once its caches are listed, with or without a
leader, because it never leads and its reads need none."""

from __future__ import annotations

from dataclasses import replace

import pytest

from federation.runtime.readiness import ReadinessInputs, judge
from federation.runtime.role import ServerRole

API_LISTED = ReadinessInputs(
    grpc_serving=True,
    jobs_listed=True,
    ledger_listed=True,
    leading=False,
    first_pass_done=False,
    leader_elsewhere=None,
    api_only=True,
)


@pytest.mark.parametrize(
    ("role", "stands", "controllers"),
    [(ServerRole.ALL, True, True), (ServerRole.SCHEDULER, True, True), (ServerRole.API, False, False)],
    ids=lambda v: str(v),
)
def test_only_the_api_role_stays_out_of_the_election_and_the_controllers(
    role: ServerRole, stands: bool, controllers: bool
) -> None:
    assert role.stands_for_leader is stands
    assert role.runs_controllers is controllers


@pytest.mark.parametrize(
    ("leader", "why"),
    [(None, "api, no leader: submissions wait for one"), ("sched-0", "api, leader sched-0")],
    ids=["no-leader", "leader-elsewhere"],
)
def test_an_api_server_is_ready_with_or_without_a_leader(leader: str | None, why: str) -> None:
    verdict = judge(replace(API_LISTED, leader_elsewhere=leader))
    assert verdict.ready
    assert verdict.why == why


@pytest.mark.parametrize(
    ("inputs", "why"),
    [
        (replace(API_LISTED, grpc_serving=False), "gRPC port not serving yet"),
        (replace(API_LISTED, jobs_listed=False), "job cache not listed"),
        (replace(API_LISTED, ledger_listed=False), "ledger cache not listed"),
    ],
)
def test_an_api_server_with_unlisted_caches_is_not_ready(inputs: ReadinessInputs, why: str) -> None:
    verdict = judge(inputs)
    assert not verdict.ready
    assert verdict.why == why
