"""The lease keeper's thread wakes for its own calls, not for every gRPC call of the server.

gRPC's asyncio API polls one completion queue a process and wakes every event loop that has made a
call; an asyncio etcd client in the keeper's thread made that thread take (and hand on) the server's
completions, 1,000 to 2,600 wake-ups a second in a lifecycle run. The keeper's client is a blocking
one (`federation.store.kv_etcd_lease`): its thread is counted here by the kernel's own count of its
context switches while the server's loop makes thousands of etcd calls, and it must stay near the
handful its own refreshes cost.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from pathlib import Path

from federation.scheduling.leader import LeaderElection
from federation.store.kv_etcd import EtcdKv
from federation.store.kv_etcd_lease import BlockingLeaseClient
from tests.lease_judge import keeper_threads
from tests.waits import until

TTL_S = 3
PUTS = 4_000
IN_FLIGHT = 16
# A refresh (a keepalive's stream, a read of the leader key, the loop's sleep) costs the blocking
# client's thread about 14 switches (bench/lease_keeper.py: 14 a second, one refresh a second).
SWITCHES_PER_REFRESH = 50


def _switches(thread: threading.Thread) -> int:
    """The thread's voluntary and involuntary context switches, as the kernel counts them."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return sum(
        int(line.split()[1])
        for line in status.splitlines()
        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
    )


async def test_the_keeper_s_thread_sleeps_through_the_server_s_calls(etcd_kv: EtcdKv) -> None:
    election = LeaderElection(
        etcd_kv, "leader", ttl_s=TTL_S, refresh_kv=functools.partial(BlockingLeaseClient.twin_of, etcd_kv)
    )
    try:
        assert await election.acquire()
        # After its first refresh: an asyncio client's loop is woken only once it has made a call.
        keeper = election._keeper
        assert keeper is not None
        await until(lambda: keeper.refreshes >= 1, "the keeper refreshed the lease once")
        [thread] = keeper_threads()
        before, refreshed = _switches(thread), keeper.refreshes
        for start in range(0, PUTS, IN_FLIGHT):
            await asyncio.gather(
                *(etcd_kv.put(f"/quiet/{i}".encode(), b"v") for i in range(start, start + IN_FLIGHT))
            )
        switched, refreshes = _switches(thread) - before, keeper.refreshes - refreshed
        assert election.is_leader
        # An asyncio client in the thread switched about once for every batch of completions: a few
        # hundred to thousands here, in the second or so the puts take. The blocking client's thread
        # switches only for its own refreshes (one a second, however long the puts take on a busy
        # machine): counted per refresh made meanwhile, and the one under way at the end.
        batches = PUTS // IN_FLIGHT
        assert switched < SWITCHES_PER_REFRESH * (refreshes + 1), (
            f"the keeper's thread switched {switched} times over {batches} batches and {refreshes} refreshes"
        )
    finally:
        await election.close()
