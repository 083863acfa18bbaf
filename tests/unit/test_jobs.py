"""The transition table: every allowed change has one owner, everything else is refused."""

from __future__ import annotations

import itertools

import pytest

from federation.errors import InvalidTransition
from federation.spec.jobspec import TaskSpec
from federation.store.jobs import TRANSITIONS, JobRecord, Owner, job_from_dict, job_to_dict
from placement.model import JobPhase
from tests.conftest import build_job


def a_job(phase: JobPhase = JobPhase.QUEUED) -> JobRecord:
    tasks = (
        TaskSpec("master", 1, "img", ("python",), (("A", "1"),), 2),
        TaskSpec("worker", 3, "img", (), (), 2),
    )
    return build_job("train-1", tenant="vision", gpu="A100", phase=phase, tasks=tasks)


ALLOWED = sorted(TRANSITIONS.items(), key=lambda kv: (kv[0][0].value, kv[0][1].value))
FORBIDDEN = [(a, b) for a, b in itertools.product(JobPhase, JobPhase) if (a, b) not in TRANSITIONS]


@pytest.mark.parametrize(("edge", "owner"), ALLOWED, ids=[f"{a}->{b}" for (a, b), _ in ALLOWED])
def test_an_allowed_transition_by_its_owner_records_an_event(
    edge: tuple[JobPhase, JobPhase], owner: Owner
) -> None:
    source, target = edge
    job = a_job(source).transition(target, by=owner, at_s=5.0, reason="why")
    assert job.phase is target
    assert job.events[-1].phase is target
    assert job.events[-1].reason == "why"


@pytest.mark.parametrize(("edge", "owner"), ALLOWED, ids=[f"{a}->{b}" for (a, b), _ in ALLOWED])
def test_an_allowed_transition_by_another_component_is_refused(
    edge: tuple[JobPhase, JobPhase], owner: Owner
) -> None:
    source, target = edge
    for other in Owner:
        if other is not owner:
            with pytest.raises(InvalidTransition, match="is written by"):
                a_job(source).transition(target, by=other, at_s=5.0)


@pytest.mark.parametrize("edge", FORBIDDEN, ids=[f"{a}->{b}" for a, b in FORBIDDEN])
def test_a_transition_outside_the_table_is_refused(edge: tuple[JobPhase, JobPhase]) -> None:
    source, target = edge
    for owner in Owner:
        with pytest.raises(InvalidTransition, match="not a valid transition"):
            a_job(source).transition(target, by=owner, at_s=5.0)


def test_terminal_phases_have_no_way_out() -> None:
    assert not [edge for edge in TRANSITIONS if edge[0].is_terminal]


def test_a_requeue_keeps_the_queue_position_and_counts_the_attempt() -> None:
    running = a_job(JobPhase.RUNNING)
    requeued = running.transition(JobPhase.QUEUED, by=Owner.STATUS, at_s=99.0, attempt=2)
    assert requeued.queued_at_s == running.queued_at_s
    assert requeued.attempt == 2
    assert requeued.events[-1].attempt == 2


def test_the_storage_codec_round_trips() -> None:
    job = a_job().transition(JobPhase.ADMITTED, by=Owner.SCHEDULER, at_s=2.0, reason="r")
    assert job_from_dict(job_to_dict(job)) == job
    assert job.gang_request().replica_gpus == (2, 2, 2, 2)
