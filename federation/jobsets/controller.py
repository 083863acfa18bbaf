"""The set controller: releases held members of sets as their running members end.

Every server runs one. Each pass reads the sets that still hold members (or were cancelled and may
still have live jobs), works out from the job cache which released members have ended, and
releases as many held ones as the limit leaves room for, in one transaction that also checks the
set's revision (`JobSetStore.release`). Two controllers (two servers, or one restarted) that read
the same revision cannot both release: the second's transaction fails and it reads again. So a
crash loses no accepted member (the set record holds them all) and never lets more than the limit
run. A pass is started by a member job ending (the cache's events) or, failing that, every
`interval_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import structlog

from federation.jobsets.decide import released, to_release
from federation.jobsets.records import JobSetRecord, MemberState
from federation.jobsets.store import JobSetStore, member_job
from federation.store.job_cache import JobCache
from federation.store.job_store import JobEvent, JobStore, Stored
from federation.store.jobs import JobRecord
from placement.model import JobId, TenantId

log = structlog.get_logger("gpufed.jobsets")

Events = asyncio.Queue[JobEvent | None]

DEFAULT_INTERVAL_S = 2.0
# Compare-and-swap retries within one pass before the set waits for the next.
_ATTEMPTS = 5
# How long a release waits for the job cache to show the controller's last release before reading
# the queue's room from it; past this the set releases nothing until a later pass.
ROOM_WAIT_S = 5.0


class SetController:
    def __init__(
        self,
        *,
        sets: JobSetStore,
        store: JobStore,
        cache: JobCache,
        clock: Callable[[], float] = time.time,
        interval_s: float = DEFAULT_INTERVAL_S,
        queue_room: Callable[[TenantId], Awaitable[int | None]] | None = None,
    ) -> None:
        self._sets = sets
        # How many of a tenant's jobs may join the queue now (`federation.api.queue_limit`); None:
        # releases are bounded by the sets' own limits only.
        self._queue_room = queue_room
        self._store = store
        self._cache = cache
        self._clock = clock
        self._interval_s = interval_s
        # Cancelled sets whose every job was asked to stop, by revision: not looked at again.
        self._cancel_done: dict[tuple[str, str], int] = {}
        # The store revision of this controller's last release: the room the queue limits leave is
        # counted from the job cache, which must show the jobs released before it is read again.
        self._released_revision = 0
        self.passes = 0

    async def ended(self, record: JobSetRecord) -> set[JobId]:
        """The released members' jobs that have ended: a terminal phase in the cache or in etcd, or
        gone from etcd (only the archiver deletes a job, and only an ended one)."""
        out: set[JobId] = set()
        for member in record.members:
            if member.state is not MemberState.RELEASED:
                continue
            cached = self._cache.get(member.job_id)
            if cached is not None and cached.value.phase.is_terminal:
                out.add(member.job_id)
            elif cached is None:
                stored = await self._store.get_job(member.job_id)
                if stored is None or stored.value.phase.is_terminal:
                    out.add(member.job_id)
        return out

    async def step(self, stored: Stored[JobSetRecord]) -> Stored[JobSetRecord]:
        """Release what the set's limit allows now; retried on a lost race. The set as last read."""
        for _ in range(_ATTEMPTS):
            record = stored.value
            ended = await self.ended(record)
            room = await self._room(record.tenant)
            decision = to_release(record, ended.__contains__, room)
            if not decision.members:
                return stored
            now = self._clock()
            jobs = [member_job(record, m, now_s=now) for m in decision.members]
            after = released(record, decision.members)
            revision = await self._sets.release(stored, after, jobs)
            if revision is not None:
                log.info(
                    "job_set_members_released",
                    tenant=record.tenant,
                    job_set=record.name,
                    released=len(jobs),
                    live_before=decision.live,
                    held=decision.held_after,
                )
                stored = Stored(after, revision)
                self._released_revision = max(self._released_revision, revision)
                continue  # more may fit (a release is at most MAX_RELEASE_PER_TXN)
            fresh = await self._sets.get(record.tenant, record.name)
            if fresh is None:
                return stored
            stored = fresh
        return stored

    async def _room(self, tenant: TenantId) -> int | None:
        """What the queue limits leave for `tenant` (None: no limit), counting every job this
        controller released. The cache learns of a release from etcd's watch a moment after its
        transaction (longer on a busy server); read before, it gave the same room again, and the
        next release went past the limit. While it trails, no room."""
        if self._queue_room is None:
            return None
        if not await self._cache.wait_for_revision(self._released_revision, timeout_s=ROOM_WAIT_S):
            log.warning(
                "job_set_release_waits_for_cache",
                revision=self._released_revision,
                cache_revision=self._cache.revision,
            )
            return 0
        return await self._queue_room(tenant)

    async def cancel_jobs(self, record: JobSetRecord, reason: str, user: str) -> int:
        """Ask every live job of the set to stop (the dispatcher stops its gang); how many were asked."""
        asked = 0
        for member in record.members:
            if member.state is not MemberState.RELEASED:
                continue
            cached = self._cache.get(member.job_id)
            if cached is not None and (cached.value.phase.is_terminal or cached.value.cancel_requested):
                continue  # ended or asked already: no etcd read (a restart repeats this for every set)
            for _ in range(_ATTEMPTS):
                stored = await self._store.get_job(member.job_id)
                if stored is None or stored.value.phase.is_terminal or stored.value.cancel_requested:
                    break
                job: JobRecord = stored.value
                updated = replace(job, cancel_requested=True, message=reason)
                if await self._store.commit([(updated, stored.mod_revision)]) is not None:
                    asked += 1
                    log.info("job_cancel_requested", job_id=job.job_id, tenant=job.tenant, user=user)
                    break
        return asked

    async def pass_once(self) -> None:
        self.passes += 1
        for stored in await self._sets.list_active():
            record = stored.value
            try:
                if record.cancel_requested:
                    key = (record.tenant, record.name)
                    if self._cancel_done.get(key) != stored.mod_revision:
                        await self.cancel_jobs(record, record.cancel_reason, record.user)
                        self._cancel_done[key] = stored.mod_revision
                    continue
                await self.step(stored)
            except Exception:
                # One set's trouble (a record this build cannot read, etcd's hiccup) must not stop
                # the others' releases; the next pass tries it again.
                log.exception("job_set_pass_failed", tenant=record.tenant, job_set=record.name)

    async def run(self, stop: asyncio.Event) -> None:
        """Passes until `stop` is set: after any set member's job ends, and every `interval_s`."""
        queue = self._cache.subscribe()
        try:
            while not stop.is_set():
                try:
                    await self.pass_once()
                except Exception:
                    log.exception("job_set_controller_pass_failed")
                queue = await self._wait(queue, stop)
        finally:
            self._cache.unsubscribe(queue)

    async def _wait(self, queue: Events, stop: asyncio.Event) -> Events:
        deadline = asyncio.get_running_loop().time() + self._interval_s
        while not stop.is_set():
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return queue
            try:
                event = await asyncio.wait_for(queue.get(), timeout=left)
            except TimeoutError:
                return queue
            if event is None:
                # The cache dropped this subscriber (it fell behind): pass now, and listen again.
                self._cache.unsubscribe(queue)
                return self._cache.subscribe()
            job = event.job
            if job is not None and job.job_set and job.phase.is_terminal:
                return queue
        return queue


async def run_controller(controller: SetController, stop: asyncio.Event) -> None:
    """`controller.run` until `stop`, for a server's task list; never raises out."""
    with contextlib.suppress(asyncio.CancelledError):
        await controller.run(stop)
