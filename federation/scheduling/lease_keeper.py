"""The leader's lease, refreshed from a thread of its own while the server's event loop is alive.

Refreshed by a task on the server's event loop, a 3 s lease outlived stalls of that loop of up to
about 2 s only. A big scheduling cycle, a burst of thousands of admissions, or a machine at a load of
30 held the loop longer, and leaders that nobody had killed lost their leases (docs/architecture.md,
"Failover"): each loss cost a takeover, a cold cache and a first cycle.

`LeaseKeeper` refreshes from a thread with an event loop and an etcd client of its own
(`BlockingLeaseClient`: the same members, TLS and certificates as the server's client, over gRPC's
blocking API, since an asyncio client in the thread was woken for every gRPC call of the server:
`federation.store.kv_etcd_lease` says why), so a stalled server loop no longer stops the refreshes.
A thread runs Python only while it holds the GIL: it refreshes through a loop that is busy in Python
(CPython hands the GIL over every 5 ms) or blocked in a call that lets the GIL go (a sleep, I/O,
most C extensions), not through one C call that holds the GIL for seconds (a full garbage
collection of millions of objects, which `federation.runtime.heap` and `paused_gc` are there to
prevent).

A loop that is wedged, not just slow, must not lead for ever. At every refresh the thread posts a
heartbeat onto the server's loop, and it refreshes only while the loop has run one within the stall
limit (`gpufed serve --lease-stall-limit-s`, 10 s by default). Past it the thread stops refreshing,
sets `lost` (which the loop sees when it runs again) and revokes the lease, so that a standby takes
over at once rather than a TTL later.

Kubernetes' leader election (client-go's `leaderelection`) also renews from a goroutine of its own,
independent of the controller's work: every `RetryPeriod` (2 s), giving up leadership when no renewal
has succeeded for `RenewDeadline` (10 s), shorter than the `LeaseDuration` (15 s) candidates wait.
Here etcd enforces the lease's TTL itself, and every leader write is fenced by the key's create
revision (`federation.store.job_store.Fence`), so the keeper may retry for the whole TTL. What a
thread in a Python server needs besides is the stall limit: 10 s, client-go's `RenewDeadline`, so
that a leader whose work has stopped keeps the lead no longer than a Kubernetes leader that cannot
renew does. It is five times the 2 s stall that a 3 s lease refreshed on the loop outlived (the
soak's stalls at a load of 30 were longer), and it bounds the failover after a wedge: with the
default lease the key goes 10 s to 11 s into the stall (the limit, then at most one refresh period).

Safety never rests on this thread: a deposed leader's writes fail on the fence whatever the keeper
believes. The thread only decides how long leadership lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Protocol

import structlog

from federation.errors import GpufedError, InvalidSpec, StoreUnavailable
from federation.store.job_store import Fence
from federation.store.kv import KeyValue

log = structlog.get_logger(__name__)

# `gpufed serve --lease-stall-limit-s` unless given: see the module's docstring for why 10.
DEFAULT_STALL_LIMIT_S = 10.0


class LeaseClient(Protocol):
    """What refreshing a lease asks of the store: the server's own client (`KeyValueStore`), or the
    keeper thread's (`federation.store.kv_etcd_lease.BlockingLeaseClient`)."""

    async def keepalive(self, lease_id: int) -> int: ...

    async def get(self, key: bytes) -> KeyValue | None: ...

    async def revoke_lease(self, lease_id: int) -> None: ...

    async def close(self) -> None: ...


def stall_limit_for(stall_limit_s: float | None, ttl_s: int) -> float:
    """The stall limit a term runs with: `DEFAULT_STALL_LIMIT_S`, or the TTL if longer, unless given;
    a given one must be at least the TTL (a shorter limit would give a lease up on stalls that the
    lease outlives by itself). Raises InvalidSpec naming both."""
    if stall_limit_s is None:
        return max(DEFAULT_STALL_LIMIT_S, float(ttl_s))
    if stall_limit_s < ttl_s:
        raise InvalidSpec(
            "lease stall limit",
            f"{stall_limit_s:g} s is shorter than the lease's TTL ({ttl_s} s): give at least the TTL",
        )
    return stall_limit_s


def keeper_timeout_s(ttl_s: int, timeout_s: float, *, members: int) -> float:
    """The deadline for each etcd member's answer to the keeper's calls.

    The server's client waits `timeout_s` (`gpufed serve --etcd-timeout-s`, 5 s by default) for a
    member before it tries the next. A member that hangs rather than refuses (stopped, partitioned,
    its disk stuck) then holds a refresh that long, past a 3 s lease, though other members would have
    answered at once. With several members the keeper waits at most a third of the TTL (its refresh
    period) for each: a refresh caught by a hung member moves on in time for the next member's answer
    to land two thirds of a TTL after the last one, a third before the lease would run out.
    With one member there is nowhere to move on to, and a shorter deadline would only cut off a slow
    answer that still lands in time (at a load of 30 a refresh took a second): the client's own then.
    """
    if members < 2:
        return timeout_s
    return min(timeout_s, ttl_s / 3)


# How long `stop` waits for the thread: a stop cancels its refresh at once, but a thread that has lost
# the lease first revokes it, which takes at most the client's deadline on each member.
_STOP_WAIT_S = 15.0


async def refresh_until_lost(
    kv: LeaseClient,
    lease: int,
    fence: Fence,
    ttl_s: int,
    *,
    identity: str,
    before_refresh: Callable[[], str | None] = lambda: None,
    on_refreshed: Callable[[], None] = lambda: None,
) -> str:
    """Refresh `lease` every third of its TTL and check that the key is still ours, until it is not;
    returns why. On whichever event loop runs it (the server's, or the keeper's thread's).

    `before_refresh` may give a reason to stop before each refresh (the keeper's stall limit).
    """
    loop = asyncio.get_running_loop()
    interval_s = ttl_s / 3
    # When the last refresh that etcd answered was sent: the lease lives at least ttl_s from then.
    last_ok = loop.time()
    delay_s = interval_s
    while True:
        await asyncio.sleep(delay_s)
        why = before_refresh()
        if why is not None:
            return why
        sent = loop.time()
        try:
            ttl_left = await kv.keepalive(lease)
            holder = await kv.get(fence.key)
        except StoreUnavailable as e:
            if loop.time() - last_ok >= ttl_s:
                return "lease not refreshed for a whole TTL"
            log.warning("leader_keepalive_failed", identity=identity, error=str(e))
            # Retry sooner than usual: a refresh must land before the TTL runs out.
            delay_s = min(interval_s, 0.25, max(last_ok + ttl_s - loop.time(), 0.0))
            continue
        if ttl_left <= 0:
            return "lease expired"
        if holder is None or holder.create_revision != fence.create_revision:
            return "leader key no longer ours"
        on_refreshed()
        if sent - last_ok > 2 * interval_s:
            # Refreshed late (the loop or the thread starved, or etcd slow): how close it came.
            log.warning(
                "leader_lease_refreshed_late",
                identity=identity,
                since_last_s=round(sent - last_ok, 2),
                lease_ttl_s=ttl_s,
            )
        # The next refresh a third of the TTL after this one was sent, not after its answers came:
        # with etcd slow to answer (the soak, at a load of 30 on two cores) the two calls took a
        # second, each period grew by that, and 3 s leases ran out.
        last_ok, delay_s = sent, max(0.0, sent + interval_s - loop.time())


class LeaseKeeper:
    """Refreshes one term's lease from a thread of its own; one keeper a term.

    Made and started on the server's event loop, which it watches: `on_lost(reason)` is called there
    (thread-safely) once the lease is gone or given up. `stop` ends the thread without revoking (the
    caller revokes, as a resignation does), so a stop alone looks to etcd like a process that died.
    """

    def __init__(
        self,
        *,
        make_kv: Callable[[], LeaseClient],
        lease: int,
        fence: Fence,
        ttl_s: int,
        stall_limit_s: float,
        identity: str,
        on_lost: Callable[[str], None],
    ) -> None:
        self._make_kv = make_kv
        self._lease = lease
        self._fence = fence
        self._ttl_s = ttl_s
        self._stall_limit_s = stall_limit_s
        self._identity = identity
        self._on_lost = on_lost
        self._server_loop: asyncio.AbstractEventLoop | None = None
        # When the server's loop last ran a heartbeat this thread posted (time.monotonic: both
        # threads read the same clock). A float written by one thread and read by the other.
        self._loop_seen_at = time.monotonic()
        # When the last stall was logged (on the server's loop): heartbeats posted before belong to it.
        self._stall_said_at = float("-inf")
        # Refreshes etcd answered in this term (read by tests and the log: it only ever grows).
        self.refreshes = 0
        # Set by the thread once it has stopped refreshing for a reason of its own: read by
        # `LeaderElection.is_leader` at once, before the loop has run the `on_lost` it was sent.
        self.gave_up = False
        self._lock = threading.Lock()
        self._stopping = False
        self._refresh_task: asyncio.Task[str] | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None
        self._ended: asyncio.Future[None] | None = None
        self._thread = threading.Thread(target=self._run_thread, name=f"gpufed-lease-{identity}", daemon=True)

    def start(self) -> None:
        """On the server's event loop: the loop whose heartbeats the thread waits for."""
        self._server_loop = asyncio.get_running_loop()
        self._ended = self._server_loop.create_future()
        self._loop_seen_at = time.monotonic()
        self._thread.start()

    async def stop(self) -> None:
        """End the refreshes and wait (bounded) for the thread to end. Does not revoke the lease."""
        with self._lock:
            self._stopping = True
            task, loop = self._refresh_task, self._thread_loop
        if task is not None and loop is not None:
            # The thread's loop may have ended already, after a loss: nothing left to cancel then.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)
        ended = self._ended
        if ended is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(ended), timeout=_STOP_WAIT_S)
        except TimeoutError:
            # A daemon thread: it cannot hold the process's exit, and the fence makes anything it
            # still does harmless. Say so rather than hang a server's stop.
            log.error("lease_keeper_stuck", identity=self._identity, waited_s=_STOP_WAIT_S)
            return
        # It has posted its end: what is left of it is returning from its last frame.
        await asyncio.to_thread(self._thread.join, _STOP_WAIT_S)

    def _run_thread(self) -> None:
        try:
            asyncio.run(self._keep())
        except BaseException:
            # Never expected (`_keep` catches what the refresh raises): a keeper that died must not
            # leave the server believing in a lease that nobody refreshes.
            log.exception("lease_keeper_crashed", identity=self._identity)
            self.gave_up = True
            self._post(self._on_lost, "the lease keeper's thread crashed")
        finally:
            self._post(self._set_ended)

    async def _keep(self) -> None:
        kv = self._make_kv()
        try:
            refresh = asyncio.create_task(
                refresh_until_lost(
                    kv,
                    self._lease,
                    self._fence,
                    self._ttl_s,
                    identity=self._identity,
                    before_refresh=self._loop_stalled,
                    on_refreshed=self._refreshed,
                )
            )
            with self._lock:
                self._refresh_task, self._thread_loop = refresh, asyncio.get_running_loop()
                if self._stopping:
                    refresh.cancel()
            try:
                why = await refresh
            except asyncio.CancelledError:
                return  # stopped: the caller revokes, or means to look like a process that died
            except Exception as error:
                # A refresh that died leaves nobody refreshing while the server believes it leads.
                # Giving up leadership is safe (every commit is fenced) and the server acquires again.
                why = f"keepalive failed: {error!r}"
                log.exception("leader_keepalive_crashed", identity=self._identity)
            self.gave_up = True
            # Said from here, at once: a wedged loop would say `leader_lost` only once it runs again.
            log.warning("leader_lease_given_up", identity=self._identity, reason=why)
            # Told first, revoked after: with etcd away the revoke takes the client's whole deadline,
            # and the server must stop leading at once.
            self._post(self._on_lost, why)
            # Give the lease back if etcd is there to take it, so that a standby (or our own next
            # acquire) need not wait for it to run out.
            with contextlib.suppress(GpufedError):
                await kv.revoke_lease(self._lease)
        finally:
            with contextlib.suppress(GpufedError):
                await kv.close()

    def _loop_stalled(self) -> str | None:
        """In the thread, before each refresh: a reason to stop if the server's loop has run no
        heartbeat within the stall limit; else posts the next heartbeat."""
        stalled_s = time.monotonic() - self._loop_seen_at
        if stalled_s > self._stall_limit_s:
            return (
                f"the event loop ran no heartbeat for {stalled_s:.1f} s "
                f"(stall limit {self._stall_limit_s:g} s): giving the lease up"
            )
        if not self._post(self._heartbeat, time.monotonic()):
            return "the server's event loop is closed"
        return None

    def _heartbeat(self, posted_at: float) -> None:  # on the server's loop
        now = self._loop_seen_at = time.monotonic()
        late_s = now - posted_at
        # Once a stall: the heartbeats posted during it run together after it, the earliest first.
        if late_s > self._ttl_s * 2 / 3 and posted_at >= self._stall_said_at:
            self._stall_said_at = now
            # A stall that a lease refreshed on the loop would not have outlived: said, so that an
            # operator sees how close the loop comes to the stall limit.
            log.warning(
                "leader_loop_stalled",
                identity=self._identity,
                late_s=round(late_s, 2),
                lease_ttl_s=self._ttl_s,
                stall_limit_s=self._stall_limit_s,
            )

    def _refreshed(self) -> None:  # in the thread
        self.refreshes += 1

    def _set_ended(self) -> None:  # on the server's loop
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(None)

    def _post(self, callback: Callable[..., None], *args: object) -> bool:
        """Run `callback(*args)` on the server's loop, from the thread; False if that loop is closed."""
        loop = self._server_loop
        if loop is None:
            return False
        try:
            loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the server is gone
            return False
        return True
