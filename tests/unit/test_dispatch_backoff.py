"""A cluster that refuses dispatches is backed off from, per job and per cluster, on a fake clock.

Without the backoff a refusing cluster was asked again every cycle, each time as a new attempt:
the requeue loop of issue 14 (attempt 542 in 49 s). The backoff lives on the job record, so a new
leader keeps it, and no refusal uses up the job's retries.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from clusters.api import ClusterUnreachable, GangWorkload
from federation.api.service import explain_summary
from federation.api.v1 import gpufed_pb2 as pb
from federation.cli.render import clusters_table
from federation.scheduling.dispatch_backoff import (
    CLUSTER_PROBE_MAX_S,
    MAX_DELAY_S,
    REFUSING_COUNT,
    backoff_text,
    cleared,
    delay_s,
    refused,
    refusing_clusters,
)
from placement.model import ClusterName, JobId, JobPhase
from tests.unit.reconcile_world import World, a_job, build_world, submit

ONPREM = ClusterName("onprem")
CLOUD = ClusterName("cloud")
REFUSAL = 'namespaces "gpufed-vision" is forbidden: unable to create new content (terminating)'


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with build_world() as w:
        yield w


@pytest.mark.parametrize(
    ("count", "seconds"),
    [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 256.0), (10, MAX_DELAY_S), (1000, MAX_DELAY_S)],
    ids=lambda v: str(v),
)
def test_the_delay_doubles_up_to_its_cap(count: int, seconds: float) -> None:
    assert delay_s(count) == seconds


def test_refusals_count_per_cluster_and_a_success_clears_only_its_own() -> None:
    job = a_job("j")
    job = replace(job, refusals=refused(job, ONPREM, "no", 100.0))
    job = replace(job, refusals=refused(job, ONPREM, "still no", 101.0))
    job = replace(job, refusals=refused(job, CLOUD, "nope", 102.0))
    by_cluster = {r.cluster: r for r in job.refusals}
    assert (by_cluster[ONPREM].count, by_cluster[ONPREM].first_at_s, by_cluster[ONPREM].retry_at_s) == (
        2,
        100.0,
        103.0,
    )
    assert by_cluster[ONPREM].error == "still no"
    assert by_cluster[CLOUD].count == 1
    assert [r.cluster for r in cleared(job, ONPREM)] == [CLOUD]


def test_a_cluster_is_refusing_once_two_jobs_or_three_tries_in_a_row_met_it() -> None:
    one = a_job("one")
    one = replace(one, refusals=refused(one, ONPREM, "webhook said no", 100.0))
    assert refusing_clusters([one], 100.5) == {}
    two = a_job("two")
    two = replace(two, refusals=refused(two, ONPREM, "webhook said no again", 101.0))
    refusing = refusing_clusters([one, two], 101.5)[ONPREM]
    assert (refusing.since_s, refusing.jobs, refusing.last_error) == (100.0, 2, "webhook said no again")
    # Old news once every refusal is long past its retry time: the jobs moved on.
    assert refusing_clusters([one, two], 1000.0) == {}


async def test_a_refusing_cluster_is_backed_off_from_and_charges_no_retry(world: World) -> None:
    world.cluster.refuse_dispatches(REFUSAL)
    job_id = await submit(world, a_job("refused", duration="600s"))
    for _ in range(4 * 60):
        await world.step(0.25)
    job = await world.job(job_id)
    # One minute of refusals: 1 + 2 + 4 + 8 + 16 + 32 s of backoff, so about six tries, not 240.
    assert 5 <= world.cluster.refused_dispatches <= 8, world.cluster.refused_dispatches
    assert job.attempt == world.cluster.refused_dispatches + 1
    assert job.retries_used == 0
    (entry,) = job.refusals
    assert (entry.cluster, entry.count) == (ONPREM, world.cluster.refused_dispatches)
    assert REFUSAL in entry.error

    # explain says why it waits, and for how long.
    text = explain_summary(job, 1, now=world.clock.now)
    assert f"dispatch to cluster onprem refused (onprem refused the gang: cluster onprem: {REFUSAL})" in text
    assert f"(attempt {entry.count} of backoff)" in text
    assert "retrying in" in text or "not retried there for" in text

    # The cluster takes gangs again: the job runs at its next try, its refusals forgotten.
    world.cluster.refuse_dispatches(None)
    for _ in range(int(delay_s(entry.count) / 0.5) + 4):
        await world.step(0.5)
    job = await world.job(job_id)
    assert job.phase is JobPhase.RUNNING
    assert (job.refusals, job.retries_used) == ((), 0)


async def test_the_backoff_survives_a_leader_change(world: World) -> None:
    world.cluster.refuse_dispatches(REFUSAL)
    job_id = await submit(world, a_job("refused", duration="600s"))
    for _ in range(4 * 10):
        await world.step(0.25)
    tries = world.cluster.refused_dispatches
    (entry,) = (await world.job(job_id)).refusals
    # A new leader: a fresh reconciler, nothing in memory but what the store holds.
    world.reconciler = world.fresh_reconciler()
    while world.clock.now < entry.retry_at_s - 0.5:
        await world.step(0.25)
    assert world.cluster.refused_dispatches == tries, "the new leader waited out the backoff"
    await world.step(1.0)
    assert world.cluster.refused_dispatches == tries + 1


async def test_a_job_admitted_to_a_refusing_cluster_waits_for_its_next_probe() -> None:
    async with build_world() as world:
        world.cluster.refuse_dispatches(REFUSAL)
        first = await submit(world, a_job("first", gpus=2))
        second = await submit(world, a_job("second", gpus=2))
        for _ in range(3):
            await world.step(0.25)
        assert world.cluster.refused_dispatches == 2
        assert ONPREM in refusing_clusters([await world.job(first), await world.job(second)], world.clock.now)
        # A third job that never met the refusal is not sent while the cluster is refusing.
        third = await submit(world, a_job("third", gpus=2))
        await world.step(0.25)
        job = await world.job(third)
        assert job.refusals == ()
        assert world.cluster.refused_dispatches == 2
        assert job.phase is JobPhase.ADMITTED
        assert "keeps refusing" in backoff_text(
            job,
            world.clock.now,
            refusing_clusters([await world.job(first), await world.job(second)], world.clock.now)[ONPREM],
        )


def test_gpufed_clusters_shows_a_refusing_cluster_with_its_last_error_and_since_when() -> None:
    reply = pb.ListClustersResponse(
        clusters=[
            pb.Cluster(
                name="onprem",
                provider="private",
                region="dc1",
                reachable=True,
                pools=[pb.Pool(name="a100", gpu_type="A100", gpus_per_node=8, node_count=2, free_gpus=16)],
                state="refusing",
                last_error=REFUSAL,
                refused_jobs=3,
            ),
            pb.Cluster(
                name="cloud",
                provider="aws",
                region="us-east-1",
                reachable=True,
                pools=[pb.Pool(name="h100", gpu_type="H100", gpus_per_node=8, node_count=1, free_gpus=8)],
            ),
        ]
    )
    reply.clusters[0].refusing_since.FromSeconds(3600)
    reply.clusters[0].next_try.FromSeconds(3608)
    text = clusters_table(reply)
    rows = {line.split()[0]: line.split() for line in text.splitlines()[1:3]}
    assert rows["onprem"][3] == "REFUSING"
    assert rows["cloud"][3] == "yes"
    assert (
        f"onprem: refusing dispatches since 01:00:00 UTC (3 job(s)); backing off, next try 01:00:08 UTC; "
        f"last error: {REFUSAL}"
    ) in text


async def test_a_refusing_cluster_holds_other_jobs_back_briefly_and_stops_refusing_once_it_takes_one(
    world: World,
) -> None:
    world.cluster.refuse_dispatches(REFUSAL)
    bad = await submit(world, a_job("bad", gpus=2, duration="600s"))
    for _ in range(4 * 20):
        await world.step(0.25)
    assert (await world.job(bad)).refusals[0].count >= REFUSING_COUNT
    # The refusal was the bad job's own: the cluster takes other gangs.
    world.cluster.refuse_dispatches(None)
    good = await submit(world, a_job("good", gpus=2, duration="600s"))
    # Measured on the world's fake clock, which only `step` moves: the wait is the scheduler's
    # doing, whatever the machine's speed.
    submitted_at_s = world.clock.now
    while (await world.job(good)).phase is not JobPhase.RUNNING:
        await world.step(0.25)
        waited_s = world.clock.now - submitted_at_s
        assert waited_s <= CLUSTER_PROBE_MAX_S + 1.0, "a refusing cluster held the good job too long"
    jobs = [s.value for s in world.cache.live_jobs()]
    assert refusing_clusters(jobs, world.clock.now) == {}, "it took a gang since its last refusal"


async def test_a_create_that_timed_out_but_happened_is_removed_before_the_next_attempt_is_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with build_world(cluster_count=2) as world:
        onprem, cloud = world.clusters["onprem"], world.clusters["cloud"]
        calls: list[str] = []
        real = {"onprem": onprem.dispatch, "cloud": cloud.dispatch}
        real_cancel = onprem.cancel

        async def onprem_dispatch(gang: GangWorkload) -> None:
            await real["onprem"](gang)  # the cluster made it; the answer was lost
            calls.append(f"onprem created a{gang.attempt}")
            raise ClusterUnreachable("cluster onprem: create gang: read timed out")

        async def cloud_dispatch(gang: GangWorkload) -> None:
            calls.append(f"cloud created a{gang.attempt}")
            await real["cloud"](gang)

        async def onprem_cancel(job_id: JobId, attempt: int, grace_period_s: float) -> None:
            calls.append(f"onprem cancelled a{attempt}")
            await real_cancel(job_id, attempt, grace_period_s)

        monkeypatch.setattr(onprem, "dispatch", onprem_dispatch)
        monkeypatch.setattr(onprem, "cancel", onprem_cancel)
        monkeypatch.setattr(cloud, "dispatch", cloud_dispatch)
        # The whole of onprem: its lost attempt fills it, so the next goes to the cloud at once.
        job_id = await submit(world, a_job("twice", gpus=8, duration="600s"))
        for _ in range(8):
            await world.step(0.25)
        job = await world.job(job_id)
        assert (job.phase, job.attempt, job.retries_used) == (JobPhase.RUNNING, 2, 0)
        assert calls == ["onprem created a1", "onprem cancelled a1", "cloud created a2"]
