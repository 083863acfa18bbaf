"""The job index's cheaper put (issue 33): a write that keeps where a job is filed replaces only its
record, a phase change moves the job between its two phase views, and anything else (a new job,
another tenant or list key, which no writer makes today) files it afresh. Held here to a brute
reference over every view, count and order, through random writes and removals of all kinds."""

from __future__ import annotations

import random
from dataclasses import replace

from federation.store.job_cache_index import JobIndex, list_key
from federation.store.job_store import Stored
from federation.store.jobs import JobRecord
from placement.model import JobId, JobPhase, TenantId
from tests.conftest import build_job

TENANTS = [TenantId("vision"), TenantId("nlp"), TenantId("audio")]
PHASES = list(JobPhase)


def _reference(
    jobs: dict[JobId, Stored[JobRecord]], tenant: TenantId | None, phases: list[JobPhase]
) -> list[Stored[JobRecord]]:
    chosen = [
        s
        for s in jobs.values()
        if (tenant is None or s.value.tenant == tenant) and (not phases or s.value.phase in phases)
    ]
    return sorted(chosen, key=lambda s: list_key(s.value))


def _check(index: JobIndex, jobs: dict[JobId, Stored[JobRecord]]) -> None:
    assert len(index) == len(jobs)
    for tenant in [None, *TENANTS]:
        for phases in [[], [JobPhase.QUEUED], [JobPhase.ADMITTED, JobPhase.RUNNING]]:
            want = _reference(jobs, tenant, phases)
            got = list(index.ordered(tenant, phases))
            # The very records held now (identity), not an earlier version of a job.
            assert [id(s) for s in got] == [id(s) for s in want], (tenant, phases)
            back = list(index.ordered(tenant, phases, newest_first=True))
            assert [id(s) for s in back] == [id(s) for s in reversed(want)]
        for phase in PHASES:
            assert index.count(tenant, phase) == len(_reference(jobs, tenant, [phase]))


def _job(rng: random.Random, i: int) -> JobRecord:
    return replace(
        build_job(f"j{i:04d}", tenant=rng.choice(TENANTS)),
        phase=rng.choice(PHASES),
        submitted_at_s=float(rng.randint(0, 30)),
    )


def test_every_kind_of_write_keeps_the_views_equal_to_a_walk_of_every_job() -> None:
    rng = random.Random(33)
    index = JobIndex()
    jobs: dict[JobId, Stored[JobRecord]] = {}
    revision = 0
    for step in range(3_000):
        revision += 1
        roll = rng.random()
        if not jobs or roll < 0.2:
            job = _job(rng, rng.randint(0, 400))
        else:
            was = rng.choice(list(jobs.values())).value
            if roll < 0.5:
                job = replace(was, attempt=was.attempt + 1)  # filed where it was
            elif roll < 0.8:
                job = replace(was, phase=rng.choice(PHASES))  # a phase change, or the same phase
            elif roll < 0.87:
                job = replace(was, tenant=rng.choice(TENANTS))
            elif roll < 0.92:
                job = replace(was, submitted_at_s=float(rng.randint(0, 30)))
            else:
                index.remove(was.job_id)
                del jobs[was.job_id]
                continue
        stored = Stored(job, revision)
        index.put(stored)
        jobs[job.job_id] = stored
        if step % 150 == 0:
            _check(index, jobs)
    _check(index, jobs)


def test_a_job_written_again_where_it_was_filed_is_read_as_its_new_record() -> None:
    index = JobIndex()
    job = build_job("a", tenant="vision")
    index.put(Stored(job, 1))
    newer = Stored(replace(job, attempt=2), 2)
    index.put(newer)
    for tenant in [None, TenantId("vision")]:
        for phases in [[], [JobPhase.QUEUED]]:
            assert list(index.ordered(tenant, phases)) == [newer]
    assert index.count(TenantId("vision"), JobPhase.QUEUED) == 1


def test_views_a_phase_change_empties_are_dropped_and_come_back() -> None:
    index = JobIndex()
    job = build_job("a", tenant="vision")
    index.put(Stored(job, 1))
    index.put(Stored(replace(job, phase=JobPhase.RUNNING), 2))
    assert index.count(None, JobPhase.QUEUED) == 0
    assert index.count(TenantId("vision"), JobPhase.QUEUED) == 0
    assert JobPhase.QUEUED not in index._by_phase
    assert (TenantId("vision"), JobPhase.QUEUED) not in index._by_tenant_phase
    index.put(Stored(job, 3))
    assert [s.mod_revision for s in index.ordered(TenantId("vision"), [JobPhase.QUEUED])] == [3]
    assert index.count(None, JobPhase.RUNNING) == 0
    index.remove(job.job_id)
    assert not index._by_phase
    assert not index._by_tenant
    assert not index._by_tenant_phase


def test_keys_past_the_end_and_between_land_in_order_across_chunks() -> None:
    # New jobs mostly sort last (appended without bisection), some land between others.
    index = JobIndex()
    rng = random.Random(5)
    jobs: dict[JobId, Stored[JobRecord]] = {}
    for i in range(5_000):
        at = float(i) if rng.random() < 0.8 else float(rng.randint(0, i))
        job = replace(build_job(f"k{i:05d}", tenant="vision"), submitted_at_s=at)
        stored = Stored(job, i + 1)
        index.put(stored)
        jobs[job.job_id] = stored
    _check(index, jobs)
