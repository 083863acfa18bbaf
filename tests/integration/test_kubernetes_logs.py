"""The Kubernetes backend's describe and log reads against a simulated cluster, by the official client.

Pods of a gang with their status details (a non-zero exit, an OOM kill, an image that cannot be
pulled), the events of the gang's objects, and pod logs read whole, tailed and followed until the
container ends. The simulated kubelet fails containers by pod annotation (docs/kubernetes.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clusters.api import GangInspector, LogOptions, LogUnavailable, ReplicaState
from clusters.kubernetes import KubernetesBackend
from clusters.kubernetes.names import object_name
from placement.model import JobId, TenantId
from tests.contract.conftest import POOLS, kube_config, no_leaked_threads
from tests.contract.helpers import a_gang, eventually
from tests.contract.simulated import running_sim

pytestmark = pytest.mark.usefixtures(no_leaked_threads.__name__)
TEAM = TenantId("team-a")


@pytest.fixture(params=["indexed", "volcano"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KubernetesBackend]:
    volcano = request.param == "volcano"
    async with running_sim(tmp_path, POOLS, volcano=volcano, log_interval_s=0.05) as (_sim, kubeconfig):
        config = kube_config("sim", kubeconfig)
        settings = dataclasses.replace(config.settings, use_volcano=None if volcano else False)
        async with KubernetesBackend(dataclasses.replace(config, settings=settings)) as b:
            assert await b.wait_synced()
            yield b


async def read_all(backend: KubernetesBackend, replica: ReplicaState, options: LogOptions) -> str:
    return b"".join([c async for c in backend.pod_log(TEAM, replica, options)]).decode()


async def test_replicas_and_logs_of_a_gang(backend: KubernetesBackend) -> None:
    assert isinstance(backend, GangInspector)
    gang = a_gang("logs-1", replicas=2, gpus=1, duration_s=1.0)
    await backend.dispatch(gang)

    async def all_running() -> bool:
        found = await backend.replicas(TEAM, JobId("logs-1"), 1)
        return len(found) == 2 and all(r.phase == "Running" for r in found)

    await eventually(all_running, what="both pods running")
    replicas = await backend.replicas(TEAM, JobId("logs-1"), 1)
    assert sorted(r.index for r in replicas) == [0, 1]
    assert all(r.node for r in replicas)
    # Another tenant's view of the same job id is empty: the namespace is the tenant's.
    assert await backend.replicas(TenantId("team-b"), JobId("logs-1"), 1) == []
    followed = await read_all(backend, replicas[0], LogOptions(follow=True))
    assert "started" in followed
    assert "exited with code 0" in followed
    lines = followed.splitlines()
    assert len(lines) > 5
    tail = await read_all(backend, replicas[0], LogOptions(tail_lines=2))
    assert tail.splitlines() == lines[-2:]
    stamped = await read_all(backend, replicas[0], LogOptions(tail_lines=1, timestamps=True))
    assert stamped.split(" ", 1)[0].endswith("Z")
    limited = await read_all(backend, replicas[0], LogOptions(limit_bytes=10))
    assert len(limited.encode()) <= 11
    events = await backend.events(TEAM, JobId("logs-1"), 1)
    assert any(e.object_name.startswith(object_name(JobId("logs-1"), 1)) for e in events)


async def test_a_missing_pod_has_no_log(backend: KubernetesBackend) -> None:
    ghost = ReplicaState("nope-0", "worker", 0, True, "", "Pending", 0, None, "", "")
    with pytest.raises(LogUnavailable):
        await read_all(backend, ghost, LogOptions())


async def test_exit_code_is_reported(backend: KubernetesBackend) -> None:
    await backend.dispatch(a_gang("bad-1", replicas=1, gpus=1, duration_s=0.2, exit_code=3))

    async def failed() -> bool:
        found = await backend.replicas(TEAM, JobId("bad-1"), 1)
        return bool(found) and found[0].exit_code == 3

    await eventually(failed, what="the pod to fail")
    replica = (await backend.replicas(TEAM, JobId("bad-1"), 1))[0]
    assert replica.reason == "Error"
    assert replica.phase == "Failed"
