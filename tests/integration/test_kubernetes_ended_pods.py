"""An ended attempt's pods from the backend's pod watch instead of a list call (issue 33).

The keeper reads every ended attempt's pods before it keeps their logs: a list call a job (a
request built, sent, served by the cluster's API server, and its answer parsed) where the pod watch
already holds them. Against a simulated cluster, through the official client, these hold the
backend to:
- the same replicas as the list (`replicas`, what `describe` shows), for a gang whose pods have all
  finished, without a list call;
- no answer from the watch (so the caller lists) while a pod still runs, or when the watch holds
  another number of pods than the gang has;
- the keeper keeping an ended attempt's replicas and logs with no list call, as it kept them with it;
- another tenant's namespace, or a third party's pod labelled as the gang in another namespace,
  never answering for the gang's pods.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s

from clusters.api import GangPhase, GangWorkload
from clusters.kubernetes import KubernetesBackend
from clusters.kubernetes.inventory import GANG_LABEL
from clusters.kubernetes.names import object_name
from federation.joblogs.archive import LogArchive, LogsSettings
from federation.scheduling.logs_keep import AttemptKeeper
from federation.store.jobs import JobPlacement, JobRecord, Owner
from federation.store.kv_memory import MemoryKv
from placement.model import CapacityKind, ClusterName, GpuType, JobPhase, TenantId
from tests.conftest import build_job
from tests.contract.conftest import no_leaked_threads
from tests.contract.helpers import a_gang, eventually, wait_phase
from tests.integration.kube_world import world_fixture  # noqa: F401 (the `world` fixture)

pytestmark = pytest.mark.usefixtures(no_leaked_threads.__name__)

NS = "gpufed-team-a"


class PodLists:
    """Counts the backend's pod list calls (`PodReader.gang_pods`); the API is still called."""

    def __init__(self, backend: KubernetesBackend) -> None:
        self.calls = 0
        reader = backend._inspection._reader
        listing: Callable[[str], list[dict[str, Any]]] = reader.gang_pods

        def counted(gang: str) -> list[dict[str, Any]]:
            self.calls += 1
            return listing(gang)

        reader.gang_pods = counted  # type: ignore[method-assign]


async def _ended(backend: KubernetesBackend, gang: GangWorkload, pods: int) -> Any:
    """The watch's answer once it has seen every pod finish (it may be a moment behind the gang)."""

    async def probe() -> Any:
        return await backend.ended_replicas(gang.tenant, gang.job_id, gang.attempt, pods)

    return await eventually(probe, what=f"{gang.name}'s pods finished in the pod watch")


async def test_an_ended_gangs_pods_come_from_the_watch_as_the_list_shows_them(
    world: tuple[KubernetesBackend, Any],
) -> None:
    backend, api = world
    gang = a_gang("ended-1", replicas=2, gpus=1, duration_s=0.2)
    await backend.dispatch(gang)
    await wait_phase(backend, gang, GangPhase.SUCCEEDED)
    lists = PodLists(backend)
    watched = await _ended(backend, gang, 2)
    assert lists.calls == 0
    listed = await backend.replicas(gang.tenant, gang.job_id, gang.attempt)
    assert lists.calls == 1
    assert list(watched) == list(listed)
    assert len(watched) == 2
    assert all(r.phase == "Succeeded" and r.exit_code == 0 for r in watched)
    # And as the API itself shows them, through the official client (what kubectl reads); on a
    # thread, as the simulated cluster serves on this event loop.
    found = await asyncio.to_thread(
        k8s.CoreV1Api(api).list_namespaced_pod,
        NS,
        label_selector=f"{GANG_LABEL}={object_name(gang.job_id, 1)}",
    )
    assert sorted(r.pod for r in watched) == sorted(p.metadata.name for p in found.items)
    assert all(p.status.phase == "Succeeded" for p in found.items)


async def test_the_watch_does_not_answer_for_a_running_gang_or_another_pod_count(
    world: tuple[KubernetesBackend, Any],
) -> None:
    backend, _ = world
    running = a_gang("running-1", replicas=2, gpus=1, duration_s=600.0)
    await backend.dispatch(running)
    await wait_phase(backend, running, GangPhase.RUNNING)
    assert await backend.ended_replicas(running.tenant, running.job_id, running.attempt, 2) is None
    done = a_gang("done-1", replicas=2, gpus=1, duration_s=0.2)
    await backend.dispatch(done)
    await wait_phase(backend, done, GangPhase.SUCCEEDED)
    await _ended(backend, done, 2)
    # The gang has two pods: a caller expecting three (or one) is not told these are all.
    assert await backend.ended_replicas(done.tenant, done.job_id, done.attempt, 3) is None
    assert await backend.ended_replicas(done.tenant, done.job_id, done.attempt, 1) is None
    # Another tenant's namespace holds no pod of the gang.
    other = TenantId("team-b")
    assert await backend.ended_replicas(other, done.job_id, done.attempt, 2) is None


class Members:
    def __init__(self, backend: KubernetesBackend) -> None:
        self.backend = backend

    def get(self, cluster: ClusterName) -> KubernetesBackend:
        return self.backend


def _job_of(gang: GangWorkload) -> JobRecord:
    job = build_job(gang.job_id, tenant=gang.tenant, replicas=len(gang.replicas), gpus=1, gpu="H100")
    placed = dataclasses.replace(
        job,
        phase=JobPhase.ADMITTED,
        placement=JobPlacement(ClusterName("sim"), GpuType("H100"), CapacityKind.ON_DEMAND, 1.0),
    )
    dispatched = placed.transition(JobPhase.DISPATCHED, by=Owner.DISPATCHER, at_s=90.0)
    return dispatched.transition(JobPhase.RUNNING, by=Owner.STATUS, at_s=100.0)


async def test_the_keeper_keeps_an_ended_attempt_without_a_pod_list(
    world: tuple[KubernetesBackend, Any],
) -> None:
    backend, _ = world
    gang = a_gang("kept-1", replicas=2, gpus=1, duration_s=0.2)
    await backend.dispatch(gang)
    status = await wait_phase(backend, gang, GangPhase.SUCCEEDED)
    await _ended(backend, gang, 2)
    archive = LogArchive(MemoryKv(), LogsSettings())
    keeper = AttemptKeeper(archive, Members(backend))  # type: ignore[arg-type]
    job = _job_of(gang)
    lists = PodLists(backend)
    ended = await keeper.ended(job, job.transition(JobPhase.SUCCEEDED, by=Owner.STATUS, at_s=200.0), status)
    assert lists.calls == 0
    kept = await archive.summary(job.job_id, job.attempt, 201.0)
    assert kept is not None
    assert kept.note == ""
    assert ended.reason == ""
    assert sorted((r.task, r.replica) for r in kept.replicas) == [("worker", 0), ("worker", 1)]
    listed = {r.pod: r for r in await backend.replicas(gang.tenant, gang.job_id, gang.attempt)}
    for r in kept.replicas:
        assert r.state == listed[r.state.pod]
        data = await archive.log(job.job_id, job.attempt, r.task, r.replica)
        assert r.size_bytes == len(data) > 0


async def test_a_third_partys_pod_with_the_gangs_label_elsewhere_is_not_taken_for_one_of_its_pods(
    world: tuple[KubernetesBackend, Any],
) -> None:
    """Another namespace's pod labelled as the gang (another federation's, or anyone's who may make
    pods there) is neither shown with the gang's pods nor counted among them."""
    backend, api = world
    gang = a_gang("labelled-1", replicas=1, gpus=1, duration_s=0.2)
    core = k8s.CoreV1Api(api)
    await asyncio.to_thread(core.create_namespace, {"metadata": {"name": "elsewhere"}})
    impostor = {
        "metadata": {"name": "impostor", "labels": {GANG_LABEL: object_name(gang.job_id, gang.attempt)}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox:1"}]},
    }
    await asyncio.to_thread(core.create_namespaced_pod, "elsewhere", impostor)
    await backend.dispatch(gang)
    await wait_phase(backend, gang, GangPhase.SUCCEEDED)
    (watched,) = await _ended(backend, gang, 1)
    assert watched.pod != "impostor"
    assert [r.pod for r in await backend.replicas(gang.tenant, gang.job_id, gang.attempt)] == [watched.pod]
