"""The failover soak, small enough for CI: jobs offered to three `gpufed serve` processes on one etcd
while whichever leads is SIGKILLed three times (and started again); afterwards etcdctl and psql
recount every accepted job: in exactly one store, SUCCEEDED, one closed ledger interval per attempt,
no two attempts at once, and each attempt's pod created once as kubectl's watch saw it. The servers
run with their default leader lease.

The full-size run (200 jobs/s offered, 20 kills), with its figures, is `bench/soak_failover.py`."""

from __future__ import annotations

from pathlib import Path

import pytest

from federation.runtime.postgres_process import PostgresProcess
from tests.contract.kube.kubectl import KUBECTL
from tests.e2e.soak_failover import FailoverSoak, FailoverSoakPlan

pytestmark = pytest.mark.e2e

PLAN = FailoverSoakPlan(
    rate_per_s=40.0,
    kills=3,
    kill_gap_s=2.0,
    min_submit_s=4.0,
    # A few seconds of submissions: the kills come about 5 s apart (the 3 s lease and the gap), and
    # the backlog keeps the leaders busy after the last submission.
    max_jobs=240,
    clusters=2,
    nodes_per_cluster=4,
    retain_s=2.0,
    submit_threads=4,
    drain_timeout_s=120.0,
)


def test_leader_kills_under_load_lose_and_double_nothing(
    postgres_process: PostgresProcess, tmp_path: Path
) -> None:
    assert KUBECTL is not None, "kubectl is needed (make setup installs it in .venv/bin)"
    result = FailoverSoak(PLAN, tmp_path, postgres_process, "soak_failover_e2e", KUBECTL).run(log=print)
    print("\n".join(result.figures()))

    assert result.problems() == []
    assert len(result.takeovers) == PLAN.kills
    # Every job went through, from the stores' own account, and each kill hit a leader under load.
    assert len(result.accepted) == result.submitted > 0
    assert len(result.sql_jobs) + len(set(result.etcd_jobs) - set(result.sql_jobs)) == len(result.accepted)
    assert result.sql_jobs, "the archiver moved nothing to PostgreSQL"
    # Each takeover was a new server leading (no timing here: bench/soak_failover.py measures it).
    assert all(t.victim != t.successor for t in result.takeovers), result.takeovers
