"""Queue limits: how many jobs may wait in the queue at once, per tenant and for the federation.

Every live job costs each server its record in the job cache and the placer's request (about 3.5 KiB
a job; docs/architecture.md, "Memory per live job"), and every queued job is read by each cycle. A
burst without a bound (a runaway script, a sweep submitted as single jobs in a loop) would grow a
server past its memory limit; restarted, it would list the same jobs again and be killed again. So a
submission that would take the queue past a limit is refused with RESOURCE_EXHAUSTED, and nothing
is stored:

* a tenant's `maxQueuedJobs` bounds its own queue, so one team's burst cannot use the whole
  federation's room and have every other team refused; a tenant whose document sets none has the
  federation's `policy.maxQueuedJobsPerTenant` (`DEFAULT_MAX_QUEUED_JOBS_PER_TENANT`, a quarter of
  the federation's default; null lifts it);
* the federation's `policy.maxQueuedJobs` (`DEFAULT_MAX_QUEUED_JOBS` unless the config sets another;
  null lifts it) bounds all queues together.

Only jobs in the queue count (phase QUEUED): an admitted or running job holds GPUs, which bound how
many there are. A preempted job that returns to the queue was accepted before and is never refused;
a job set's held members are not jobs yet, and the set controller releases them only into the room
the limits leave (`QueueLimits.room`).

The counts are the server's job cache's (`JobCache.count_in`, no walk): several servers, or several
API processes, each check against their own view, so concurrent submissions through them can pass
a limit by what is in flight between them, and a limit lowered below the queue refuses new
submissions without touching what is queued. A refusal names only the caller's own tenant's count;
the federation's limit is named without the other tenants' count.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from federation.errors import QueueFull
from federation.store.job_cache import JobCache
from federation.store.records import SchedulingSettings, TenantRecord
from placement.model import JobPhase, TenantId


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """What a decision reads: the limits in force and the queue as this server sees it."""

    tenant: TenantId
    tenant_limit: int | None
    tenant_queued: int
    federation_limit: int | None
    federation_queued: int
    # Whether the tenant's limit is the federation's default for a tenant, its document setting none.
    tenant_limit_by_default: bool = False


def room(counts: QueueCounts) -> int | None:
    """How many more jobs may join the queue now (None: no limit applies)."""
    rooms = [
        limit - queued
        for limit, queued in (
            (counts.tenant_limit, counts.tenant_queued),
            (counts.federation_limit, counts.federation_queued),
        )
        if limit is not None
    ]
    return max(0, min(rooms)) if rooms else None


def refusal(counts: QueueCounts) -> str | None:
    """Why one more job in the queue is refused, or None if it fits."""
    if counts.tenant_limit is not None and counts.tenant_queued >= counts.tenant_limit:
        which = (
            "policy.maxQueuedJobsPerTenant, as its document sets no maxQueuedJobs"
            if counts.tenant_limit_by_default
            else "maxQueuedJobs"
        )
        return (
            f"tenant {counts.tenant} has {counts.tenant_queued} jobs queued and its limit is "
            f"{counts.tenant_limit} ({which}): submit again once some have been placed or "
            "cancelled, or ask an admin to raise the limit"
        )
    if counts.federation_limit is not None and counts.federation_queued >= counts.federation_limit:
        return (
            f"the federation's queue is full (at most {counts.federation_limit} jobs queued, "
            "policy.maxQueuedJobs): submit again once some have been placed"
        )
    return None


class QueueLimits:
    """The limits of the tenant records and settings a server reads, against its job cache."""

    def __init__(
        self,
        cache: JobCache,
        tenant: Callable[[TenantId], Awaitable[TenantRecord | None]],
        settings: Callable[[], Awaitable[SchedulingSettings]],
    ) -> None:
        self._cache = cache
        self._tenant = tenant
        self._settings = settings

    def counts(self, record: TenantRecord, settings: SchedulingSettings) -> QueueCounts:
        by_default = record.max_queued_jobs is None
        return QueueCounts(
            tenant=record.name,
            tenant_limit=settings.max_queued_jobs_per_tenant if by_default else record.max_queued_jobs,
            tenant_queued=self._cache.count_in(record.name, JobPhase.QUEUED),
            federation_limit=settings.max_queued_jobs,
            federation_queued=self._cache.count_in(None, JobPhase.QUEUED),
            tenant_limit_by_default=by_default,
        )

    def check(self, record: TenantRecord, settings: SchedulingSettings) -> None:
        """Raise QueueFull if one more of the tenant's jobs would pass a limit."""
        why = refusal(self.counts(record, settings))
        if why is not None:
            raise QueueFull(why)

    async def room(self, tenant: TenantId) -> int | None:
        """How many of the tenant's jobs may join the queue now (None: no limit); 0 for a tenant
        that no longer exists (its set's members stay held)."""
        record = await self._tenant(tenant)
        if record is None:
            return 0
        return room(self.counts(record, await self._settings()))
