"""A new job's id is its name and 64 random bits; among many live jobs of one name (a sweep's
trials) a draw can land on a live job's id. The create is create-only, so nothing is overwritten;
the submission draws another id and the caller never sees the collision. A submission without a
client key is keyed by random bits of its own, not by the drawn id, or the live job's key would
answer it as a retry of that job and no job would be made (found by
bench/scale_depth.py: 30,000 submissions of one name over a million queued jobs were refused with
"job probe-... already exists under another idempotency key")."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

import federation.api.service as service_module
from federation.api.service import JobService
from federation.api.v1 import gpufed_pb2 as pb
from federation.errors import JobIdTaken
from placement.model import JobId
from tests.e2e.harness import manifest
from tests.unit.job_service import GatedStore, as_user, gated_service_for_alice


@pytest.fixture
async def alice() -> AsyncIterator[tuple[GatedStore, JobService]]:
    async with gated_service_for_alice() as (store, _cache, service):
        yield store, service


async def _submit(service: JobService, key: str = "") -> pb.SubmitJobResponse:
    request = pb.SubmitJobRequest(manifest=manifest("train"), idempotency_key=key)
    return await service.SubmitJob(request, as_user("alice"))


def _draws(*ids: str) -> Iterator[JobId]:
    yield from (JobId(i) for i in ids)


@pytest.mark.parametrize("key", ["", "client-key-1"])
async def test_an_id_drawn_twice_is_drawn_again_and_the_live_job_is_untouched(
    alice: tuple[GatedStore, JobService], monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    store, service = alice
    first = (await _submit(service)).job_id
    before = await store.get_job(JobId(first))
    draws = _draws(first, first, "train-0000beef")
    monkeypatch.setattr(service_module, "_new_job_id", lambda name: next(draws))
    reply = await _submit(service, key)
    assert reply.created
    assert reply.job_id == "train-0000beef"
    after = await store.get_job(JobId(first))
    assert after == before  # the live job whose id was drawn: not a byte changed


async def test_a_submission_that_draws_only_taken_ids_is_refused_and_writes_nothing(
    alice: tuple[GatedStore, JobService], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, service = alice
    first = (await _submit(service)).job_id
    monkeypatch.setattr(service_module, "_new_job_id", lambda name: JobId(first))
    with pytest.raises(Exception) as refused:
        await _submit(service, "client-key-2")
    assert "already exists" in str(refused.value)
    assert [j.value.job_id for j in (await store.list_jobs())[0]] == [first]
    assert service_module.JOB_ID_DRAWS > 1


def test_the_collision_is_a_conflict_of_its_own() -> None:
    from federation.errors import Conflict

    assert issubclass(JobIdTaken, Conflict)


def test_a_new_id_is_the_name_cut_to_40_and_64_random_bits() -> None:
    import re

    from clusters.kubernetes.names import MAX_GANG_NAME, object_name, task_name

    long_name = "a" * 30 + "-" + "b" * 32  # 63 characters, a valid job name
    ids = {service_module._new_job_id(long_name) for _ in range(1_000)}
    assert len(ids) == 1_000
    for job_id in ids:
        assert re.fullmatch(r"a{30}-b{9}-[0-9a-f]{16}", job_id), job_id
        # The cluster's names stay valid and apart for the longest ids: cut short with a hash.
        gang = object_name(job_id, 12)
        assert len(gang) <= MAX_GANG_NAME
        assert len(f"{gang}-{task_name(gang, 'worker', 64)}-63") <= 63
    assert len({object_name(j, 1) for j in ids}) == len(ids)
    assert service_module._new_job_id("train-")[: len("train-")] == "train-"
    assert re.fullmatch(r"train-[0-9a-f]{16}", service_module._new_job_id("train"))
