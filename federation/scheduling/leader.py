"""One scheduler at a time: leader election on an etcd lease, with a fencing token for its writes.

The leader holds a key attached to a lease it keeps alive. If the process dies, the lease expires after
its TTL and the key goes with it, so a standby takes over within about one TTL. A leader that cannot
refresh its lease for a whole TTL (etcd unreachable, or the loop stalled) must assume that someone else
leads: it sets `lost()` and stops. Because it may notice late, every write it makes carries the `Fence`
(the key's create revision); etcd refuses the write once the key is gone or re-created by a successor.

The lease's length is the trade between two failures. After a leader dies, nobody schedules until its
key expires: the TTL left at the kill (between two thirds of the TTL and all of it, as the lease is
refreshed every third), up to half a second more until etcd's lessor notices (it looks every 500 ms),
then the standby's acquire (its watch sees the key go) and first scheduling cycle. A leader whose
refreshes stop for the TTL less a third (its event loop stalled, or etcd unreachable) loses its term:
fencing keeps that safe, and it only costs a takeover. Kubernetes' controllers take 15 s leases, and so
fail over in 15 to 17 s; issue 33 asks for 5 s. The default is 3 s: a takeover within 3.5 s of the kill
plus the first cycle (bench/scale_failover.py: 0.1 s at 10,000 live jobs), while a leader survives
stalls of up to 2 s. etcd raises a lease below its minimum (1.5 election timeouts: 2 s with etcd's
default 1 s election timeout) to that minimum, so an etcd tuned for slow links may lengthen it.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from federation.errors import StoreUnavailable
from federation.store.job_store import LEADER_KEY, Fence
from federation.store.kv import Compare, Get, KeyValueStore, LeaseNotFound, Put, WatchCompacted

log = structlog.get_logger(__name__)

_RETRY_START_S = 0.1
_RETRY_MAX_S = 2.0
# `gpufed serve --lease-ttl-s` unless given (see the module's docstring for why 3).
DEFAULT_LEASE_TTL_S = 3


class LeaderElection:
    def __init__(
        self, kv: KeyValueStore, identity: str, *, ttl_s: int = DEFAULT_LEASE_TTL_S, key: bytes = LEADER_KEY
    ) -> None:
        self._kv = kv
        self.identity = identity
        self._ttl_s = ttl_s
        self._key = key
        self._lease = 0
        self._fence: Fence | None = None
        self._lost = asyncio.Event()
        self._keepalive_task: asyncio.Task[None] | None = None

    @property
    def is_leader(self) -> bool:
        return self._fence is not None and not self._lost.is_set()

    @property
    def fence(self) -> Fence | None:
        return self._fence if self.is_leader else None

    def lost(self) -> asyncio.Event:
        """Set once leadership is gone (lease not refreshed for a TTL, key taken, or resigned)."""
        return self._lost

    async def acquire(self) -> Fence:
        """Block until this process leads; returns its fencing token. Retries through etcd outages."""
        if self.is_leader and self._fence is not None:
            return self._fence
        retry_s = _RETRY_START_S
        while True:
            try:
                fence = await self._try_acquire()
                if fence is not None:
                    return fence
                retry_s = _RETRY_START_S
                await self._wait_for_vacancy()
            except (StoreUnavailable, LeaseNotFound) as e:
                log.warning("leader_acquire_failed", identity=self.identity, error=str(e), retry_s=retry_s)
                await asyncio.sleep(retry_s)
                retry_s = min(retry_s * 2, _RETRY_MAX_S)

    async def _try_acquire(self) -> Fence | None:
        lease = await self._kv.grant_lease(self._ttl_s)
        try:
            result = await self._kv.txn(
                [Compare.absent(self._key)],
                [Put(self._key, self.identity.encode(), lease=lease)],
                [Get(self._key)],
            )
        except BaseException:
            with contextlib.suppress(StoreUnavailable):
                await self._kv.revoke_lease(lease)
            raise
        if not result.succeeded:
            await self._kv.revoke_lease(lease)
            holder = result.gets[0]
            log.debug(
                "leader_held_elsewhere", identity=self.identity, holder=holder and holder.value.decode()
            )
            return None
        self._lease = lease
        self._fence = Fence(self._key, result.revision)
        self._lost = asyncio.Event()
        self._keepalive_task = asyncio.create_task(
            self._keepalive(), name=f"leader-keepalive-{self.identity}"
        )
        log.info("leader_acquired", identity=self.identity, create_revision=result.revision)
        return self._fence

    async def _wait_for_vacancy(self) -> None:
        """Until the leader key changes, or a while has passed (the in-memory kv expires leases on access).

        The watch starts after the revision of the read, not after the key's own mod revision: the key
        is written once per leadership, so its revision is soon compacted, and etcd refuses a watch
        from a compacted revision. A compaction between the read and the watch just means try again.
        """
        read = await self._kv.range_prefix(self._key, limit=1)
        if not any(kv.key == self._key for kv in read.kvs):
            return
        watch = self._kv.watch_prefix(self._key, start_revision=read.revision + 1)
        with contextlib.suppress(TimeoutError, WatchCompacted):
            async with asyncio.timeout(max(self._ttl_s / 3, 0.1)), contextlib.aclosing(watch):
                async for ev in watch:
                    if ev.kv.key == self._key:
                        return

    async def _keepalive(self) -> None:
        try:
            why = await self._refresh_until_lost()
        except Exception as error:
            # A task that dies leaves `lost` unset: this server would go on believing it leads while
            # nobody refreshes the lease. Giving up leadership is safe (every commit is fenced) and
            # the server's loop acquires again.
            why = f"keepalive failed: {error!r}"
            log.exception("leader_keepalive_crashed", identity=self.identity)
        log.warning("leader_lost", identity=self.identity, reason=why)
        self._lost.set()
        # Give the lease back if etcd is there to take it, so that a standby (or our own next acquire)
        # need not wait for it to run out.
        with contextlib.suppress(StoreUnavailable):
            await self._kv.revoke_lease(self._lease)

    async def _refresh_until_lost(self) -> str:
        loop = asyncio.get_running_loop()
        fence = self._fence
        assert fence is not None
        interval_s = self._ttl_s / 3
        # When the last refresh that etcd answered was sent: the lease lives at least ttl_s from then.
        last_ok = loop.time()
        delay_s = interval_s
        while True:
            await asyncio.sleep(delay_s)
            sent = loop.time()
            try:
                ttl_left = await self._kv.keepalive(self._lease)
                holder = await self._kv.get(self._key)
            except StoreUnavailable as e:
                if loop.time() - last_ok >= self._ttl_s:
                    return "lease not refreshed for a whole TTL"
                log.warning("leader_keepalive_failed", identity=self.identity, error=str(e))
                # Retry sooner than usual: a refresh must land before the TTL runs out.
                delay_s = min(interval_s, 0.25, max(last_ok + self._ttl_s - loop.time(), 0.0))
                continue
            if ttl_left <= 0:
                return "lease expired"
            if holder is None or holder.create_revision != fence.create_revision:
                return "leader key no longer ours"
            # The next refresh a third of the TTL after this one was sent, not after its answers
            # came: with etcd slow to answer (the soak, at a load of 30 on two cores) the two calls
            # took a second, each period grew by that, and 3 s leases ran out.
            last_ok, delay_s = sent, max(0.0, sent + interval_s - loop.time())

    async def resign(self) -> None:
        """Stop leading and free the key at once (revoking the lease deletes it) for a standby."""
        task, self._keepalive_task = self._keepalive_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        lease, self._lease = self._lease, 0
        was_leader = self._fence is not None
        self._fence = None
        self._lost.set()
        if lease:
            with contextlib.suppress(StoreUnavailable):
                await self._kv.revoke_lease(lease)
        if was_leader:
            log.info("leader_resigned", identity=self.identity)

    async def close(self) -> None:
        await self.resign()
