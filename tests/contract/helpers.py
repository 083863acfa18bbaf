"""Small builders and waits shared by the backend contract suite and the Kubernetes tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from clusters.api import ClusterBackend, GangStatus, GangWorkload, ReplicaSpec
from placement.model import CapacityKind, ClusterState, GpuType, JobId, TenantId

T = TypeVar("T")


def a_gang(
    job_id: str,
    *,
    gpu: str = "H100",
    kind: CapacityKind = CapacityKind.ON_DEMAND,
    replicas: int = 2,
    gpus: int = 4,
    duration_s: float | None = 0.5,
    exit_code: int = 0,
    attempt: int = 1,
    tenant: str = "team-a",
    max_runtime_s: int = 3600,
    tasks: tuple[str, ...] = ("worker",),
) -> GangWorkload:
    """A gang of `replicas` pods per task, each asking `gpus` GPUs."""
    return GangWorkload(
        job_id=JobId(job_id),
        attempt=attempt,
        tenant=TenantId(tenant),
        gpu_type=GpuType(gpu),
        kind=kind,
        priority_class="default",
        replicas=tuple(
            ReplicaSpec(
                task=task,
                index=i,
                gpu_count=gpus,
                image="ghcr.io/example/train:1",
                command=("python", "train.py"),
                env=(("EPOCHS", "1"),),
            )
            for task in tasks
            for i in range(replicas)
        ),
        min_available=replicas * len(tasks),
        max_runtime_s=max_runtime_s,
        sim_duration_s=duration_s,
        sim_exit_code=exit_code,
    )


async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout_s: float = 15.0,
    interval_s: float = 0.05,
    what: str = "",
) -> T:
    """Poll `probe` until it gives something other than None (or False); fail after the timeout."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while True:
        last = await probe()
        if last is not None and last is not False:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or probe}")
        await asyncio.sleep(interval_s)


async def status_of(backend: ClusterBackend, gang: GangWorkload) -> GangStatus | None:
    for status in await backend.statuses():
        if (status.job_id, status.attempt) == (gang.job_id, gang.attempt):
            return status
    return None


async def wait_phase(
    backend: ClusterBackend, gang: GangWorkload, *phases: object, timeout_s: float = 20.0
) -> GangStatus:
    async def probe() -> GangStatus | None:
        status = await status_of(backend, gang)
        return status if status is not None and status.phase in phases else None

    return await eventually(probe, timeout_s=timeout_s, what=f"{gang.name} in {phases}")


def free_gpus(state: ClusterState, gpu: GpuType, kind: CapacityKind) -> int:
    return sum(p.free_gpus for p in state.pools if p.gpu_type == gpu and p.kind == kind)


def total_gpus(state: ClusterState, gpu: GpuType, kind: CapacityKind) -> int:
    return sum(p.total_gpus for p in state.pools if p.gpu_type == gpu and p.kind == kind)
