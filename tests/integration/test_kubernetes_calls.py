"""The calls a job costs its member cluster's API, against a simulated cluster (issue 33).

Each call to a member cluster is a request the server builds and an answer it parses: most of the
server's CPU per job in bench/scale.py. These tests hold the backend to the calls a gang needs, and
the API (read through the official client, as kubectl would) to the same end state as before:
- a gang without a Secret of its own is deleted without a call for one, and a gang with one has it
  deleted with it;
- a Volcano Job's Service (its svc plugin's, owned by the Job) goes with the Job, without a call;
- a burst of a new tenant's first gangs creates its namespace and its queue once;
- the keeper's bounded read of a log (a tail, whole) gives the same lines as the stream.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from kubernetes import client as k8s

from clusters.api import GangPhase, GangSecret, GangWorkload, LogOptions
from clusters.kubernetes import KubernetesBackend
from clusters.kubernetes.names import object_name
from clusters.kubernetes.status import NO_SECRET, SECRET_KEY
from tests.contract.conftest import no_leaked_threads
from tests.contract.helpers import a_gang, eventually, status_of, wait_phase
from tests.integration.kube_world import SETUP_CALLS, Counted, world_fixture  # noqa: F401 (the `world` fixture)

pytestmark = pytest.mark.usefixtures(no_leaked_threads.__name__)

NS = "gpufed-team-a"


def _with_secret(gang: GangWorkload) -> GangWorkload:
    return dataclasses.replace(gang, secrets=(GangSecret("hf", (("token", b"not-a-real-token"),)),))


async def _names(api: Any, kind: str) -> set[str]:
    core = k8s.CoreV1Api(api)
    lister = core.list_namespaced_secret if kind == "secrets" else core.list_namespaced_service
    found = await asyncio.to_thread(lister, NS)
    return {item.metadata.name for item in found.items}


async def _gang_annotations(api: Any, backend: KubernetesBackend, gang: GangWorkload) -> dict[str, str]:
    name = object_name(gang.job_id, gang.attempt)
    if backend.uses_volcano:
        obj = await asyncio.to_thread(
            k8s.CustomObjectsApi(api).get_namespaced_custom_object,
            "batch.volcano.sh",
            "v1alpha1",
            NS,
            "jobs",
            name,
        )
        return dict(obj["metadata"].get("annotations") or {})
    job = await asyncio.to_thread(k8s.BatchV1Api(api).read_namespaced_job, name, NS)
    return dict(job.metadata.annotations or {})


async def test_deleting_a_gang_calls_for_its_secret_only_when_it_has_one(
    world: tuple[KubernetesBackend, Any],
) -> None:
    backend, api = world
    plain = a_gang("plain-1", replicas=1, gpus=1, duration_s=60.0)
    secret = _with_secret(a_gang("secret-1", replicas=1, gpus=1, duration_s=60.0))
    for gang in (plain, secret):
        await backend.dispatch(gang)
        await wait_phase(backend, gang, GangPhase.RUNNING)
    secret_name = f"{object_name(secret.job_id, secret.attempt)}-secrets"
    # The gang object says which, as the API shows it.
    assert (await _gang_annotations(api, backend, plain))[SECRET_KEY] == NO_SECRET
    assert (await _gang_annotations(api, backend, secret))[SECRET_KEY] == secret_name
    assert secret_name in await _names(api, "secrets")

    counted = Counted(backend)
    await backend.cancel(plain.job_id, plain.attempt, 0.0)
    assert counted.calls["delete_secret"] == 0, "a gang without a Secret costs no call for one"
    await backend.cancel(secret.job_id, secret.attempt, 0.0)
    assert counted.calls["delete_secret"] == 1

    async def secret_gone() -> bool:
        return secret_name not in await _names(api, "secrets")

    await eventually(secret_gone, what="the gang's Secret to be deleted with it")
    # The Indexed Job's headless Service is gpufed's to delete; a Volcano Job's goes with the Job.
    assert counted.calls["delete_service"] == (0 if backend.uses_volcano else 2)

    async def no_services() -> bool:
        return not await _names(api, "services")

    await eventually(no_services, what="no Service of either gang left on the cluster")


async def test_a_gang_made_before_the_mark_has_its_secret_deleted_by_name(
    world: tuple[KubernetesBackend, Any],
) -> None:
    """A gang object without the annotation (made by an earlier gpufed) may have a Secret."""
    backend, api = world
    gang = _with_secret(a_gang("old-1", replicas=1, gpus=1, duration_s=60.0))
    await backend.dispatch(gang)
    await wait_phase(backend, gang, GangPhase.RUNNING)
    name = object_name(gang.job_id, gang.attempt)
    patch = {"metadata": {"annotations": {SECRET_KEY: None}}}
    if backend.uses_volcano:
        await asyncio.to_thread(
            k8s.CustomObjectsApi(api).patch_namespaced_custom_object,
            "batch.volcano.sh",
            "v1alpha1",
            NS,
            "jobs",
            name,
            patch,
        )
    else:
        await asyncio.to_thread(k8s.BatchV1Api(api).patch_namespaced_job, name, NS, patch)

    async def unmarked() -> bool:
        return SECRET_KEY not in await _gang_annotations(api, backend, gang) and all(
            g.may_have_secret for g in backend._gangs().values()
        )

    await eventually(unmarked, what="the watch to show the gang without its mark")
    await backend.cancel(gang.job_id, gang.attempt, 0.0)

    async def secret_gone() -> bool:
        return f"{name}-secrets" not in await _names(api, "secrets")

    await eventually(secret_gone, what="the old gang's Secret to be deleted")


async def test_a_burst_of_a_new_tenants_gangs_makes_its_namespace_and_queue_once(
    world: tuple[KubernetesBackend, Any],
) -> None:
    backend, api = world
    counted = Counted(backend)
    gangs = [a_gang(f"burst-{i}", replicas=1, gpus=1, duration_s=60.0) for i in range(12)]
    await asyncio.gather(*(backend.dispatch(g) for g in gangs))
    assert counted.calls["create_namespace"] == 1
    assert counted.calls["label_namespace"] == 0, "made here, with its level: nothing to label"
    assert counted.calls["create_queue"] == (1 if backend.uses_volcano else 0)
    namespaces = await asyncio.to_thread(k8s.CoreV1Api(api).list_namespace)
    assert NS in {n.metadata.name for n in namespaces.items}
    for gang in gangs:
        assert await status_of(backend, gang) is not None


async def test_a_bounded_read_gives_the_lines_the_stream_gives(
    world: tuple[KubernetesBackend, Any],
) -> None:
    backend, _ = world
    gang = a_gang("tail-1", replicas=1, gpus=1, duration_s=0.2)
    await backend.dispatch(gang)
    await wait_phase(backend, gang, GangPhase.SUCCEEDED)
    (replica,) = await backend.replicas(gang.tenant, gang.job_id, gang.attempt)

    async def read(options: LogOptions) -> bytes:
        return b"".join([chunk async for chunk in backend.pod_log(gang.tenant, replica, options)])

    streamed = await read(LogOptions(timestamps=True))
    assert streamed, "the simulated container printed lines"
    assert await read(LogOptions(timestamps=True, tail_lines=1000)) == streamed
    last = streamed.rstrip(b"\n").rsplit(b"\n", 1)[-1] + b"\n"
    assert await read(LogOptions(timestamps=True, tail_lines=1)) == last
