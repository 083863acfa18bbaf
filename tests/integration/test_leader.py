"""Leader election on real etcd leases: takeover after a crash, fencing of the old leader, loss on outage.

Each election refreshes its lease as a server's does: from a lease keeper's thread, through a blocking
twin of the test's etcd client (tests/integration/test_leader_stall.py stalls the loop meanwhile)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path

import pytest
import structlog.testing

from federation.runtime.etcd_process import EtcdProcess
from federation.scheduling.leader import LeaderElection
from federation.store.job_store import LEADER_KEY, KvStore
from federation.store.jobs import JobRecord
from federation.store.kv import WatchEvent
from federation.store.kv_etcd import EtcdKv
from federation.store.kv_etcd_lease import BlockingLeaseClient
from tests.contract.helpers import eventually
from tests.etcdctl import etcdctl, lease_alive

pytestmark = pytest.mark.integration

MakeJob = Callable[..., JobRecord]


class Watches:
    """The watches started through `etcd_kv`. In these tests only a standby watches: it watches the
    leader key for a vacancy once etcd has refused it the lead, so its first watch is the signal
    that it tried and lost, and now waits."""

    def __init__(self) -> None:
        self.prefixes: list[bytes] = []

    async def until(self, count: int, timeout_s: float = 10.0) -> None:
        async def started() -> bool:
            return len(self.prefixes) >= count

        await eventually(started, timeout_s=timeout_s, what=f"{count} watches through etcd_kv")


@pytest.fixture
def watches(etcd_kv: EtcdKv, monkeypatch: pytest.MonkeyPatch) -> Watches:
    counted = Watches()
    etcd_watch = etcd_kv.watch_prefix

    def counted_watch(prefix: bytes, *, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
        counted.prefixes.append(prefix)
        return etcd_watch(prefix, start_revision=start_revision)

    monkeypatch.setattr(etcd_kv, "watch_prefix", counted_watch)
    return counted


async def test_one_leader_at_a_time_with_its_key_create_revision_as_fence(
    etcd_kv: EtcdKv, watches: Watches
) -> None:
    first = LeaderElection(
        etcd_kv, "first", ttl_s=5, refresh_kv=functools.partial(BlockingLeaseClient.twin_of, etcd_kv)
    )
    second = LeaderElection(
        etcd_kv, "second", ttl_s=5, refresh_kv=functools.partial(BlockingLeaseClient.twin_of, etcd_kv)
    )
    try:
        fence = await first.acquire()
        key = await etcd_kv.get(LEADER_KEY)
        assert key is not None
        assert (key.value, key.create_revision) == (b"first", fence.create_revision)
        assert first.is_leader
        assert first.fence == fence
        standby = asyncio.create_task(second.acquire())
        await watches.until(1)  # the second has asked for the lead and been refused
        assert watches.prefixes == [LEADER_KEY]
        assert not standby.done()
        assert not second.is_leader
        standby.cancel()
        with pytest.raises(asyncio.CancelledError):
            await standby
    finally:
        await second.close()
        await first.close()


async def test_a_standby_wins_within_a_ttl_of_the_leader_dying_and_the_old_fence_is_refused(
    etcd_kv: EtcdKv, make_job: MakeJob, watches: Watches
) -> None:
    store = KvStore(etcd_kv)
    first = LeaderElection(
        etcd_kv, "first", ttl_s=2, refresh_kv=functools.partial(BlockingLeaseClient.twin_of, etcd_kv)
    )
    second = LeaderElection(
        etcd_kv, "second", ttl_s=2, refresh_kv=functools.partial(BlockingLeaseClient.twin_of, etcd_kv)
    )
    try:
        old_fence = await first.acquire()
        standby = asyncio.create_task(second.acquire())
        await watches.until(1)  # the standby waits for a vacancy
        # What SIGKILL looks like to etcd: the keepalives stop and nobody revokes the lease (a
        # keeper's stop does not revoke).
        assert first._keeper is not None
        await first._keeper.stop()
        died = time.monotonic()
        new_fence = await asyncio.wait_for(standby, timeout=6)
        took_s = time.monotonic() - died
        assert took_s < 2 + 1.5, f"takeover took {took_s:.1f}s with a 2s TTL"
        assert new_fence.create_revision > old_fence.create_revision

        stored, _ = await store.create_job(make_job("j1"), idempotency_key="k", manifest_digest="d")
        decision = dataclasses.replace(stored.value, message="admitted by the old leader")
        assert await store.commit([(decision, stored.mod_revision)], fence=old_fence) is None
        assert await store.commit([(decision, stored.mod_revision)], fence=new_fence) is not None
    finally:
        await second.close()
        await first.close()


async def test_resign_hands_over_at_once(etcd_kv: EtcdKv, watches: Watches) -> None:
    first = LeaderElection(
        etcd_kv, "first", ttl_s=10, refresh_kv=functools.partial(BlockingLeaseClient.twin_of, etcd_kv)
    )
    second = LeaderElection(
        etcd_kv, "second", ttl_s=10, refresh_kv=functools.partial(BlockingLeaseClient.twin_of, etcd_kv)
    )
    try:
        await first.acquire()
        standby = asyncio.create_task(second.acquire())
        await watches.until(1)  # the standby waits for a vacancy: the resignation must wake it
        started = time.monotonic()
        await first.resign()
        await asyncio.wait_for(standby, timeout=10)
        second_lease = second._lease
        # At once, not at the lease's expiry (10 s): half the TTL tells the two apart on a machine
        # busy enough to hold this loop for a second or two (1.5 s did not leave that room).
        assert time.monotonic() - started < 10 / 2
        assert first.lost().is_set()
        assert second.is_leader
    finally:
        await second.close()
        await first.close()
    # Nothing left behind: no keeper's thread, no lease.
    assert [t.name for t in threading.enumerate() if t.name.startswith("gpufed-lease-")] == []
    assert not lease_alive(etcd_kv.endpoint, second_lease)


async def test_the_leader_notices_when_its_key_is_taken(etcd_kv: EtcdKv) -> None:
    election = LeaderElection(
        etcd_kv, "me", ttl_s=2, refresh_kv=functools.partial(BlockingLeaseClient.twin_of, etcd_kv)
    )
    try:
        fence = await election.acquire()
        await etcd_kv.delete(fence.key)
        await asyncio.wait_for(election.lost().wait(), timeout=3)
        assert not election.is_leader
    finally:
        await election.close()


async def test_the_leader_notices_when_its_lease_is_revoked_behind_its_back(etcd_kv: EtcdKv) -> None:
    """etcdctl revokes the lease (an operator, or etcd expiring it): the keeper's next refresh finds
    it gone ("lease expired") and the term ends."""
    election = LeaderElection(
        etcd_kv, "me", ttl_s=2, refresh_kv=functools.partial(BlockingLeaseClient.twin_of, etcd_kv)
    )
    try:
        await election.acquire()
        with structlog.testing.capture_logs() as logs:
            etcdctl(etcd_kv.endpoint, "lease", "revoke", format(election._lease, "x"))
            await asyncio.wait_for(election.lost().wait(), timeout=3)
        assert not election.is_leader
        assert [e["reason"] for e in logs if e["event"] == "leader_lost"] == ["lease expired"]
    finally:
        await election.close()


async def test_the_leader_gives_up_when_etcd_is_gone_for_a_ttl(tmp_path: Path) -> None:
    with EtcdProcess(tmp_path / "etcd") as etcd:
        kv = await EtcdKv.connect(etcd.endpoint, timeout_s=1.0)
        election = LeaderElection(
            kv, "me", ttl_s=2, refresh_kv=functools.partial(BlockingLeaseClient.twin_of, kv)
        )
        try:
            await election.acquire()
            etcd.kill()
            started = time.monotonic()
            await asyncio.wait_for(election.lost().wait(), timeout=5)
            assert 1.0 < time.monotonic() - started < 3.5
            assert not election.is_leader
            assert election.fence is None
        finally:
            await election.close()
            await kv.close()


async def test_an_unexpected_keepalive_error_ends_the_leadership_instead_of_hiding(
    etcd_kv: EtcdKv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any failure of the lease refresh other than etcd being away still ends the leadership: a
    keepalive task that died quietly would leave this server believing it leads with no lease."""
    election = LeaderElection(
        etcd_kv, "me", ttl_s=2, refresh_kv=functools.partial(BlockingLeaseClient.twin_of, etcd_kv)
    )
    try:
        await election.acquire()

        async def broken(self: BlockingLeaseClient, lease_id: int) -> int:
            raise RuntimeError("a bug, or an error etcd never sent before")

        # On the class: the keeper's thread refreshes through a blocking twin of etcd_kv.
        monkeypatch.setattr(BlockingLeaseClient, "keepalive", broken)
        await asyncio.wait_for(election.lost().wait(), timeout=3)
        assert not election.is_leader
    finally:
        monkeypatch.undo()
        await election.close()
