"""The keeper of an ended attempt: what it keeps of an attempt gpufed stopped, and the marks it
leaves on a copy that may lack lines (issue 30, item 3). The cluster is a fake with pods that go
when told; the end-to-end proof against kubectl is tests/e2e/test_user_logs_kept.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

from clusters.api import GangEvent, GangPhase, GangStatus, LogOptions, ReplicaState
from federation.joblogs.archive import LogArchive, LogsSettings
from federation.scheduling.logs_keep import AttemptKeeper
from federation.store.jobs import JobPlacement, JobRecord, Owner
from federation.store.kv_memory import MemoryKv
from placement.model import CapacityKind, ClusterName, GpuType, JobId, JobPhase, TenantId
from tests.conftest import build_job


class Pods:
    """A cluster's pods of one gang: each prints `lines` lines; `gone()` removes them all."""

    def __init__(self, replicas: int, lines: int) -> None:
        self.pods = [
            ReplicaState(
                f"g-worker-{i}", "worker", i, False, "n1", "Running", 0, None, "", "", 100.0, None, "worker"
            )
            for i in range(replicas)
        ]
        self.lines = lines

    def gone(self) -> None:
        self.pods = []

    async def replicas(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[ReplicaState]:
        return list(self.pods)

    async def events(self, tenant: TenantId, job_id: JobId, attempt: int) -> Sequence[GangEvent]:
        return []

    async def pod_log(
        self, tenant: TenantId, replica: ReplicaState, options: LogOptions
    ) -> AsyncIterator[bytes]:
        lines = [f"2026-03-02T09:14:07.{k + 1}Z {replica.pod} line {k}" for k in range(self.lines)]
        if options.tail_lines is not None:
            lines = lines[-options.tail_lines :]
        yield "".join(f"{line}\n" for line in lines).encode()


class Members:
    def __init__(self, backend: Pods) -> None:
        self.backend = backend

    def get(self, cluster: ClusterName) -> Pods:
        return self.backend


def running_job() -> JobRecord:
    job = build_job("stopped", tenant="vision", replicas=2, gpus=1, gpu="A100")
    placed = replace(
        job, placement=JobPlacement(ClusterName("c1"), GpuType("A100"), CapacityKind.PRIVATE, 1.0)
    )
    admitted = replace(placed, phase=JobPhase.ADMITTED)
    dispatched = admitted.transition(JobPhase.DISPATCHED, by=Owner.DISPATCHER, at_s=90.0)
    return dispatched.transition(JobPhase.RUNNING, by=Owner.STATUS, at_s=100.0)


def test_a_cancelled_attempt_keeps_the_copy_taken_while_it_was_stopped() -> None:
    async def scenario() -> None:
        pods = Pods(replicas=2, lines=3)
        archive = LogArchive(MemoryKv(), LogsSettings())
        keeper = AttemptKeeper(archive, Members(pods), clock=lambda: 200.0)  # type: ignore[arg-type]
        job = running_job()
        stopping = GangStatus(job.job_id, job.attempt, GangPhase.RUNNING, live_pods=2)
        await keeper.stopping(job, stopping)
        pods.gone()  # the cancel deleted the gang; its pods went within their grace period
        cancelled = job.transition(JobPhase.CANCELLED, by=Owner.DISPATCHER, at_s=201.0)
        await keeper.ended(job, cancelled, None)
        kept = await archive.summary(job.job_id, job.attempt, 202.0)
        assert kept is not None
        assert kept.started_at_s == 100.0  # the RUNNING event, as the ledger has it
        assert sorted((r.task, r.replica) for r in kept.replicas) == [("worker", 0), ("worker", 1)]
        for r in kept.replicas:
            assert r.size_bytes > 0
            assert r.cut.startswith("copied at 1970-01-01T00:03:20Z while the attempt was being stopped")
        data = await archive.log(job.job_id, job.attempt, "worker", 1)
        assert data.decode().splitlines()[-1] == "2026-03-02T09:14:07.3Z g-worker-1 line 2"

    asyncio.run(scenario())


def test_a_copy_larger_than_keep_kib_says_its_first_lines_were_not_kept() -> None:
    async def scenario() -> None:
        pods = Pods(replicas=1, lines=200)  # about 8 KiB of lines
        archive = LogArchive(MemoryKv(), LogsSettings(keep_kib=1))
        keeper = AttemptKeeper(archive, Members(pods), clock=lambda: 200.0)  # type: ignore[arg-type]
        job = running_job()
        done = GangStatus(job.job_id, job.attempt, GangPhase.SUCCEEDED, started_at_s=99.0)
        succeeded = job.transition(JobPhase.SUCCEEDED, by=Owner.STATUS, at_s=201.0)
        await keeper.ended(job, succeeded, done)
        kept = await archive.summary(job.job_id, job.attempt, 202.0)
        assert kept is not None
        assert kept.started_at_s == 99.0
        (replica,) = kept.replicas
        assert replica.size_bytes <= 1024
        assert replica.cut == "its first lines were not kept (the last 1 KiB are, logs.keepKiB)"

    asyncio.run(scenario())


def test_an_attempt_whose_gang_gave_no_start_is_timed_by_the_pods_it_kept() -> None:
    """A gang can end before the pod watch showed its pods started, so its status names no start
    and the job was never RUNNING; the pods the keeper reads at the end do, and the reconciler takes
    that start for the ledger (once: a second ask gives nothing)."""

    async def scenario() -> None:
        pods = Pods(replicas=2, lines=1)
        archive = LogArchive(MemoryKv(), LogsSettings())
        keeper = AttemptKeeper(archive, Members(pods), clock=lambda: 200.0)  # type: ignore[arg-type]
        running = running_job()
        dispatched = replace(running, phase=JobPhase.DISPATCHED, events=running.events[:-1])
        over = GangStatus(dispatched.job_id, dispatched.attempt, GangPhase.SUCCEEDED, finished_at_s=150.0)
        succeeded = dispatched.transition(JobPhase.SUCCEEDED, by=Owner.STATUS, at_s=151.0)
        await keeper.ended(dispatched, succeeded, over)
        assert keeper.started_at_s(dispatched.job_id, dispatched.attempt) == 100.0
        assert keeper.started_at_s(dispatched.job_id, dispatched.attempt) is None

    asyncio.run(scenario())
