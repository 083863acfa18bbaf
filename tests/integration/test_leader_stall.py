"""A leader whose event loop stalls, on a real etcd, judged by etcdctl (federation.scheduling.lease_keeper).

The stall is real: the test's own event loop, which the leader runs on, is blocked in a plain call
(etcdctl in a subprocess, and a sleep between its calls) for longer than the lease's TTL. The standby
is another server as far as the leader can tell: an election on an event loop, a thread and an etcd
client of its own, waiting for the key all the while.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator

import pytest
import structlog.testing

from federation.runtime.etcd_process import EtcdProcess
from federation.scheduling.leader import LeaderElection
from federation.store.job_store import Fence, KvStore
from federation.store.jobs import JobRecord
from federation.store.kv import WatchEvent
from federation.store.kv_etcd import EtcdKv
from federation.store.kv_etcd_lease import BlockingLeaseClient
from tests.lease_judge import block_the_loop, keeper_threads, leader_key, lease_ttl_left
from tests.waits import until

pytestmark = pytest.mark.integration

TTL_S = 2


class Standby:
    """An election on an event loop and a thread of its own: another server waiting to lead."""

    def __init__(self, endpoint: str, identity: str = "standby") -> None:
        self._endpoint = endpoint
        self._identity = identity
        # Set in the standby's thread: how often it has been refused and watched for a vacancy, and
        # when (time.monotonic, a clock both threads share) it won the key, with which fence.
        self.watches = 0
        self.won_at: float | None = None
        self.fence: Fence | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name=f"standby-{identity}")

    def __enter__(self) -> Standby:
        self._thread.start()
        assert self._ready.wait(30), "the standby's loop did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        assert self._task is not None
        with contextlib.suppress(RuntimeError):  # its loop ended already
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the standby's thread did not end"

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        kv = await EtcdKv.connect(self._endpoint)
        etcd_watch = kv.watch_prefix

        def counted_watch(prefix: bytes, *, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
            self.watches += 1
            return etcd_watch(prefix, start_revision=start_revision)

        kv.watch_prefix = counted_watch  # type: ignore[method-assign]
        election = LeaderElection(
            kv, self._identity, ttl_s=TTL_S, refresh_kv=functools.partial(BlockingLeaseClient.twin_of, kv)
        )
        self._ready.set()
        try:
            self.fence = await election.acquire()
            self.won_at = time.monotonic()
            await asyncio.Event().wait()  # leads until the test ends
        except asyncio.CancelledError:
            pass
        finally:
            await election.close()
            await kv.close()


@pytest.fixture
def endpoint(etcd_process: EtcdProcess, etcd_kv: EtcdKv) -> Iterator[str]:
    # etcd_kv: the store's prefix (the leader key with it) is empty when a test starts.
    yield etcd_process.endpoint
    assert keeper_threads() == [], "a lease keeper's thread outlived its election"


@pytest.mark.parametrize("busy", [False, True], ids=["blocked", "computing"])
async def test_a_leader_whose_loop_is_blocked_for_longer_than_its_ttl_keeps_lease_and_key(
    etcd_kv: EtcdKv, endpoint: str, busy: bool
) -> None:
    leader = LeaderElection(
        etcd_kv, "leader", ttl_s=TTL_S, refresh_kv=functools.partial(BlockingLeaseClient.twin_of, etcd_kv)
    )
    try:
        fence = await leader.acquire()
        lease = leader._lease
        with Standby(endpoint) as standby:
            await until(lambda: standby.watches >= 1, "the standby was refused the lead and waits")
            keeper = leader._keeper
            assert keeper is not None
            refreshes_before = keeper.refreshes

            with structlog.testing.capture_logs() as logs:
                seen = block_the_loop(
                    2.5 * TTL_S, lambda: (lease_ttl_left(endpoint, lease), leader_key(endpoint)), busy=busy
                )
                # Refreshed from the keeper's thread meanwhile (every third of the TTL).
                during = keeper.refreshes - refreshes_before
                # Still leader once the loop runs again (the heartbeats posted during the stall run
                # first), past the next refresh.
                await until(lambda: keeper.refreshes > refreshes_before + during, "a refresh after the stall")

            # etcd's account, all through the stall: the lease alive, the key ours, unchanged.
            assert len(seen) >= 5
            assert [ttl for ttl, _ in seen if ttl <= 0] == []
            assert {key for _, key in seen} == {("leader", fence.create_revision)}
            assert during >= 3
            # The stall is said once, with how late the loop ran the first heartbeat posted during it
            # (a third of the TTL after the stall began, on a quiet machine): longer than the TTL.
            stalls = [e for e in logs if e["event"] == "leader_loop_stalled"]
            assert len(stalls) == 1, stalls
            assert stalls[0]["late_s"] > TTL_S, stalls
            assert leader.is_leader
            assert not leader.lost().is_set()
            assert leader_key(endpoint) == ("leader", fence.create_revision)
            assert standby.won_at is None
    finally:
        await leader.close()
    # A clean stop gives the lease back: the key is gone at once, not a TTL later.
    assert lease_ttl_left(endpoint, lease) == -1
    assert leader_key(endpoint) is None


async def test_the_same_stall_costs_a_lease_refreshed_on_the_loop(etcd_kv: EtcdKv, endpoint: str) -> None:
    """The control: what the test above guards against. Refreshed by a task on the blocked loop, the
    lease runs out within the stall and the standby takes the key."""
    leader = LeaderElection(etcd_kv, "leader", ttl_s=TTL_S)  # no refresh_kv: refreshed on the loop
    try:
        fence = await leader.acquire()
        with Standby(endpoint) as standby:
            await until(lambda: standby.watches >= 1, "the standby was refused the lead and waits")
            seen = block_the_loop(
                2.5 * TTL_S,
                lambda: leader_key(endpoint),
                done=lambda key: key is not None and key[0] == "standby",
            )
            assert seen[-1] is not None, f"the lease outlived the stall: {seen}"
            assert seen[-1][0] == "standby", f"the lease outlived the stall: {seen}"
            assert standby.fence is not None
            assert standby.fence.create_revision > fence.create_revision
            await asyncio.wait_for(leader.lost().wait(), timeout=3 * TTL_S)
    finally:
        await leader.close()


async def test_a_loop_blocked_past_the_stall_limit_gives_the_lease_up_to_a_standby(
    etcd_kv: EtcdKv, endpoint: str, make_job: Callable[..., JobRecord]
) -> None:
    stall_limit_s = 2 * TTL_S
    store = KvStore(etcd_kv)
    stored, _ = await store.create_job(make_job("j1"), idempotency_key="k", manifest_digest="d")
    leader = LeaderElection(
        etcd_kv,
        "leader",
        ttl_s=TTL_S,
        refresh_kv=functools.partial(BlockingLeaseClient.twin_of, etcd_kv),
        stall_limit_s=stall_limit_s,
    )
    try:
        old_fence = await leader.acquire()
        lease = leader._lease
        with Standby(endpoint) as standby:
            await until(lambda: standby.watches >= 1, "the standby was refused the lead and waits")
            keeper = leader._keeper
            assert keeper is not None
            blocked_at = time.monotonic()
            # The last heartbeat the loop ran, up to a refresh period before the block: the stall
            # limit counts from it (no other can run until the block ends).
            last_heartbeat = keeper._loop_seen_at
            # Blocked until etcd says the standby holds the key, or for much longer than the bound.
            seen = block_the_loop(
                stall_limit_s + 3 * TTL_S,
                lambda: leader_key(endpoint),
                done=lambda key: key is not None and key[0] == "standby",
            )
            # The keeper gave up while the loop was still blocked; is_leader knows it at once.
            assert not leader.is_leader
            assert seen[-1] is not None, f"no takeover during the stall: {seen}"
            assert seen[-1][0] == "standby", f"no takeover during the stall: {seen}"
            assert standby.won_at is not None
            assert standby.fence is not None
            # Not before the limit from the last heartbeat (the keeper refreshed till then; counted
            # from the block, it could end up to a refresh period sooner); within the limit from the
            # block, a refresh period, the lease's TTL and etcd's lessor (0.5 s), even had the
            # keeper's revoke not reached etcd.
            assert standby.won_at - last_heartbeat >= stall_limit_s, standby.won_at - last_heartbeat
            took_s = standby.won_at - blocked_at
            assert took_s < stall_limit_s + TTL_S / 3 + TTL_S + 0.5 + 1.0, took_s
            assert lease_ttl_left(endpoint, lease) == -1
            await asyncio.wait_for(leader.lost().wait(), timeout=TTL_S)
            assert leader.fence is None

            # The old leader's write is refused by etcd; the new leader's is taken.
            decision = dataclasses.replace(stored.value, message="admitted by the stalled leader")
            assert await store.commit([(decision, stored.mod_revision)], fence=old_fence) is None
            assert await store.commit([(decision, stored.mod_revision)], fence=standby.fence) is not None
    finally:
        await leader.close()
