"""Where the savings report's inputs are kept (issues 34, 35): the ledger interval copies the job's set
and the attempt's burst offer when it is written, older etcd records and pre-0006 history rows still
load, and an archived interval keeps its offer and set through SQL (get_job and the per-interval
reads the savings report uses)."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from federation.history import rows
from federation.history.model import IntervalQuery
from federation.jobsets.sweeps import SWEEP_ENV
from federation.store.intervals import (
    ClusterSite,
    LedgerInterval,
    SetKind,
    interval_from_dict,
    interval_from_json,
    interval_to_dict,
    ledger_update,
)
from federation.store.jobs import BurstOffer, JobPlacement, JobRecord, Owner
from placement.model import CapacityKind, ClusterName, GpuType, JobId, JobPhase
from tests.conftest import build_job
from tests.history_builders import BACKENDS, an_archived_job, an_interval, fresh_dsn, open_store

T0 = 1_793_000_000.0
OFFER = BurstOffer(ClusterName("aws-us-east-1"), GpuType("A100"), CapacityKind.ON_DEMAND, 4.1, T0 - 900.0, 1)


def _ran(job: JobRecord, start: float, end: float) -> LedgerInterval:
    placed = job.transition(
        JobPhase.ADMITTED,
        by=Owner.SCHEDULER,
        at_s=start - 1,
        placement=JobPlacement(ClusterName("onprem"), GpuType("A100"), CapacityKind.PRIVATE, 1.1),
    )
    running = placed.transition(JobPhase.DISPATCHED, by=Owner.DISPATCHER, at_s=start - 0.5).transition(
        JobPhase.RUNNING, by=Owner.STATUS, at_s=start
    )
    done = running.transition(JobPhase.SUCCEEDED, by=Owner.STATUS, at_s=end)
    found = None
    for before, after in itertools.pairwise([job, placed, running, done]):
        entry = ledger_update(
            before, after, site=ClusterSite("onprem", "dc1"), started_at_s=None, finished_at_s=end, now_s=end
        )
        found = entry or found
    assert found is not None
    return found


def test_the_interval_copies_the_attempts_offer_and_the_jobs_set() -> None:
    job = replace(
        build_job("j", tenant="vision", gpu="A100"), burst_offer=OFFER, job_set="shards", array_index=3
    )
    iv = _ran(job, T0, T0 + 3600)
    assert iv.burst_offer == OFFER
    assert (iv.job_set, iv.set_kind) == ("shards", SetKind.ARRAY.value)


def test_an_earlier_attempts_offer_is_not_copied_to_a_later_attempt() -> None:
    job = replace(build_job("j", gpu="A100"), attempt=2, burst_offer=OFFER)
    assert _ran(job, T0, T0 + 60).burst_offer is None


def test_a_sweeps_trial_is_marked_as_a_sweep_and_a_lone_job_as_no_set() -> None:
    base = build_job("t", gpu="A100")
    task = replace(base.spec.tasks[0], env=(*base.spec.tasks[0].env, (SWEEP_ENV, "lr")))
    trial = replace(base, spec=replace(base.spec, tasks=(task,)), job_set="lr")
    assert (_ran(trial, T0, T0 + 60).set_kind, _ran(trial, T0, T0 + 60).job_set) == ("sweep", "lr")
    named = replace(base, job_set="pipeline")
    assert _ran(named, T0, T0 + 60).set_kind == SetKind.SET.value
    alone = _ran(base, T0, T0 + 60)
    assert (alone.job_set, alone.set_kind, alone.burst_offer) == ("", "", None)


def test_an_interval_written_before_the_fields_reads_as_a_lone_job_with_no_offer() -> None:
    iv = an_interval("old", start_s=T0, end_s=T0 + 60)
    old = interval_to_dict(iv)
    assert "burst_offer" not in old
    assert "job_set" not in old
    raw = json.dumps(old)
    for decoded in (interval_from_json(raw), interval_from_dict(json.loads(raw))):
        assert decoded == iv
        assert decoded.burst_offer is None
    new = replace(iv, burst_offer=OFFER, job_set="lr", set_kind="sweep")
    assert interval_from_json(json.dumps(interval_to_dict(new))) == new


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_archived_interval_keeps_its_offer_and_set(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with_offer = replace(
        an_interval("a", start_s=T0, end_s=T0 + 3600), burst_offer=OFFER, job_set="lr", set_kind="sweep"
    )
    without = an_interval("b", start_s=T0, end_s=T0 + 7200)
    jobs = [an_archived_job("a", intervals=(with_offer,)), an_archived_job("b", intervals=(without,))]
    for store in open_store(fresh_dsn(backend, tmp_path, request)):
        store.write_jobs(jobs)
        found = store.get_job(JobId("a"))
        assert found is not None
        assert found.intervals == (with_offer,)
        page = store.intervals_page(IntervalQuery(since_s=T0 - 86400, until_s=T0 + 86400))
        assert sorted(page.intervals, key=lambda iv: iv.job_id) == [with_offer, without]
    assert (
        rows.interval_from_row({**rows.interval_row(without), "job_set": None, "set_kind": None}) == without
    )
