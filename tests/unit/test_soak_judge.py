"""The soak's judge (`tests/e2e/soak.py`, `SoakResult.problems`): each broken invariant is named, so
the soak cannot pass over a lost job, a doubled job or interval, an etcd over its bound, kept logs
of archived jobs left in etcd, or an etcd that never compacted."""

from __future__ import annotations

import dataclasses

import pytest

from tests.e2e.soak import Kill, MiB, Sample, SoakPlan, SoakResult

PLAN = SoakPlan(jobs=2, kills=1, rate_per_s=1.0, retain_s=1.0, compaction_s=1)


def _sound() -> SoakResult:
    late = PLAN.warmup_s + 1
    return SoakResult(
        plan=PLAN,
        accepted={"k0": "j0", "k1": "j1"},
        samples=[Sample(1.0, MiB, MiB, 10, 5, 2, 0), Sample(late, MiB, MiB, 20, 15, 0, 4)],
        kills=[Kill(5.0, "a-1", 1, 1)],
        sql_jobs={"j0": "SUCCEEDED", "j1": "SUCCEEDED"},
        sql_intervals=[("i0", "j0", 1), ("i1", "j1", 1)],
        sql_tails=2,
        ran={("j0", 1), ("j1", 1)},
    )


def test_a_sound_soak_has_no_problems() -> None:
    assert _sound().problems() == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        pytest.param({"sql_jobs": {"j0": "SUCCEEDED"}}, "in neither store", id="lost-job"),
        pytest.param({"etcd_jobs": {"j1"}}, "doubled", id="job-in-both-stores"),
        pytest.param(
            {"sql_jobs": {"j0": "SUCCEEDED", "j1": "SUCCEEDED", "j9": "SUCCEEDED"}}, "doubled", id="extra-job"
        ),
        pytest.param({"etcd_intervals": [("j1", 1)]}, "charged twice", id="interval-in-both-stores"),
        pytest.param(
            {"sql_intervals": [("i0", "j0", 1)], "ran": {("j0", 1)}},
            "without a ledger interval",
            id="uncharged",
        ),
        pytest.param(
            {"ran": {("j0", 1), ("j1", 1), ("j1", 2)}}, "disagree", id="pods-ran-an-uncharged-attempt"
        ),
        pytest.param(
            {"sql_jobs": {"j0": "SUCCEEDED", "j1": "FAILED"}}, "not archived as SUCCEEDED", id="failed"
        ),
        pytest.param({"kills": []}, "leader kills done", id="kills-missing"),
        pytest.param({"kills": [Kill(5.0, "a-1", 2, 0)]}, "not during archiving", id="kill-after-the-drain"),
        pytest.param({"accepted": {"k0": "j0"}}, "submissions accepted", id="submission-missing"),
        pytest.param(
            {"etcd_logs_keys": ["/gpufed/logs/j0/1/_attempt"]}, "left in etcd after the drain", id="logs-left"
        ),
        pytest.param({"sql_tails": 0}, "no kept tails in SQL", id="tails-not-archived"),
    ],
)
def test_each_broken_invariant_is_named(change: dict[str, object], named: str) -> None:
    broken = dataclasses.replace(_sound(), **change)  # type: ignore[arg-type]
    assert any(named in p for p in broken.problems()), broken.problems()


def test_an_etcd_over_its_bound_after_the_warm_up_is_a_problem() -> None:
    result = _sound()
    big = PLAN.bound_bytes + 1
    result.samples[-1] = dataclasses.replace(result.samples[-1], db_size_bytes=big)
    assert any("over the bound" in p for p in result.problems())
    # The same size during the warm-up is not judged.
    result.samples[-1] = dataclasses.replace(result.samples[-1], t_s=PLAN.warmup_s - 1)
    assert not any("over the bound" in p for p in result.problems())


def test_an_etcd_that_never_compacted_is_a_problem() -> None:
    result = _sound()
    result.samples = [dataclasses.replace(s, compact_revision=0) for s in result.samples]
    assert any("did not advance" in p for p in result.problems())


def test_a_sample_with_kept_logs_of_archived_jobs_in_etcd_is_a_problem() -> None:
    result = _sound()
    result.samples[0] = dataclasses.replace(result.samples[0], archived_logs_keys=2)
    assert any("kept-log keys of archived jobs" in p for p in result.problems())


def test_the_bound_grows_with_the_rate_but_not_with_the_jobs_through() -> None:
    more_jobs = dataclasses.replace(PLAN, jobs=200_000)
    assert more_jobs.bound_bytes == PLAN.bound_bytes
    assert dataclasses.replace(PLAN, rate_per_s=10.0).bound_bytes > PLAN.bound_bytes
