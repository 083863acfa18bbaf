"""The usage ledger: one interval per started attempt, written with the transition that causes it.

Driven through the real scheduler and reconcilers over the in-memory store and cluster on a fake
clock, so each interval's start, end and how it ended can be checked to the second.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from federation.spec.jobspec import RestartAction, RestartPolicy
from federation.store.intervals import IntervalEnd, LedgerInterval, ledger_key
from federation.store.job_store import KvStore
from federation.store.jobs import Owner
from placement.model import CapacityKind, JobId, JobPhase
from tests.unit.reconcile_world import World, a_job, build_world, submit


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with build_world() as w:
        yield w


async def _ledger(store: KvStore, job_id: JobId) -> list[LedgerInterval]:
    listed, _ = await store.list_ledger()
    return sorted((iv for iv in listed if iv.job_id == job_id), key=lambda iv: iv.attempt)


async def _cancel(world: World, job_id: JobId) -> None:
    stored = await world.store.get_job(job_id)
    assert stored is not None
    await world.store.commit([(replace(stored.value, cancel_requested=True), stored.mod_revision)])


async def test_a_finished_job_has_one_closed_interval_with_the_clusters_times_and_its_price(
    world: World,
) -> None:
    job_id = await submit(world, a_job("ok", gpus=4, duration="10s"))
    await world.step()
    (open_iv,) = await _ledger(world.store, job_id)
    assert open_iv.end_s is None
    assert open_iv.ended is None
    start = open_iv.start_s
    await world.step(10.0)
    (iv,) = await _ledger(world.store, job_id)
    assert iv.ended is IntervalEnd.FINISHED
    assert iv.start_s == start
    assert iv.end_s == pytest.approx(start + 10.0)
    # Two replicas of 4 GPUs, on the private cluster at its internal rate.
    assert (iv.gpu_count, iv.gpu_type, iv.kind, iv.usd_per_gpu_hour) == (8, "A100", CapacityKind.PRIVATE, 1.1)
    assert (iv.tenant, iv.cluster, iv.provider, iv.region) == ("vision", "onprem", "private", "dc1")
    assert iv.gpu_hours(until_s=1e12) == pytest.approx(8 * 10 / 3600)
    assert iv.cost_usd(until_s=1e12) == pytest.approx(8 * 10 / 3600 * 1.1)


async def test_a_failed_job_is_charged_until_it_failed(world: World) -> None:
    job_id = await submit(world, a_job("crashes", duration="5s", exit_code=3))
    await world.step()
    await world.step(5.0)
    (iv,) = await _ledger(world.store, job_id)
    assert iv.ended is IntervalEnd.FAILED
    assert iv.end_s == pytest.approx(iv.start_s + 5.0)


async def test_an_evicted_and_restarted_job_has_one_interval_per_started_attempt(world: World) -> None:
    policy = RestartPolicy(on_eviction=RestartAction.RESTART_JOB, max_retries=2)
    job_id = await submit(world, a_job("evicted", policy=policy, duration="10s"))
    await world.step()
    await world.step(3.0)
    world.cluster.inject_eviction(job_id, 1, reason="node lost")
    await world.step()
    await world.step(10.0)
    first, second = await _ledger(world.store, job_id)
    assert (first.attempt, first.ended) == (1, IntervalEnd.REQUEUED)
    assert first.end_s == pytest.approx(first.start_s + 3.0)
    assert (second.attempt, second.ended) == (2, IntervalEnd.FINISHED)
    assert (await world.job(job_id)).phase is JobPhase.SUCCEEDED
    # The ledger cache's list (by the keys etcd holds) has each interval under its own key, and the
    # same intervals as the plain list.
    by_key, _ = await world.store.list_ledger_by_key()
    listed, _ = await world.store.list_ledger()
    assert {iv.key: iv for iv in listed} == by_key
    assert by_key[ledger_key(job_id, 1)] == first
    assert by_key[ledger_key(job_id, 2)] == second


async def test_a_job_cancelled_before_it_started_costs_nothing(world: World) -> None:
    # 2 x 16 GPUs fit nowhere on two 8-GPU nodes: the job waits in the queue.
    job_id = await submit(world, a_job("too-big", gpus=16))
    await world.step()
    await _cancel(world, job_id)
    await world.step()
    assert (await world.job(job_id)).phase is JobPhase.CANCELLED
    assert await _ledger(world.store, job_id) == []


async def test_a_running_job_cancelled_is_charged_until_the_cancel(world: World) -> None:
    job_id = await submit(world, a_job("stopped", duration="60s"))
    await world.step()
    await world.step(7.0)
    await _cancel(world, job_id)
    await world.step()
    (iv,) = await _ledger(world.store, job_id)
    assert iv.ended is IntervalEnd.CANCELLED
    assert iv.end_s == pytest.approx(iv.start_s + 7.0)


async def test_a_transition_that_loses_its_compare_writes_no_ledger_entry(world: World) -> None:
    job_id = await submit(world, a_job("raced"))
    await world.step()
    stored = await world.store.get_job(job_id)
    assert stored is not None
    (iv,) = await _ledger(world.store, job_id)
    done = stored.value.transition(JobPhase.SUCCEEDED, by=Owner.STATUS, at_s=9.0)
    closed = replace(iv, end_s=iv.start_s + 1.0, ended=IntervalEnd.FINISHED)
    # Someone else wrote the job in between: the commit fails, and the entry stays as it was.
    assert await world.store.commit([(done, stored.mod_revision - 1)], ledger=(closed,)) is None
    assert await _ledger(world.store, job_id) == [iv]
    assert ledger_key(job_id, 1) == iv.key
