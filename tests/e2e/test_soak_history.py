"""The history soak, small enough for CI: jobs through two servers with the archiver on and the
leader SIGKILLed during archiving; afterwards PostgreSQL plus etcd hold every accepted job and one
ledger interval per attempt that ran (the pods the clusters ran are the judge), none twice, every
kept log tail moved to SQL and none left in etcd, and etcd's database stayed under its stated flat
bound while its compacted revision advanced.

The full-size run, with the figures, is `bench/soak_history.py`."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from federation.runtime.postgres_process import PostgresProcess
from tests.e2e.soak import Soak, SoakPlan

pytestmark = pytest.mark.e2e

PLAN = SoakPlan(
    jobs=300,  # 20 s of submissions: both kills land while jobs are still being archived
    kills=2,
    rate_per_s=15.0,
    retain_s=2.0,
    compaction_s=2,
    clusters=2,
    nodes_per_cluster=4,
    submit_threads=3,
    drain_timeout_s=90.0,
    record_pods=True,
    sample_s=1.0,
)


def test_leader_kills_during_archiving_lose_and_double_nothing_and_etcd_stays_bounded(
    postgres_process: PostgresProcess, tmp_path: Path
) -> None:
    result = Soak(PLAN, tmp_path, postgres_process, "soak_e2e").run(log=lambda _: None)

    assert result.problems() == []
    # The totals are what the submissions imply, whatever the kills did: one job and one interval
    # (one attempt, nothing requeued by a takeover) per submission, all archived, none left in etcd.
    assert result.totals() == {"jobs": PLAN.jobs, "intervals": PLAN.jobs, "succeeded": PLAN.jobs}
    assert result.etcd_jobs == set()
    assert result.etcd_intervals == []
    # Kept logs left etcd with their jobs (never a key of an archived job in any sample: `problems`),
    # and are in SQL: one tail per job's one replica.
    assert result.etcd_logs_keys == []
    assert all(s.archived_logs_keys == 0 for s in result.samples)
    assert result.sql_tails == PLAN.jobs
    # Each kill hit a leader while the archiver had work (jobs in SQL and still in etcd), and the next
    # leader went on archiving: SQL grew from kill to kill.
    assert all(k.sql_jobs > 0 and k.etcd_jobs > 0 for k in result.kills), result.kills
    assert all(a.sql_jobs < b.sql_jobs for a, b in itertools.pairwise(result.kills)), result.kills
