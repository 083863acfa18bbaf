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
from tests.e2e.soak import MiB, Soak, SoakPlan

pytestmark = pytest.mark.e2e

PLAN = SoakPlan(
    jobs=200,  # 5 s of submissions at the plan's pace; the kills land during them (see held_back)
    kills=2,
    rate_per_s=40.0,
    retain_s=1.0,
    compaction_s=2,
    clusters=2,
    nodes_per_cluster=4,
    submit_threads=3,
    drain_timeout_s=90.0,
    record_pods=True,
    sample_s=1.0,
    # What a takeover waits out after each kill: 2 s rather than the servers' 5.
    lease_ttl_s=2,
    # Each kill as soon as the last one's successor has archived, rather than on a schedule that
    # must allow for a loaded machine: the run waits on conditions, not on a clock.
    kill_gap_s=0.0,
    # And the last 40 jobs wait for the kills, trickling in meanwhile (20 s of them): on a machine so
    # loaded that the kills come late, jobs are still being submitted and archived when they do (at
    # a load average of 16 a server took 30 s to start, and the second kill came 30 s in).
    held_back=40,
)


def test_leader_kills_during_archiving_lose_and_double_nothing_and_etcd_stays_bounded(
    postgres_process: PostgresProcess, tmp_path: Path
) -> None:
    # The run's timeline (servers up, submitted, drained) goes to the captured output, which pytest
    # shows when the test fails.
    result = Soak(PLAN, tmp_path, postgres_process, "soak_e2e").run(log=print)
    print(f"kills: {result.kills}")

    assert result.problems() == []
    # `problems` judges etcd's size only after the bound's warm-up, which this short run ends
    # before; so every sample here, against the same bound. etcd's file never shrinks (bbolt reuses
    # freed pages, it does not give them back), so its size at the end is the run's largest.
    assert result.samples, "etcd was never sampled"
    assert result.db_max_bytes <= PLAN.bound_bytes, (
        f"etcd db {result.db_max_bytes / MiB:.1f} MiB over the bound {PLAN.bound_bytes / MiB:.1f} MiB"
    )
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
