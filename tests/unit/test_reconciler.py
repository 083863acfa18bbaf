"""The scheduling cycle and reconcilers over the in-memory store and cluster, on a fake clock.

Each test drives `tick`/`run_cycle` by hand, so every transition is deterministic and the restart
policy, cancellation and refusal paths can be checked one at a time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import pytest

from clusters.api import GangPhase, GangStatus, RemembersVanished, VanishedAttempt
from federation.scheduling.reconciler import CANCEL_GRACE_PERIOD_S, NOT_ARCHIVED_RECHECK_S
from federation.scheduling.workload import sim_duration_s
from federation.spec.jobspec import RestartAction, RestartPolicy
from federation.store.intervals import IntervalEnd
from federation.store.job_store import job_key
from federation.store.jobs import JobRecord
from placement.model import JobId, JobPhase
from tests.unit.reconcile_world import World, a_job, build_world, submit


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with build_world() as w:
        yield w


async def test_a_job_runs_through_every_phase_and_succeeds(world: World) -> None:
    job_id = await submit(world, a_job("ok"))
    await world.step()
    assert (await world.job(job_id)).phase is JobPhase.RUNNING
    await world.step(10.0)
    job = await world.job(job_id)
    assert job.phase is JobPhase.SUCCEEDED
    assert [e.phase for e in job.events] == [
        JobPhase.ADMITTED,
        JobPhase.DISPATCHED,
        JobPhase.RUNNING,
        JobPhase.SUCCEEDED,
    ]
    assert world.cluster.dispatch_count(job_id, 1) == 1


@pytest.mark.parametrize(("exit_code", "ended"), [(0, JobPhase.SUCCEEDED), (3, JobPhase.FAILED)])
async def test_a_gang_over_before_the_first_look_still_ran_in_its_history(
    world: World, exit_code: int, ended: JobPhase
) -> None:
    """A gang that ends before any look saw it running (a short one, or a busy leader's look a
    round later) ran all the same: the job's history says when, from its cluster's start, as the
    ledger charges it; before, a user saw a job that succeeded (or failed) without ever running."""
    job_id = await submit(world, a_job("brief", duration="0s", exit_code=exit_code))
    await world.step()
    job = await world.job(job_id)
    assert job.phase is ended
    assert [e.phase for e in job.events] == [JobPhase.ADMITTED, JobPhase.DISPATCHED, JobPhase.RUNNING, ended]
    dispatched, running = job.events[1], job.events[2]
    listed, _ = await world.store.list_ledger()
    (charged,) = [iv for iv in listed if iv.job_id == job_id]
    assert running.at_s == charged.start_s >= dispatched.at_s


@pytest.mark.parametrize(
    ("policy", "expected_phase", "expected_attempt"),
    [
        pytest.param(
            RestartPolicy(on_eviction=RestartAction.RESTART_JOB, max_retries=2),
            JobPhase.RUNNING,
            2,
            id="restart",
        ),
        pytest.param(RestartPolicy(on_eviction=RestartAction.ABORT_JOB), JobPhase.FAILED, 1, id="abort"),
        pytest.param(
            RestartPolicy(on_eviction=RestartAction.RESTART_JOB, max_retries=0),
            JobPhase.FAILED,
            1,
            id="no-retries-left",
        ),
    ],
)
async def test_an_evicted_gang_follows_the_restart_policy(
    world: World, policy: RestartPolicy, expected_phase: JobPhase, expected_attempt: int
) -> None:
    job_id = await submit(world, a_job("evicted", policy=policy))
    await world.step()
    world.cluster.inject_eviction(job_id, 1, reason="node lost")
    await world.step()
    job = await world.job(job_id)
    assert job.phase is expected_phase
    assert job.attempt == expected_attempt
    if expected_phase is JobPhase.RUNNING:
        # The whole gang restarted as a new attempt, keeping its queue position.
        assert job.queued_at_s == 1000.0
        assert JobPhase.QUEUED in [e.phase for e in job.events]
        assert world.cluster.dispatch_count(job_id, 2) == 1


async def test_a_failing_gang_is_aborted_by_default(world: World) -> None:
    job_id = await submit(world, a_job("crashes", exit_code=3))
    await world.step()
    await world.step(10.0)
    job = await world.job(job_id)
    assert job.phase is JobPhase.FAILED
    assert "3" in job.message


async def test_cancelling_a_running_job_stops_the_gang_first(world: World) -> None:
    job_id = await submit(world, a_job("long", duration="1h"))
    await world.step()
    stored = await world.store.get_job(job_id)
    assert stored is not None
    await world.store.commit([(replace(stored.value, cancel_requested=True), stored.mod_revision)])
    await world.step()
    assert (await world.job(job_id)).phase is JobPhase.CANCELLED
    statuses = {(s.job_id, s.attempt): s.phase for s in await world.cluster.statuses()}
    assert statuses.get((job_id, 1)) in (None, GangPhase.CANCELLED)


async def test_the_gang_of_an_unreachable_cluster_is_not_cancelled_as_done(world: World) -> None:
    job_id = await submit(world, a_job("stuck", duration="1h"))
    await world.step()
    stored = await world.store.get_job(job_id)
    assert stored is not None
    await world.store.commit([(replace(stored.value, cancel_requested=True), stored.mod_revision)])
    world.cluster.set_reachable(False)
    await world.step()
    # The gang may still run: the job must not claim CANCELLED until the cluster confirms.
    assert (await world.job(job_id)).phase is JobPhase.RUNNING
    world.cluster.set_reachable(True)
    await world.step()
    assert (await world.job(job_id)).phase is JobPhase.CANCELLED


async def test_gangs_wait_for_whole_nodes_and_start_when_capacity_frees(world: World) -> None:
    # Two nodes of 8: each job is 2 replicas x 8 GPUs, so only one runs at a time.
    first = await submit(world, a_job("first", gpus=8, duration="5s"))
    second = await submit(world, replace(a_job("second", gpus=8, duration="5s"), queued_at_s=1001.0))
    await world.step()
    assert (await world.job(first)).phase is JobPhase.RUNNING
    assert (await world.job(second)).phase is JobPhase.QUEUED
    reasons = await world.store.get_wait_reasons(second)
    assert reasons
    assert reasons[0].code.value == "insufficient_capacity"
    await world.step(5.0)
    assert (await world.job(first)).phase is JobPhase.SUCCEEDED
    assert (await world.job(second)).phase is JobPhase.RUNNING


async def test_a_gang_that_vanished_from_its_cluster_is_restarted(world: World) -> None:
    job_id = await submit(world, a_job("vanishing", duration="1h"))
    await world.step()
    world.cluster.forget(job_id, 1)
    await world.step()
    job = await world.job(job_id)
    assert job.attempt == 2
    assert "disappeared" in " ".join(e.reason for e in job.events)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("4s", 4.0), ("1.5m", 90.0), ("250ms", 0.25), ("7", 7.0), ("2h", 7200.0), ("soon", None), (None, None)],
    ids=str,
)
def test_sim_duration(text: str | None, seconds: float | None) -> None:
    assert sim_duration_s(text) == seconds


async def test_wait_reasons_are_deleted_once_the_job_stops_waiting(world: World) -> None:
    first = await submit(world, a_job("first", gpus=8, duration="5s"))
    second = await submit(world, replace(a_job("second", gpus=8, duration="5s"), queued_at_s=1001.0))
    await world.step()
    assert await world.store.get_wait_reasons(second)
    await world.step(5.0)
    assert (await world.job(second)).phase is JobPhase.RUNNING
    assert await world.store.get_wait_reasons(second) == ()
    assert await world.store.get_wait_reasons(first) == ()


async def test_a_gang_whose_pods_outlive_its_object_restarts_only_once_they_are_gone(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kubectl delete --cascade=orphan`: the pods run on; the next attempt waits for them to go,
    the reconciler has them deleted, and the ledger charges attempt 1 until they went."""
    job_id = await submit(world, a_job("orphaned", duration="600s"))
    await world.step()
    started_at_s = world.clock.now
    assert (await world.job(job_id)).phase is JobPhase.RUNNING

    cluster = world.cluster
    real_statuses = cluster.statuses
    left = GangStatus(
        job_id=job_id,
        attempt=1,
        phase=GangPhase.CANCELLED,
        message="gang object deleted; 2 of its pods left",
        started_at_s=started_at_s,
        live_pods=2,
        orphaned=True,
    )
    pods_left = [left]
    cancels: list[tuple[str, int, float]] = []

    async def statuses() -> Sequence[GangStatus]:
        return (*(await real_statuses()), *pods_left)

    async def cancel(job: JobId, attempt: int, grace_period_s: float) -> None:
        cancels.append((job, attempt, grace_period_s))

    monkeypatch.setattr(cluster, "statuses", statuses)
    monkeypatch.setattr(cluster, "cancel", cancel)
    cluster.forget(job_id, 1)  # the gang object is gone; its pods (above) are not

    for _ in range(10):
        await world.step(0.5)
    job = await world.job(job_id)
    assert (job.phase, job.attempt) == (JobPhase.RUNNING, 1), "no new attempt beside the old pods"
    assert cluster.dispatch_count(job_id, 2) == 0
    assert cancels[0] == (job_id, 1, CANCEL_GRACE_PERIOD_S), "the leftover pods are deleted"

    pods_left.clear()  # the pods are gone
    gone_at_s = world.clock.now + 0.5
    await world.step(0.5)
    job = await world.job(job_id)
    assert (job.phase, job.attempt, job.retries_used) == (JobPhase.RUNNING, 2, 1)
    listed, _ = await world.store.list_ledger()
    first = next(iv for iv in listed if iv.attempt == 1)
    assert (first.start_s, first.end_s, first.ended) == (started_at_s, gone_at_s, IntervalEnd.REQUEUED)


async def test_a_cancelled_job_is_charged_until_its_pods_are_gone(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = await submit(world, a_job("long", duration="1h"))
    await world.step()
    started_at_s = world.clock.now
    cluster = world.cluster
    real_statuses = cluster.statuses
    stopping = [
        GangStatus(
            job_id=job_id,
            attempt=1,
            phase=GangPhase.CANCELLED,
            message="deleted",
            started_at_s=started_at_s,
            finished_at_s=started_at_s + 1,
            live_pods=2,
        )
    ]

    async def statuses() -> Sequence[GangStatus]:
        # The cluster's view once told to stop: the gang deleted, its pods still stopping.
        own = await real_statuses()
        return (*(s for s in own if s.job_id != job_id), *stopping)

    monkeypatch.setattr(cluster, "statuses", statuses)
    stored = await world.store.get_job(job_id)
    assert stored is not None
    await world.store.commit([(replace(stored.value, cancel_requested=True), stored.mod_revision)])
    for _ in range(4):
        await world.step(0.5)
    assert (await world.job(job_id)).phase is JobPhase.RUNNING, "not CANCELLED while its pods stop"
    stopping.clear()
    gone_at_s = world.clock.now + 0.5
    await world.step(0.5)
    assert (await world.job(job_id)).phase is JobPhase.CANCELLED
    listed, _ = await world.store.list_ledger()
    (interval,) = listed
    assert (interval.start_s, interval.end_s, interval.ended) == (
        started_at_s,
        gone_at_s,
        IntervalEnd.CANCELLED,
    )


async def _dispatched_showing_pending(
    world: World, monkeypatch: pytest.MonkeyPatch, name: str
) -> tuple[JobId, list[GangStatus]]:
    """A long job dispatched to a cluster whose statuses are the returned list, which the test
    changes: at first its gang pending, pods not yet started."""
    job_id = await submit(world, a_job(name, duration="600s"))
    shown = [GangStatus(job_id=job_id, attempt=1, phase=GangPhase.PENDING, live_pods=2)]

    async def statuses() -> Sequence[GangStatus]:
        return tuple(shown)

    monkeypatch.setattr(world.cluster, "statuses", statuses)
    await world.step()
    assert (await world.job(job_id)).phase is JobPhase.DISPATCHED
    return job_id, shown


async def test_an_attempt_killed_before_it_was_seen_running_is_charged_from_its_pods_start(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A namespace deleted under a gang that just started: the cluster said once when its pods
    started, then the gang and its pods went before the job was ever RUNNING. The GPUs were held
    from that start until the pods were gone, and the ledger says so."""
    job_id, shown = await _dispatched_showing_pending(world, monkeypatch, "brief")
    cluster = world.cluster
    started_at_s = world.clock.now
    shown[0] = replace(shown[0], started_at_s=started_at_s)
    await world.step(0.5)
    assert (await world.job(job_id)).phase is JobPhase.DISPATCHED, "PENDING is not RUNNING"
    shown.clear()  # the gang object and its pods are gone at once
    cluster.forget(job_id, 1)
    gone_at_s = world.clock.now + 0.5
    await world.step(0.5)
    # (The faked cluster shows no gang at all from now on, so later attempts vanish too.)
    assert (await world.job(job_id)).attempt >= 2
    listed, _ = await world.store.list_ledger()
    first = next(iv for iv in listed if iv.attempt == 1)
    assert (first.start_s, first.end_s) == (started_at_s, gone_at_s)


async def test_a_gang_deleted_between_two_looks_is_charged_from_what_its_backend_remembers(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chaos test's case: a third party deletes a gang moments after its pods start, between two
    looks, so the reconciler never sees it running (nor a start time). A backend that watched the
    pods go (clusters.api.RemembersVanished) says when they ran; the ledger charges that, once."""
    job_id, shown = await _dispatched_showing_pending(world, monkeypatch, "blink")
    cluster = world.cluster
    ran = VanishedAttempt(started_at_s=world.clock.now + 0.2, ended_at_s=world.clock.now + 1.7)
    remembered = {(job_id, 1): ran}

    def vanished(job: JobId, attempt: int) -> VanishedAttempt | None:
        return remembered.get((job, attempt))

    monkeypatch.setattr(cluster, "vanished", vanished, raising=False)
    assert isinstance(cluster, RemembersVanished)
    shown.clear()
    cluster.forget(job_id, 1)
    await world.step(2.0)
    job = await world.job(job_id)
    assert job.attempt >= 2
    assert "disappeared" in " ".join(e.reason for e in job.events)
    listed, _ = await world.store.list_ledger()
    charged = [iv for iv in listed if iv.attempt == 1]
    assert [(iv.start_s, iv.end_s) for iv in charged] == [(ran.started_at_s, ran.ended_at_s)]


async def test_the_gang_of_a_job_the_archiver_took_first_is_removed() -> None:
    """Under load the archiver can take a job out of etcd before the collector's retention removed
    its finished gang; the cache then no longer knows the job. The history store does, so the gang
    is ours and goes. A gang of a job the history does not know either stays: it may be another
    federation's on the same cluster."""
    archived: set[JobId] = set()
    asked: list[list[JobId]] = []

    def archived_ids(job_ids: Sequence[JobId]) -> set[JobId]:
        asked.append(list(job_ids))
        return archived & set(job_ids)

    async with build_world(archived_ids=archived_ids) as world:
        first = await submit(world, a_job("first"))
        second = await submit(world, a_job("second"))
        await world.step()
        await world.step(10.0)
        assert (await world.job(first)).phase is JobPhase.SUCCEEDED
        assert (await world.job(second)).phase is JobPhase.SUCCEEDED
        # Both jobs leave etcd (what the archiver's fenced removal does); only the first is archived.
        for job_id in (first, second):
            assert await world.store.kv.delete(job_key(job_id))
        archived.add(first)
        await world.step()
        remaining = {(s.job_id, s.attempt) for s in await world.cluster.statuses()}
        assert (first, 1) not in remaining
        assert (second, 1) in remaining
        assert asked
        assert all(sorted(ids) == ids for ids in asked)


async def test_a_gang_the_history_does_not_know_is_asked_about_once_per_recheck_period() -> None:
    """A gang of another federation on a shared cluster stays for good; asking the history store
    about it every tick would be one SQL lookup a tick forever."""
    asked: list[list[JobId]] = []

    def archived_ids(job_ids: Sequence[JobId]) -> set[JobId]:
        asked.append(list(job_ids))
        return set()

    async with build_world(archived_ids=archived_ids) as world:
        foreign = await submit(world, a_job("foreign"))
        await world.step()
        await world.step(10.0)
        assert await world.store.kv.delete(job_key(foreign))  # unknown to us from now on
        for _ in range(5):
            await world.step(30.0)
        assert sum(foreign in ids for ids in asked) == 1
        await world.step(NOT_ARCHIVED_RECHECK_S)
        assert sum(foreign in ids for ids in asked) == 2
        assert (foreign, 1) in {(s.job_id, s.attempt) for s in await world.cluster.statuses()}


class _PodsSaidWhen:
    """A keeper whose read of an ended attempt's pods found them started at `at_s`."""

    def __init__(self, at_s: float) -> None:
        self.at_s = at_s

    def probe_due(self, job: object) -> bool:
        return False

    async def stopping(self, job: object, gang: object) -> None:
        return None

    async def waiting(self, job: object, gang: object) -> None:
        return None

    async def ended(self, before: object, after: JobRecord, gang: object) -> JobRecord:
        return after

    def started_at_s(self, job_id: str, attempt: int) -> float | None:
        return self.at_s


async def test_a_gang_over_before_the_pod_watch_showed_it_started_is_charged_from_its_pods(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gang's watch ran ahead of the pod watch: the first status after the dispatch says the gang
    succeeded and names no start, and the job was never RUNNING. The pods the keeper read at the end
    say when it ran; without them the ledger wrote no interval at all (test_crash_ha, loaded)."""
    pods_started_at_s = world.clock.now + 0.2
    world.reconciler = world.fresh_reconciler(keeper=_PodsSaidWhen(pods_started_at_s))
    job_id, shown = await _dispatched_showing_pending(world, monkeypatch, "unseen")
    shown[0] = GangStatus(
        job_id=job_id, attempt=1, phase=GangPhase.SUCCEEDED, finished_at_s=world.clock.now + 0.4
    )
    await world.step(0.5)
    assert (await world.job(job_id)).phase is JobPhase.SUCCEEDED
    listed, _ = await world.store.list_ledger()
    (charged,) = [iv for iv in listed if iv.job_id == job_id]
    assert (charged.start_s, charged.end_s) == (pods_started_at_s, shown[0].finished_at_s)
