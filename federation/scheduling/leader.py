"""One scheduler at a time: leader election on an etcd lease, with a fencing token for its writes.

The leader holds a key attached to a lease it keeps alive. If the process dies, the lease expires after
its TTL and the key goes with it, so a standby takes over within about one TTL. A leader that cannot
refresh its lease for a whole TTL (etcd unreachable), whose key is gone, or whose event loop has
stalled past the stall limit, must assume that someone else leads: it sets `lost()` and stops.
Because it may notice late, every write it makes carries the `Fence` (the key's create revision);
etcd refuses the write once the key is gone or re-created by a successor.

The lease's length is the trade between two failures. After a leader dies, nobody schedules until its
key expires: the TTL left at the kill (between two thirds of the TTL and all of it, as the lease is
refreshed every third), up to half a second more until etcd's lessor notices (it looks every 500 ms),
then the standby's acquire (its watch sees the key go) and first scheduling cycle. A leader whose
refreshes stop for the TTL less a third (etcd unreachable) loses its term: fencing keeps that safe,
and it only costs a takeover. Kubernetes' controllers take 15 s leases, and so fail over in 15 to
17 s; issue 33 asks for 5 s. The default is 3 s: a takeover within 3.5 s of the kill plus the first
cycle (bench/scale_failover.py: 0.1 s at 10,000 live jobs). Refreshed from the server's event loop, a
3 s lease outlived stalls of that loop of up to 2 s only; refreshed from the keeper's thread, it
outlives them up to the stall limit (10 s). etcd raises a lease below its minimum (1.5 election
timeouts: 2 s with etcd's default 1 s election timeout) to that minimum, so an etcd tuned for slow
links may lengthen it.

Who refreshes. Given `refresh_kv` (the server gives a blocking twin of its etcd client,
`federation.store.kv_etcd_lease.BlockingLeaseClient`), a
`LeaseKeeper` refreshes from a thread of its own, so the lease outlives stalls of the event loop up to
the stall limit (`federation.scheduling.lease_keeper` says why and how long). Without it, a task on
the event loop refreshes through `kv`, and a stall of two thirds of the TTL loses the lease: so it is
for the in-memory kv of the unit tests, whose leases live in the loop's own objects (not safe to
touch from another thread) and expire only when something on that loop calls it: a stall of the loop
stalls every election on it, the standby's too, so it costs nothing that a thread could save.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from federation.errors import StoreUnavailable
from federation.scheduling.lease_keeper import LeaseClient, LeaseKeeper, refresh_until_lost, stall_limit_for
from federation.store.job_store import LEADER_KEY, Fence
from federation.store.kv import Compare, Get, KeyValueStore, LeaseNotFound, Put, WatchCompacted

log = structlog.get_logger(__name__)

_RETRY_START_S = 0.1
_RETRY_MAX_S = 2.0
# `gpufed serve --lease-ttl-s` unless given (see the module's docstring for why 3).
DEFAULT_LEASE_TTL_S = 3


class LeaderElection:
    def __init__(
        self,
        kv: KeyValueStore,
        identity: str,
        *,
        ttl_s: int = DEFAULT_LEASE_TTL_S,
        key: bytes = LEADER_KEY,
        refresh_kv: Callable[[], LeaseClient] | None = None,
        stall_limit_s: float | None = None,
    ) -> None:
        """`refresh_kv`: makes the client a `LeaseKeeper` thread refreshes the lease through (called
        in that thread, once a term); None: a task on the event loop refreshes it through `kv`.
        `stall_limit_s`: how long the event loop may run no heartbeat before the keeper gives the
        lease up (None: `DEFAULT_STALL_LIMIT_S`, or the TTL if longer). At least the TTL: a shorter
        limit would give a lease up on stalls that the lease outlives by itself."""
        stall_limit_s = stall_limit_for(stall_limit_s, ttl_s)
        self._kv = kv
        self.identity = identity
        self._ttl_s = ttl_s
        self._key = key
        self._refresh_kv = refresh_kv
        self._stall_limit_s = stall_limit_s
        self._lease = 0
        self._fence: Fence | None = None
        self._lost = asyncio.Event()
        # Who refreshes this term's lease: a task on the loop (`_keepalive_task`) or a thread.
        self._keepalive_task: asyncio.Task[None] | None = None
        self._keeper: LeaseKeeper | None = None

    @property
    def is_leader(self) -> bool:
        # The keeper's own word first: it may have given the lease up while the loop was stalled,
        # before the loop has run the `lost` it was sent.
        keeper_gave_up = self._keeper is not None and self._keeper.gave_up
        return self._fence is not None and not self._lost.is_set() and not keeper_gave_up

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
        # The last term's refresher, if it has not ended yet (a keeper still revoking a lost lease).
        await self._stop_refreshing()
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
        if self._refresh_kv is None:
            self._keepalive_task = asyncio.create_task(
                self._keepalive(), name=f"leader-keepalive-{self.identity}"
            )
        else:
            lost = self._lost
            self._keeper = LeaseKeeper(
                make_kv=self._refresh_kv,
                lease=lease,
                fence=self._fence,
                ttl_s=self._ttl_s,
                stall_limit_s=self._stall_limit_s,
                identity=self.identity,
                on_lost=lambda why: self._term_lost(lost, why),
            )
            self._keeper.start()
        log.info(
            "leader_acquired",
            identity=self.identity,
            create_revision=result.revision,
            refreshed_from="thread" if self._keeper is not None else "event loop",
        )
        return self._fence

    def _term_lost(self, lost: asyncio.Event, why: str) -> None:
        """On the loop, from the keeper's thread: the term whose `lost` event this is has ended."""
        if not lost.is_set():
            log.warning("leader_lost", identity=self.identity, reason=why)
            lost.set()

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
        """The loop's own refresher (no `refresh_kv`): refresh until lost, then say so and revoke."""
        fence = self._fence
        assert fence is not None
        try:
            why = await refresh_until_lost(self._kv, self._lease, fence, self._ttl_s, identity=self.identity)
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

    async def _stop_refreshing(self) -> None:
        """End this term's refresher, task or thread, without revoking; waits until it has ended.

        One whose term is lost is not cancelled but waited for: it is giving the lease back."""
        task, self._keepalive_task = self._keepalive_task, None
        if task is not None:
            if not self._lost.is_set():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            await keeper.stop()

    async def resign(self) -> None:
        """Stop leading and free the key at once (revoking the lease deletes it) for a standby. No
        refresher, task or thread, is left once it returns."""
        # A refresher that lost the lease has revoked it already (or etcd was away, and it runs out
        # by itself): not a second time, which with etcd away would cost a second deadline.
        given_back = self._lost.is_set() or (self._keeper is not None and self._keeper.gave_up)
        await self._stop_refreshing()
        lease, self._lease = self._lease, 0
        was_leader = self._fence is not None
        self._fence = None
        self._lost.set()
        if lease and not given_back:
            with contextlib.suppress(StoreUnavailable):
                await self._kv.revoke_lease(lease)
        if was_leader:
            log.info("leader_resigned", identity=self.identity)

    async def close(self) -> None:
        await self.resign()
