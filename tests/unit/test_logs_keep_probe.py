"""When the keeper asks a cluster why a dispatched gang waits (issue 33).

Each probe is a call to the cluster. It asked at the first tick that saw a gang pending, so a
burst's thousands of gangs, each seen pending for a moment before its pods started, made as many
calls; and the reconciler's tick, which now turns every second during a burst, gave each of them
a task. Now a gang is first asked about once it has been seen pending for WAIT_PROBE_S (an image
that never pulls still shows within that), then every WAIT_PROBE_S, and the tick skips a pending
gang with no probe due (`Reconciler._waits_on`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from clusters.api import GangEvent, GangPhase, GangStatus, LogOptions, ReplicaState
from federation.joblogs.archive import LogArchive, LogsSettings
from federation.scheduling.logs_keep import WAIT_PROBE_S, AttemptKeeper
from federation.store.jobs import JobPlacement, JobRecord, Owner
from federation.store.kv_memory import MemoryKv
from placement.model import CapacityKind, ClusterName, GpuType, JobId, JobPhase, TenantId
from tests.conftest import build_job
from tests.unit.reconcile_world import Clock


class Waiting:
    """A cluster whose one pod waits on an image that never pulls; counts the calls asking."""

    def __init__(self) -> None:
        self.asked = 0

    async def replicas(self, tenant: TenantId, job_id: JobId, attempt: int) -> list[ReplicaState]:
        self.asked += 1
        return [
            ReplicaState(
                "g-worker-0", "worker", 0, False, "n1", "Pending", 0, None, "ImagePullBackOff", "", None, None
            )
        ]

    async def events(self, tenant: TenantId, job_id: JobId, attempt: int) -> list[GangEvent]:
        return []

    async def pod_log(
        self, tenant: TenantId, replica: ReplicaState, options: LogOptions
    ) -> AsyncIterator[bytes]:
        yield b""


class Members:
    def __init__(self, backend: Waiting) -> None:
        self.backend = backend

    def get(self, cluster: ClusterName) -> Waiting:
        return self.backend


def dispatched_job() -> JobRecord:
    job = build_job("waits", tenant="vision", replicas=1, gpus=1, gpu="A100")
    placed = replace(
        job,
        placement=JobPlacement(ClusterName("c1"), GpuType("A100"), CapacityKind.PRIVATE, 1.0),
        phase=JobPhase.ADMITTED,
    )
    return placed.transition(JobPhase.DISPATCHED, by=Owner.DISPATCHER, at_s=90.0)


async def test_a_pending_gang_is_asked_about_once_it_has_waited_a_while() -> None:
    cluster = Waiting()
    clock = Clock()
    keeper = AttemptKeeper(
        LogArchive(MemoryKv(), LogsSettings()),
        Members(cluster),  # type: ignore[arg-type]
        clock=clock,
    )
    job = dispatched_job()
    pending = GangStatus(job.job_id, job.attempt, GangPhase.PENDING, live_pods=1)
    # First sight: no call, nothing to write, and no probe due for the tick to make a task for.
    assert await keeper.waiting(job, pending) is None
    assert not keeper.probe_due(job)
    clock.now += WAIT_PROBE_S / 2
    assert not keeper.probe_due(job)
    assert cluster.asked == 0
    clock.now += WAIT_PROBE_S / 2
    assert keeper.probe_due(job)
    told = await keeper.waiting(job, pending)
    assert told is not None
    assert told.reason == "ImagePullBackOff"
    assert cluster.asked == 1
    # Then every WAIT_PROBE_S, not every tick.
    assert await keeper.waiting(told, pending) is None
    assert cluster.asked == 1
    clock.now += WAIT_PROBE_S
    assert await keeper.waiting(told, pending) is None  # the same reason: nothing to write
    assert cluster.asked == 2
