"""A submission answers once the server's job cache has the job, so that the submitter's next list
finds it (the console test's flake under load: alice submitted, listed at once, and saw "No jobs
match"); a cache that does not catch up delays the answer by a bounded wait, never loses the job.

The store's watch is held back by a gate the test opens: the cache learns of the job only then."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

import federation.api.service as service_module
from federation.api.service import JobService
from federation.api.v1 import gpufed_pb2 as pb
from federation.store.job_cache import JobCache
from placement.model import JobId
from tests.e2e.harness import manifest
from tests.unit.job_service import GatedStore, as_user, gated_service_for_alice

ALICE = as_user("alice")


@dataclass
class World:
    store: GatedStore
    cache: JobCache
    service: JobService

    async def submit(self, name: str) -> pb.SubmitJobResponse:
        request = pb.SubmitJobRequest(manifest=manifest(name))
        return await self.service.SubmitJob(request, ALICE)

    async def listed(self) -> list[str]:
        reply = await self.service.ListJobs(pb.ListJobsRequest(), ALICE)
        return [j.job_id for j in reply.jobs]


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with gated_service_for_alice() as (store, cache, service):
        yield World(store, cache, service)


async def test_a_submission_answers_once_the_cache_has_the_job_and_the_next_list_finds_it(
    world: World,
) -> None:
    world.store.gate.clear()
    submitting = asyncio.create_task(world.submit("train"))
    for _ in range(20):  # the store has the job; the cache does not, so the answer waits
        await asyncio.sleep(0)
    assert not submitting.done()
    world.store.gate.set()
    job_id = (await asyncio.wait_for(submitting, timeout=5)).job_id
    assert job_id in await world.listed()


async def test_a_cache_that_does_not_catch_up_delays_the_answer_and_loses_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "READ_YOUR_WRITES_WAIT_S", 0.05)
    world.store.gate.clear()
    job_id = (await world.submit("train")).job_id  # answered after the bounded wait
    world.store.gate.set()
    stored = await world.store.get_job(JobId(job_id))
    assert stored is not None
    assert await world.cache.wait_for_revision(stored.mod_revision)
    assert job_id in await world.listed()
