"""Which gangs the collector removes: one row per rule."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clusters.api import GangPhase, GangStatus
from federation.scheduling.collector import (
    FINISHED_GANG_RETENTION_S,
    STOPPING_PATIENCE_S,
    StaleWhy,
    finished_gang_retention_s,
    stale_gangs,
    unknown_jobs,
)
from federation.store.jobs import JobPlacement, JobRecord
from placement.model import CapacityKind, ClusterName, GpuType, JobId, JobPhase
from tests.conftest import build_job

NOW_S = 100_000.0
HERE, THERE = ClusterName("here"), ClusterName("there")


def job(phase: JobPhase, *, attempt: int = 1, on: ClusterName | None = HERE) -> JobRecord:
    placement = None if on is None else JobPlacement(on, GpuType("A100"), CapacityKind.PRIVATE, 1.0)
    return replace(
        build_job("j", tenant="t", gpus=1, replicas=1, gpu="A100"),
        job_id=JobId("j"),
        phase=phase,
        attempt=attempt,
        placement=placement,
        submitted_at_s=NOW_S - 10,
    )


def gang(phase: GangPhase, *, attempt: int = 1, finished_ago_s: float | None = None) -> GangStatus:
    finished = None if finished_ago_s is None else NOW_S - finished_ago_s
    return GangStatus(job_id=JobId("j"), attempt=attempt, phase=phase, finished_at_s=finished)


LONG_AGO = FINISHED_GANG_RETENTION_S + 1


@pytest.mark.parametrize(
    ("record", "status", "expected"),
    [
        pytest.param(job(JobPhase.RUNNING), gang(GangPhase.RUNNING), None, id="current-attempt-is-kept"),
        pytest.param(job(JobPhase.ADMITTED), gang(GangPhase.PENDING), None, id="admitted-here-is-kept"),
        pytest.param(
            job(JobPhase.RUNNING, attempt=2, on=THERE),
            gang(GangPhase.RUNNING),
            StaleWhy.SUPERSEDED,
            id="older-attempt-still-running-goes",
        ),
        pytest.param(
            job(JobPhase.RUNNING, attempt=2),
            gang(GangPhase.EVICTED, finished_ago_s=60),
            None,
            id="older-attempt-finished-recently-is-kept-for-its-logs",
        ),
        pytest.param(
            job(JobPhase.RUNNING, attempt=2),
            gang(GangPhase.EVICTED, finished_ago_s=LONG_AGO),
            StaleWhy.EXPIRED,
            id="older-attempt-finished-long-ago-goes",
        ),
        pytest.param(
            job(JobPhase.RUNNING, attempt=2),
            replace(gang(GangPhase.CANCELLED), orphaned=True, live_pods=2),
            StaleWhy.SUPERSEDED,
            id="pods-orphaned-by-their-gang-object-go-at-once",
        ),
        pytest.param(
            job(JobPhase.RUNNING, attempt=2),
            replace(gang(GangPhase.FAILED, finished_ago_s=60), live_pods=1),
            StaleWhy.SUPERSEDED,
            id="older-attempt-ended-with-pods-still-running-goes",
        ),
        pytest.param(
            job(JobPhase.RUNNING, attempt=2),
            replace(gang(GangPhase.CANCELLED, finished_ago_s=60), orphaned=True),
            None,
            id="finished-pods-left-by-a-deleted-gang-are-kept-for-their-logs",
        ),
        pytest.param(
            job(JobPhase.RUNNING, on=THERE),
            gang(GangPhase.RUNNING),
            StaleWhy.ELSEWHERE,
            id="same-attempt-placed-elsewhere-goes",
        ),
        pytest.param(
            job(JobPhase.QUEUED, on=None),
            gang(GangPhase.RUNNING),
            StaleWhy.NOT_PLACED,
            id="gang-of-a-requeued-job-goes",
        ),
        pytest.param(
            job(JobPhase.FAILED),
            gang(GangPhase.RUNNING),
            StaleWhy.JOB_FINISHED,
            id="running-gang-of-a-finished-job-goes",
        ),
        pytest.param(
            job(JobPhase.SUCCEEDED),
            gang(GangPhase.SUCCEEDED, finished_ago_s=60),
            None,
            id="finished-gang-of-a-finished-job-is-kept-a-while",
        ),
        pytest.param(
            job(JobPhase.SUCCEEDED),
            gang(GangPhase.SUCCEEDED, finished_ago_s=LONG_AGO),
            StaleWhy.EXPIRED,
            id="finished-gang-past-retention-goes",
        ),
        pytest.param(
            job(JobPhase.SUCCEEDED),
            replace(gang(GangPhase.SUCCEEDED, finished_ago_s=1), live_pods=1),
            None,
            id="a-gang-its-controller-just-ended-is-left-to-stop-its-pods",
        ),
        pytest.param(
            job(JobPhase.SUCCEEDED),
            replace(gang(GangPhase.SUCCEEDED, finished_ago_s=STOPPING_PATIENCE_S), live_pods=1),
            StaleWhy.JOB_FINISHED,
            id="pods-that-outstay-the-patience-go",
        ),
        pytest.param(
            job(JobPhase.FAILED),
            replace(gang(GangPhase.CANCELLED, finished_ago_s=1), orphaned=True, live_pods=1),
            StaleWhy.JOB_FINISHED,
            id="orphaned-pods-have-no-controller-to-wait-for",
        ),
        pytest.param(
            job(JobPhase.SUCCEEDED),
            replace(gang(GangPhase.SUCCEEDED), live_pods=1),
            StaleWhy.JOB_FINISHED,
            id="live-pods-of-a-gang-whose-end-is-unknown-go",
        ),
        pytest.param(
            job(JobPhase.RUNNING),
            gang(GangPhase.RUNNING, attempt=2),
            None,
            id="attempt-newer-than-the-record-is-a-cache-lag-and-kept",
        ),
    ],
)
def test_stale_gangs(record: JobRecord, status: GangStatus, expected: StaleWhy | None) -> None:
    found = stale_gangs({HERE: {(status.job_id, status.attempt): status}}, lambda _: record, now_s=NOW_S)
    assert [s.why for s in found] == ([] if expected is None else [expected])


def test_gangs_of_unknown_jobs_and_silent_clusters_are_left_alone() -> None:
    running = gang(GangPhase.RUNNING)
    statuses = {HERE: {(running.job_id, 1): running}, THERE: None}
    assert stale_gangs(statuses, lambda _: None, now_s=NOW_S) == []


@pytest.mark.parametrize(
    ("retain_in_etcd_s", "kept_s"),
    [
        pytest.param(None, FINISHED_GANG_RETENTION_S, id="no-archiver-keeps-the-hour"),
        pytest.param(3 * 3600.0, FINISHED_GANG_RETENTION_S, id="a-long-retention-keeps-the-hour"),
        pytest.param(3600.0, 1800.0, id="the-default-hour-leaves-half-of-it"),
        pytest.param(10.0, 5.0, id="a-compressed-soak-leaves-half-of-it"),
    ],
)
def test_finished_gangs_go_before_the_archiver_takes_their_job(
    retain_in_etcd_s: float | None, kept_s: float
) -> None:
    """Once archived, a job is unknown to the cache and its gang would be left on the cluster for
    good: the collector must remove it first, so it keeps finished gangs at most half the time a
    job stays in etcd after it ended."""
    retention_s = finished_gang_retention_s(retain_in_etcd_s)
    assert retention_s == kept_s
    finished = job(JobPhase.SUCCEEDED)
    for ago_s, expected in ((kept_s - 1, []), (kept_s, [StaleWhy.EXPIRED])):
        status = gang(GangPhase.SUCCEEDED, finished_ago_s=ago_s)
        found = stale_gangs(
            {HERE: {(status.job_id, 1): status}}, lambda _: finished, now_s=NOW_S, retention_s=retention_s
        )
        assert [s.why for s in found] == expected


def test_gangs_of_archived_jobs_go_and_other_federations_gangs_stay() -> None:
    """A gang whose job the archiver already took (a long tick under load let it go first) is ours:
    the history store holds its job. A gang of a job neither etcd nor the history knows may be
    another federation's on a shared cluster, and stays."""
    ours = GangStatus(job_id=JobId("archived"), attempt=2, phase=GangPhase.SUCCEEDED, finished_at_s=NOW_S)
    theirs = GangStatus(job_id=JobId("theirs"), attempt=1, phase=GangPhase.RUNNING)
    statuses = {
        HERE: {(ours.job_id, 2): ours, (theirs.job_id, 1): theirs},
        THERE: None,
    }
    assert unknown_jobs(statuses, lambda _: None) == [JobId("archived"), JobId("theirs")]
    found = stale_gangs(statuses, lambda _: None, now_s=NOW_S, archived={JobId("archived")})
    assert [(s.cluster, s.job_id, s.attempt, s.why) for s in found] == [
        (HERE, JobId("archived"), 2, StaleWhy.ARCHIVED)
    ]


def test_only_gangs_of_jobs_the_cache_lacks_are_asked_about() -> None:
    live = gang(GangPhase.RUNNING)
    statuses = {HERE: {(live.job_id, 1): live}}
    assert unknown_jobs(statuses, lambda _: job(JobPhase.RUNNING)) == []
