"""The live jobs' sums that SummarizeJobs answers (GPUs and jobs per tenant, GPU type and phase group),
kept as jobs change rather than summed over every live job at each call.

SummarizeJobs (the console's queues page, `gpufed queues`) summed every live job of the cache on
the event loop: at a million queued jobs, seconds of every API call's loop at each page load. The
job cache now hands each change to this index (the job as it was, the job as it is) and the call
reads the sums of its tenant. `tests/unit/test_job_summary.py` holds them to that walk over every
live job (kept there as the reference) over random changes.

Built on first use from the live jobs (and again after the cache lists afresh), so a server that is
never asked pays nothing, and a restart's list stays as lazy as it is (`Stored.decoded_on_read`).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from federation.store.jobs import JobRecord
from placement.model import JobPhase, TenantId


class JobGroup(StrEnum):
    """Where a live job is, for the sums: waiting, on its way to a cluster, or running."""

    QUEUED = "queued"
    ADMITTED = "admitted"
    RUNNING = "running"


GROUP_OF: dict[JobPhase, JobGroup] = {
    JobPhase.QUEUED: JobGroup.QUEUED,
    JobPhase.ADMITTED: JobGroup.ADMITTED,
    JobPhase.STAGING: JobGroup.ADMITTED,
    JobPhase.DISPATCHED: JobGroup.ADMITTED,
    JobPhase.RUNNING: JobGroup.RUNNING,
}
# The type a job that names none is counted under.
ANY_GPU = "any"

# (GPU type, group) -> [GPUs, jobs], per tenant; and jobs per group, per tenant.
TypeSums = dict[tuple[str, JobGroup], list[int]]


def gpu_types_counted(job: JobRecord, group: JobGroup) -> tuple[str, ...]:
    """The GPU types a live job counts under: where it was placed once past the queue; each type it
    accepts while it waits (a queued job that accepts several is demand for each)."""
    placed = job.placement
    if placed is not None and group is not JobGroup.QUEUED:
        return (placed.gpu_type,)
    if group is JobGroup.QUEUED:
        return tuple(job.spec.gpu_types) or (ANY_GPU,)
    return tuple(job.spec.gpu_types[:1]) or (ANY_GPU,)


# Where a live job counts: its tenant, group, GPUs and the GPU types it counts under.
Counted = tuple[TenantId, JobGroup, int, tuple[str, ...]]


def _counted(job: JobRecord) -> Counted | None:
    """Where `job` counts in the sums; None when it does not (ended)."""
    group = GROUP_OF.get(job.phase)
    if group is None:
        return None
    return (job.tenant, group, job.spec.gpu_count, gpu_types_counted(job, group))


class JobSummaryIndex:
    def __init__(self) -> None:
        self._built = False
        self._by_type: dict[TenantId, TypeSums] = {}
        self._by_group: dict[TenantId, dict[JobGroup, int]] = {}

    @property
    def built(self) -> bool:
        return self._built

    def forget(self) -> None:
        """Sums to be built again at the next read (the cache listed every job afresh)."""
        self._built = False
        self._by_type = {}
        self._by_group = {}

    def build(self, live: Iterable[JobRecord]) -> None:
        self.forget()
        for job in live:
            counted = _counted(job)
            if counted is not None:
                self._add(counted, 1)
        self._built = True

    def change(self, was: JobRecord | None, now: JobRecord | None) -> None:
        """One job's change (`was` None: new; `now` None: gone). Nothing while not built."""
        if not self._built:
            return
        # Most writes leave a job where it is counted (the same group, GPUs and types: a rewrite
        # in the same phase, admitted to staging to dispatched): the sums stay, at the cost of
        # reading where it counts, not of taking it out and putting it back (issue 33).
        before = None if was is None else _counted(was)
        after = None if now is None else _counted(now)
        if before == after:
            return
        if before is not None:
            self._add(before, -1)
        if after is not None:
            self._add(after, 1)

    def _add(self, counted: Counted, sign: int) -> None:
        tenant, group, gpus, gpu_types = counted
        per_group = self._by_group.setdefault(tenant, {})
        left = per_group.get(group, 0) + sign
        if left:
            per_group[group] = left
        else:
            del per_group[group]
        by_type = self._by_type.setdefault(tenant, {})
        gpus *= sign
        for gpu_type in gpu_types:
            key = (gpu_type, group)
            sums = by_type.get(key)
            if sums is None:
                by_type[key] = [gpus, sign]
                continue
            sums[0] += gpus
            sums[1] += sign
            if not sums[1]:
                del by_type[key]
        if not per_group:
            del self._by_group[tenant]
        if not by_type:
            del self._by_type[tenant]

    def sums(
        self, tenant: TenantId | None
    ) -> tuple[list[tuple[TenantId, str, JobGroup, int, int]], list[tuple[TenantId, JobGroup, int]]]:
        """(tenant, GPU type, group, GPUs, jobs) rows and (tenant, group, jobs) counts of `tenant`
        (None: every tenant), in no order: the caller orders them as its answer needs."""
        rows = [
            (t, gpu_type, group, sums[0], sums[1])
            for t in (self._by_type if tenant is None else (tenant,))
            for (gpu_type, group), sums in self._by_type.get(t, {}).items()
        ]
        counts = [
            (t, group, n)
            for t in (self._by_group if tenant is None else (tenant,))
            for group, n in self._by_group.get(t, {}).items()
        ]
        return rows, counts
