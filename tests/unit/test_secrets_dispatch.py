"""The reconciler and tenant secrets: a gang carries the values of the secrets its pods name, its
cluster is told to release them when the attempt ends, and a secret deleted before dispatch fails the
job saying which (federation.scheduling.reconciler, federation.secrets.jobs)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from clusters.api import GangWorkload
from federation.secrets.crypto import Keyring
from federation.secrets.jobs import GangSecrets
from federation.secrets.store import SecretStore
from federation.store.jobs import JobRecord
from federation.store.kv_memory import MemoryKv
from placement.model import JobId, JobPhase, TenantId
from tests.unit.reconcile_world import World, a_job, build_world, submit

VALUE = b"hf_unit-value"
SECRET_ENV = {
    "spec": {
        "containers": [
            {
                "name": "worker",
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
            }
        ]
    }
}


@pytest.fixture
async def world() -> AsyncIterator[tuple[World, SecretStore, list[GangWorkload], list[tuple[str, str, int]]]]:
    secrets = SecretStore(MemoryKv(), Keyring([os.urandom(32)]))
    async with build_world() as w:
        w.reconciler = w.fresh_reconciler(secrets=GangSecrets(secrets))
        sent: list[GangWorkload] = []
        released: list[tuple[str, str, int]] = []
        cluster = w.cluster
        dispatch = cluster.dispatch

        async def recording_dispatch(gang: GangWorkload) -> None:
            sent.append(gang)
            await dispatch(gang)

        async def recording_release(tenant: TenantId, job_id: JobId, attempt: int) -> None:
            released.append((tenant, job_id, attempt))

        cluster.dispatch = recording_dispatch  # type: ignore[method-assign]
        cluster.release_secrets = recording_release  # type: ignore[method-assign]
        yield w, secrets, sent, released


def a_secret_job(name: str) -> JobRecord:
    job = a_job(name, duration="10s")
    task = replace(job.spec.tasks[0], template=json.dumps(SECRET_ENV, sort_keys=True))
    return replace(job, spec=replace(job.spec, tasks=(task,)))


async def test_the_gang_carries_the_values_and_they_are_released_when_it_ends(
    world: tuple[World, SecretStore, list[GangWorkload], list[tuple[str, str, int]]],
) -> None:
    w, secrets, sent, released = world
    await secrets.put("vision", "hf", {"token": VALUE}, by="alice", at_s=1.0)
    job_id = await submit(w, a_secret_job("s1"))
    await w.step()
    (gang,) = sent
    assert [(s.name, s.data) for s in gang.secrets] == [("hf", (("token", VALUE),))]
    assert released == []
    await w.step(30.0)
    assert (await w.job(job_id)).phase is JobPhase.SUCCEEDED
    assert released == [("vision", job_id, 1)]


async def test_a_job_without_secrets_sends_none_and_releases_nothing(
    world: tuple[World, SecretStore, list[GangWorkload], list[tuple[str, str, int]]],
) -> None:
    w, _, sent, released = world
    job_id = await submit(w, a_job("plain", duration="10s"))
    await w.step()
    await w.step(30.0)
    assert (await w.job(job_id)).phase is JobPhase.SUCCEEDED
    assert [g.secrets for g in sent] == [()]
    assert released == []


async def test_a_secret_deleted_before_dispatch_fails_the_job_naming_it(
    world: tuple[World, SecretStore, list[GangWorkload], list[tuple[str, str, int]]],
) -> None:
    w, _, sent, _ = world
    job_id = await submit(w, a_secret_job("s2"))
    await w.step()
    job = await w.job(job_id)
    assert job.phase is JobPhase.FAILED
    assert "secret 'hf' of tenant 'vision' was deleted after the job was submitted" in job.message
    assert sent == []
