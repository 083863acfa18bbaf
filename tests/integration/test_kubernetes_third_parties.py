"""The Kubernetes backend when someone else deletes what it made: the tenant's namespace, or a gang
object without its pods (`--cascade=orphan`). Driven through the Kubernetes API of a simulated
cluster, as a person with kubectl would; the end-to-end versions are in tests/e2e/test_third_parties.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from clusters.api import ClusterUnreachable, GangPhase, GangRejected, GangStatus, VanishedAttempt
from clusters.kubernetes.errors import NamespaceTerminating, translate
from clusters.kubernetes.names import object_name
from tests.contract.conftest import no_leaked_threads
from tests.contract.helpers import a_gang, eventually, status_of, wait_phase
from tests.integration.test_kubernetes_backend import NS, World, open_world

pytestmark = pytest.mark.usefixtures(no_leaked_threads.__name__)


@pytest.fixture
async def vc_world(tmp_path: Path) -> AsyncIterator[World]:
    async for w in open_world(tmp_path, volcano=True):
        yield w


@pytest.fixture(params=["indexed", "volcano"])
async def any_world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    async for w in open_world(tmp_path, volcano=request.param == "volcano"):
        yield w


async def test_a_deleted_tenant_namespace_is_made_again_by_the_next_dispatch(any_world: World) -> None:
    first = a_gang("ns-1", replicas=1, gpus=4, duration_s=60.0)
    await any_world.backend.dispatch(first)
    await wait_phase(any_world.backend, first, GangPhase.RUNNING)

    await any_world.call(any_world.core.delete_namespace, NS)

    async def gone() -> bool:
        return await status_of(any_world.backend, first) is None

    await eventually(gone, what="the gang to go with its namespace")
    # Before: the backend remembered it had made the namespace, and every create met 404 for good.
    second = a_gang("ns-2", replicas=1, gpus=4, duration_s=60.0)
    await any_world.backend.dispatch(second)
    await wait_phase(any_world.backend, second, GangPhase.RUNNING)
    namespace = await any_world.call(any_world.core.read_namespace, NS)
    assert namespace.metadata.labels["app.kubernetes.io/managed-by"] == "gpufed"


async def test_a_dispatch_while_the_tenant_namespace_terminates_backs_off_then_succeeds(
    any_world: World,
) -> None:
    first = a_gang("term-1", replicas=1, gpus=4, duration_s=60.0)
    await any_world.backend.dispatch(first)
    await wait_phase(any_world.backend, first, GangPhase.RUNNING)
    # A third party's pod that ignores SIGTERM keeps the namespace Terminating for its grace period.
    holder = {
        "metadata": {"name": "holder", "annotations": {"sim.gpufed.io/ignore-sigterm": "true"}},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:1"}],
        },
    }
    await any_world.call(any_world.core.create_namespaced_pod, NS, holder)

    async def holder_runs() -> bool:
        pod = await any_world.call(any_world.core.read_namespaced_pod, "holder", NS)
        return bool(pod.status.phase == "Running")

    await eventually(holder_runs, what="the third party's pod to run")
    old_uid = (await any_world.call(any_world.core.read_namespace, NS)).metadata.uid
    await any_world.call(any_world.core.delete_namespace, NS)

    second = a_gang("term-2", replicas=1, gpus=4, duration_s=60.0)
    with pytest.raises(NamespaceTerminating) as refused:
        await any_world.backend.dispatch(second)
    assert refused.value.retryable
    assert "is being terminated" in str(refused.value)
    terminating = await any_world.call(any_world.core.read_namespace, NS)
    assert terminating.status.phase == "Terminating"

    # Tried again after a back-off, as the federation does with a retryable error, until it takes.
    refusals = [refused.value]

    async def dispatched() -> bool:
        try:
            await any_world.backend.dispatch(second)
        except NamespaceTerminating as error:
            refusals.append(error)
            return False
        return True

    await eventually(dispatched, timeout_s=20.0, interval_s=0.25, what="the dispatch to take")
    await wait_phase(any_world.backend, second, GangPhase.RUNNING)
    namespace = await any_world.call(any_world.core.read_namespace, NS)
    # A namespace made again after the old one went, not the old one revived.
    assert namespace.metadata.uid != old_uid
    assert namespace.status.phase == "Active"
    assert namespace.metadata.labels["app.kubernetes.io/managed-by"] == "gpufed"
    assert len(refusals) >= 2  # the holder kept it Terminating for ~2 s: it was refused meanwhile
    assert await status_of(any_world.backend, first) is None


async def test_pods_orphaned_by_their_gang_object_are_reported_and_removed_by_cancel(
    any_world: World,
) -> None:
    gang = a_gang("orph-1", replicas=2, gpus=4, duration_s=60.0)
    await any_world.backend.dispatch(gang)
    await wait_phase(any_world.backend, gang, GangPhase.RUNNING)
    name = object_name(gang.job_id, gang.attempt)
    await _delete_gang_object(any_world, name, "Orphan")

    async def orphaned() -> GangStatus | None:
        status = await status_of(any_world.backend, gang)
        return status if status is not None and status.orphaned else None

    status = await eventually(orphaned, what="the pods to be reported without their gang object")
    assert status.live_pods == 2
    assert status.phase.is_final
    assert len(await any_world.pods_of(name)) == 2

    # The collector's (and the reconciler's) cancel removes what the gang object left behind.
    await any_world.backend.cancel(gang.job_id, gang.attempt, 0.0)

    async def cleared() -> bool:
        return not await any_world.pods_of(name) and await status_of(any_world.backend, gang) is None

    await eventually(cleared, what="the orphaned pods to be deleted")
    services = await any_world.call(any_world.core.list_namespaced_service, NS)
    assert name not in [s.metadata.name for s in services.items]
    if any_world.backend.uses_volcano:
        groups = await any_world.call(
            any_world.custom.list_namespaced_custom_object,
            "scheduling.volcano.sh",
            "v1beta1",
            NS,
            "podgroups",
        )
        assert name not in [g["metadata"]["name"] for g in groups["items"]]


async def test_garbage_collection_removes_pods_whose_gang_object_was_orphan_deleted(vc_world: World) -> None:
    gang = a_gang("orph-gc", replicas=2, gpus=4, duration_s=60.0)
    await vc_world.backend.dispatch(gang)
    await wait_phase(vc_world.backend, gang, GangPhase.RUNNING)
    name = object_name(gang.job_id, gang.attempt)
    await vc_world.call(
        vc_world.custom.delete_namespaced_custom_object,
        "batch.volcano.sh",
        "v1alpha1",
        NS,
        "jobs",
        name,
        body={"propagationPolicy": "Orphan"},
    )

    async def orphaned() -> bool:
        status = await status_of(vc_world.backend, gang)
        return status is not None and status.orphaned

    await eventually(orphaned, what="the orphaned pods to be reported")
    collected = await vc_world.backend.collect_garbage(set(), grace_period_s=0.0)
    assert (gang.job_id, gang.attempt) in collected

    async def cleared() -> bool:
        return not await vc_world.pods_of(name)

    await eventually(cleared, what="the orphaned pods to be collected")


@pytest.mark.parametrize(
    ("status", "message", "expected", "retryable"),
    [
        pytest.param(
            403,
            'jobs.batch "g-a1" is forbidden: unable to create new content in namespace gpufed-team-a '
            "because it is being terminated",
            NamespaceTerminating,
            True,
            id="namespace-terminating-is-not-now",
        ),
        pytest.param(403, "forbidden: User cannot create jobs", ClusterUnreachable, True, id="rbac"),
        pytest.param(404, 'namespaces "gpufed-team-a" not found', GangRejected, False, id="not-found"),
    ],
)
def test_a_real_api_servers_answers_while_a_namespace_goes(
    status: int, message: str, expected: type[Exception], retryable: bool
) -> None:
    """What a real API server answers a create while a deleted namespace empties (the simulator
    removes a namespace at once, so the 403 is only seen here)."""
    error = ApiException(status=status, reason="Forbidden" if status == 403 else "Not Found")
    error.body = json.dumps({"kind": "Status", "message": message, "code": status})
    translated = translate(error, "sim", "create gang g-a1", dispatching=True)
    assert type(translated) is expected
    assert translated.retryable is retryable


async def test_a_gang_deleted_whole_is_remembered_with_when_its_pods_ran(any_world: World) -> None:
    """A third party deletes the gang object and its pods (foreground, as `kubectl delete job` with
    `--cascade=foreground`): the backend stops reporting it, but says when its pods ran, by the
    pods' own startTime as the API served them, so that federation charges what it never saw run."""
    gang = a_gang("blink-1", replicas=2, gpus=4, duration_s=60.0)
    await any_world.backend.dispatch(gang)
    await wait_phase(any_world.backend, gang, GangPhase.RUNNING)
    name = object_name(gang.job_id, gang.attempt)
    pods = await any_world.pods_of(name)
    assert len(pods) == 2
    started_s = max(p.status.start_time.timestamp() for p in pods)
    assert any_world.backend.vanished(gang.job_id, gang.attempt) is None, "still there"
    # Taken before the deletion is asked: the pods end after it. Taken after the call returned (as
    # it was), a busy machine's late answer put it past a pod's end, which Kubernetes keeps in whole
    # seconds (the containers' finishedAt, truncated): up to a second early already.
    asked_s = time.time()
    await _delete_gang_object(any_world, name, "Foreground")

    async def gone() -> bool:
        return not await any_world.pods_of(name) and await status_of(any_world.backend, gang) is None

    await eventually(gone, what="the gang and its pods to go")

    async def seen() -> VanishedAttempt | None:
        return any_world.backend.vanished(gang.job_id, gang.attempt)

    remembered = await eventually(seen, what="the backend to have seen the pods' deletion")
    assert remembered.started_at_s == started_s
    assert math.floor(asked_s) <= remembered.ended_at_s <= time.time(), (asked_s, remembered)
    # Another attempt of the same job, and another job, are not confused with it.
    assert any_world.backend.vanished(gang.job_id, gang.attempt + 1) is None


async def _delete_gang_object(world: World, name: str, propagation: str) -> None:
    """Delete a gang's object as a person with kubectl would (`--cascade=orphan` or `foreground`)."""
    body = {"propagationPolicy": propagation}
    if world.backend.uses_volcano:
        await world.call(
            world.custom.delete_namespaced_custom_object,
            "batch.volcano.sh",
            "v1alpha1",
            NS,
            "jobs",
            name,
            body=body,
        )
    else:
        await world.call(world.batch.delete_namespaced_job, name, NS, body=body)
